"""The hf kind's keys (the row columns are local's)."""

from __future__ import annotations

from kiln.config.declare import Strings, optional, setting
from kiln.data.source_kinds.local.config import RowColumns


class Keys(RowColumns):
    QUALITY = "none"  # data filtered already

    dataset: str = setting(description="Hub id, or a builder such as json/parquet with data_files.")
    config: str | None = optional("The dataset's configuration (subset) to read.")
    split: str = setting("train", "The dataset's split to read.")
    revision: str | None = optional("A branch, tag or commit of the dataset repository.")
    data_files: Strings | None = optional("The files a builder dataset (json, parquet) reads.")
