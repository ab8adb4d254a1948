"""The download stage's source kinds (download.sources[].kind), one folder each, registered by name in
kiln.data.source_kinds.registry: stdlib, local, hf. docs/extending.md adds a kind."""
