"""The eval stage's metrics, one folder each, registered in one line each (kiln.eval.metrics.registry;
docs/extending.md)."""
