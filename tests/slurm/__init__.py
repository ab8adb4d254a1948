"""Tests against a real Slurm cluster (a package, so its conftest does not shadow tests/conftest.py)."""
