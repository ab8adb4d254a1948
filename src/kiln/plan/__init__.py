"""Planning and pricing a run, torch-free so that `kiln plan` and config validation run on a login node:
how a step's tokens split and what the full run costs (steps), a step's peak memory per GPU (memory),
the GPUs' peaks (peaks), the smoke gate's verdict (verdict) and how all of it reads (tables). Its users
are `kiln plan`, the smoke stage, the trainer, the report and run_config; it sits below train."""
