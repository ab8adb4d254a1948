"""lm-evaluation-harness tasks run on the final model through the "kiln" model class."""
