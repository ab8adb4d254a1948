"""The stdlib kind's files (the standard library's, by glob, site-packages and caches left out) and
their documents, ids and paths relative to the standard library directory."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Iterator, Sequence

from kiln.config.data_sections import Source
from kiln.data.sources import Document, SourceReader


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def files(spec: Source) -> list[Path]:
    root = stdlib_root()
    return sorted(
        {
            p
            for pattern in spec.include
            for p in root.glob(pattern)
            if p.is_file() and "site-packages" not in p.parts and "__pycache__" not in p.parts
        }
    )


def read_files(reader: SourceReader, files: Sequence[Path]) -> Iterator[Document | None]:
    spec, root = reader.spec, stdlib_root()
    for path in files:
        text = reader.read_file(path)
        rel = path.relative_to(root).as_posix()
        yield None if text is None else Document(f"{spec.name}/{rel}", text, rel, spec.name)
