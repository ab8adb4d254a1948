"""The GPU check, a folder run as one script: `python bench/gpu_check` (its __main__; docs/benchmarks.md,
"GPU check"). Its modules import one another as gpu_check.<module>, with bench/ on sys.path."""
