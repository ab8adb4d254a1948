"""The hf kind's stream and its documents: a streaming Hugging Face dataset opened with errors that say
what to do, its rows as documents, and the line between failures worth retrying (the network) and
failures that are the input's fault.

`HF_HUB_OFFLINE=1` is read by huggingface_hub once, when it is imported: set it in the environment
that starts Kiln. When it is set, a hub dataset missing from the local cache is a clear error at once
(never retried); data files named by URL are still fetched.
"""

from __future__ import annotations

from typing import Iterator

from kiln.config.data_sections import Source
from kiln.data.sources import Document, SourceReader
from kiln.errors import KilnError

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


def open_stream(spec: Source):
    """The source's split as a `datasets.IterableDataset`, its columns checked against the spec."""
    import datasets

    try:
        stream = datasets.load_dataset(
            spec.dataset,
            name=spec.config,
            split=spec.split,
            data_files=None if spec.data_files is None else list(spec.data_files),  # datasets' type: a list
            revision=spec.revision,
            streaming=True,
        )
    except Exception as exc:  # datasets raises many types for "cannot reach / cannot find"
        if transient(exc):
            raise  # the download writer retries with backoff
        offline = " (HF_HUB_OFFLINE=1 and it is not in the local cache)" if hub_offline() else ""
        raise KilnError(f"{describe(spec)}: cannot open it{offline}: {exc}") from exc
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
