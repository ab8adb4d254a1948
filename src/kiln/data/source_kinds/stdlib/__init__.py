"""The stdlib source kind: the .py files of the standard library of the interpreter running Kiln (the
default corpus: real code, present on every machine, no network). config (its keys), reader (its
files and documents). Registered in kiln.data.source_kinds.registry."""
