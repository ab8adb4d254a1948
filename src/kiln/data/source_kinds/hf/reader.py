"""The hf kind's stream and its documents: a streaming Hugging Face dataset opened with errors that say
what to do, its rows as documents, and the line between failures worth retrying (the network) and
failures that are the input's fault; and the stream cut by data file (split_files, read_split) for
download_part jobs (kiln.data.raw_scatter), where its builder is parquet's.

`HF_HUB_OFFLINE=1` is read by huggingface_hub once, when it is imported: set it in the environment
that starts Kiln. When it is set, a hub dataset missing from the local cache is a clear error at once
(never retried); data files named by URL are still fetched.
"""

from __future__ import annotations

import itertools
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Sequence

from kiln.config.data_sections import Source
from kiln.data.sources import Document, SourceReader
from kiln.errors import KilnError

# The builder whose streams download_part jobs read a range of data files each (split_files).
PARQUET_BUILDER = "datasets.packaged_modules.parquet.parquet"
FOOTER_READERS = 16  # data files whose footers the plan reads at once
# A hub dataset's data file as datasets resolves it: hf://datasets/<id>@<commit>/<path>.
_HUB_COMMIT = re.compile(r"^hf://datasets/[^@]+@([0-9a-f]{40})/")

# HTTP statuses that say "try again later" rather than "this does not exist".
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _network_errors() -> tuple[type[BaseException], ...]:
    """Transport-level exception types of the HTTP clients that datasets and huggingface_hub use."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        import aiohttp

        errors.append(aiohttp.ClientError)
    except ImportError:
        pass
    try:
        import httpx

        errors.append(httpx.TransportError)
    except ImportError:
        pass
    try:
        import requests

        errors.extend(
            [requests.exceptions.ConnectionError, requests.exceptions.Timeout, requests.exceptions.ChunkedEncodingError]
        )
    except ImportError:
        pass
    return tuple(errors)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def transient(exc: BaseException) -> bool:
    """True for a network failure that a later attempt may not meet; never for the hub refusing to
    be reached because HF_HUB_OFFLINE=1."""
    network = _network_errors()
    for error in _chain(exc):
        if "OfflineModeIsEnabled" in f"{type(error).__name__} {error}":
            return False
        status = _status(error)
        if status is not None:
            return status in TRANSIENT_STATUS
        if isinstance(error, network):
            return True
    return False


def describe(spec: Source) -> str:
    config = f" (config {spec.config!r})" if spec.config else ""
    return f"download: source {spec.name!r}: dataset {spec.dataset!r}{config}"


def _builder(spec: Source):
    """The dataset's `datasets` builder (what `load_dataset` streams from), its data files resolved: a
    hub dataset's pinned to the commit its revision names, so they cannot change under a run."""
    import datasets

    try:
        return datasets.load_dataset_builder(
            spec.dataset,
            name=spec.config,
            data_files=None if spec.data_files is None else list(spec.data_files),  # datasets' type: a list
            revision=spec.revision,
        )
    except Exception as exc:  # datasets raises many types for "cannot reach / cannot find"
        if transient(exc):
            raise  # the download writer retries with backoff
        raise _not_opened(spec, exc) from exc


def _not_opened(spec: Source, exc: BaseException) -> KilnError:
    offline = " (HF_HUB_OFFLINE=1 and it is not in the local cache)" if hub_offline() else ""
    return KilnError(f"{describe(spec)}: cannot open it{offline}: {exc}")


def open_stream(spec: Source, builder=None):
    """The source's split as a `datasets.IterableDataset` (as `load_dataset(..., streaming=True)`
    makes it, from `builder` when given), its columns checked against the spec."""
    builder = builder or _builder(spec)
    try:
        stream = builder.as_streaming_dataset(split=spec.split)
    except Exception as exc:
        if transient(exc):
            raise
        raise _not_opened(spec, exc) from exc
    if stream.features is not None:  # known up front for most hub datasets; else checked per row
        present = list(stream.features)
        for key in ("text_column", "path_column", "repo_column"):
            column = getattr(spec, key)
            if column is not None and column not in present:
                raise KilnError(
                    f"{describe(spec)}: no column {column!r} (download.sources: {key}); "
                    f"columns present: {', '.join(present)}"
                )
    return stream


def read_stream(reader: SourceReader, stream, start: int) -> Iterator[Document]:
    spec = reader.spec
    text_col, path_col, repo_col = spec.text_column, spec.path_column, spec.repo_column
    for row, record in enumerate(stream, start=start):
        where = f"source {spec.name!r}: dataset {spec.dataset!r} row {row}"
        if text_col not in record:
            raise KilnError(f"{where}: no column {text_col!r}; columns present: {', '.join(record)}")
        path = record.get(path_col) if path_col else spec.dataset
        yield reader.document(
            f"{spec.name}/{spec.dataset}#{row}",
            record.get(text_col),
            where,
            str(path),
            record.get(repo_col) if repo_col else None,
        )


def split_files(spec: Source) -> tuple[list[tuple[str, int, int]], str | None]:
    """The split's data files in the stream's order, each (path or hf:// URL, bytes, rows), for
    download_part jobs to read a range of them each (read_split); or none, and why the stream is read
    whole. Only parquet's builder splits: its files' rows are in their footers, so each range knows
    the row its ids start from before anything is read."""
    builder = _builder(spec)
    if type(builder).__module__ != PARQUET_BUILDER:
        return [], f"its builder ({builder.name}) is not parquet's: its files' rows are known only by reading them"
    if (
        getattr(builder.config, "filters", None) is not None
        or getattr(builder.config, "on_bad_files", "error") != "error"
    ):
        return [], "its parquet builder filters rows or skips files: the footers' row counts are not its rows"
    files = list((builder.config.data_files or {}).get(spec.split, []))
    if len(files) < 2:
        return [], f"split {spec.split!r} is {len(files)} data file"
    with ThreadPoolExecutor(FOOTER_READERS) as pool:  # a hub dataset's footers are a request or two each
        return list(pool.map(_bytes_and_rows, files)), None


def _bytes_and_rows(url: str) -> tuple[str, int, int]:
    import fsspec
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        return url, fs.size(path), pq.ParquetFile(f).metadata.num_rows


def read_split(reader: SourceReader, files: Sequence[str], first_row: int) -> Iterator[Document | None]:
    """The rows of `files`, a range of split_files' in order, numbered from `first_row` as the whole
    stream numbers them: the stream opened as one job opens it (at the commit the plan resolved), then
    one datasets shard per file."""
    spec = reader.spec
    pinned = _HUB_COMMIT.match(files[0])
    builder = _builder(spec.replace(revision=pinned[1]) if pinned else spec)
    every = list((builder.config.data_files or {}).get(spec.split, []))
    stream = open_stream(spec, builder)
    start = every.index(files[0]) if files[0] in every else 0
    if every[start : start + len(files)] != list(files) or stream.n_shards != len(every):
        raise KilnError(
            f"{describe(spec)}: its data files are no longer those download_plan listed (a new revision, "
            "files moved?): rerun download_plan"
        )
    shards = (stream.shard(len(every), index, contiguous=True) for index in range(start, start + len(files)))
    return read_stream(reader, itertools.chain.from_iterable(shards), first_row)
