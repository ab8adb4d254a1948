"""The smoke stage's gate: everything it checks and measures before the full run is allowed to start.

    checks   every check in the order that fails fastest (run_checks), and the measurements the plan
             is made from
    probe    the full run's training step timed as train will run it
    oom      an out-of-memory error on some ranks, ended the same way on every rank

Above kiln.train (it drives the Trainer's step) and beside kiln.eval; the smoke stage script
(workflow/scripts/smoke.py) and bench/gpu_check call it, training never does.
"""
