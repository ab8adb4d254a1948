# A sweep's overlay report: every arm's validation curve against tokens and wall time, a table of
# final loss, bits per byte, tokens/s, time and cost with the best arm marked, and for a ladder the
# fit of loss against parameters and compute. Only in a config with a `sweep` (kiln.config.sweep).


if SWEEP:

    rule sweep_report:
        input:
            [LAYOUTS[run].output(stage, name) for run in RUNS
             for stage, name in (("plan", "plan.json"), ("train", "summary.json"), ("eval", "metrics.json"))],
        output:
            report=report(kiln_layout.sweep_outputs(SWEEP)["report"], caption="../report/sweep.rst", category="Sweep"),
            plot=report(kiln_layout.sweep_outputs(SWEEP)["plot"], caption="../report/sweep.rst", category="Sweep"),
            table=kiln_layout.sweep_outputs(SWEEP)["table"],
        params:
            script=script("sweep_report"),
            # What the overlay shows of each arm is what its report shows: tracked alike (kiln.config.settings).
            cfg=json.dumps({run: kiln_settings.tracked(cfg, "report") for run, cfg in RUNS.items()}, sort_keys=True),
            sweep=kiln_settings.Untracked(json.dumps({"name": SWEEP, "sweep": EXPERIMENT.sweep, "runs": RUNS}, sort_keys=True)),
            results=lambda w, output: Path(output.report).parents[1],
        conda:
            CONDA_ENV
        log:
            f"{kiln_layout.RESULTS}/{SWEEP}/logs/sweep_report.log",
        benchmark:
            f"{kiln_layout.RESULTS}/{SWEEP}/benchmarks/sweep_report.tsv"
        shell:
            "python {params.script} --sweep {params.sweep:q} --results {params.results}"
            " --report {output.report} --plot {output.plot} --table {output.table} > {log} 2>&1"
