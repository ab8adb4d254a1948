"""The eval stage's metrics, one folder each, registered in one line each (kiln.eval.metrics.registry;
docs/extending.md)."""

# kiln.config first, whole: its eval section gathers every metric's section.py (kiln.config.eval_sections),
# so a process whose first Kiln import is a metric's section.py would otherwise meet that module half-made.
import kiln.config  # noqa: F401
