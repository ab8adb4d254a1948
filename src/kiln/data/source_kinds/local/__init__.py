"""The local source kind: files, directories or globs on disk; .jsonl/.json/.parquet files hold one
document per row (a text column, optionally path and repository columns), any other file is one
document with its path kept. config (its keys, and the row columns hf shares), reader (its files and
documents). Registered in kiln.data.source_kinds.registry."""
