"""The hf source kind: a Hugging Face dataset read with `datasets.load_dataset(..., streaming=True)`;
builders such as `json` or `parquet` with `data_files` read local files through the same code, which
is how the tests run it (and a local folder laid out as a Hub dataset repository). config (its keys),
reader (the stream, its rows as documents, which failures are worth a retry, and the stream cut by
parquet data file for download_part jobs). Registered in kiln.data.source_kinds.registry."""
