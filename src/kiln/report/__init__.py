"""Reading what the stages left on disk, torch-free: where a run stands (status, `kiln status`), a run's
report.md (run) and a sweep's sweep.md (sweep). They read every stage's output and import no stage's
code beyond the plan package's tables, so they sit on top beside the commands."""
