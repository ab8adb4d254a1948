"""The download stage's source kinds (download.sources[].kind), one folder each, registered by name in
kiln.data.source_kinds.registry: stdlib, local, hf. docs/extending.md adds a kind."""

# kiln.config builds download.sources' model from every kind's keys as it loads: loaded first, it is
# whole when a kind's config.py is imported before it (which would otherwise meet itself half made).
import kiln.config  # noqa: F401
