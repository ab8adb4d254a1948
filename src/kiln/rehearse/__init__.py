"""`kiln rehearse`: a run's GPU-side work at its real shapes and world size on fake tensors, on a
CPU, before anything is downloaded or paid for (run.py: what runs; live.py: what it counts;
command.py: the command)."""
