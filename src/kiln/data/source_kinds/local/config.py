"""The local kind's keys, and the columns of a row that the hf kind reads too."""

from __future__ import annotations

from kiln.config.declare import Strings, optional, setting
from kiln.data.source_kinds import registry


class RowColumns(registry.Keys):
    """Where a row's text, path and repository are: local's row files, hf's rows."""

    text_column: str = setting(
        "text",
        """Row files: the column holding each document's text. hf: checked against the dataset's features
        when it opens; an error lists the columns.""",
    )
    path_column: str | None = optional("Row files: the column holding each document's path.")
    repo_column: str | None = optional("Row files: the column naming each document's repository.")


class Keys(RowColumns):
    QUALITY = "none"  # data filtered already

    paths: Strings = setting(
        description="""Files, directories or glob patterns. .jsonl/.json/.parquet files hold one document per
        row; any other file is one document, its path kept as metadata.""",
        min_length=1,
    )
