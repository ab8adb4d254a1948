"""docs/extending.md's eval metric, added the way the doc says: its folder written into a scratch copy of
src/ and its registry line added to that copy's registry. In a process on that copy, a config with
eval.token_accuracy validates and is in the generated settings, the real eval suite measures the metric
on a tiny trained model after the registered ones, and the report renders its table. Then the
registry's own contract: a metric registered twice, or a key two metrics give, is an error naming it."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mixture_run import SEED, mixture_run

from kiln.errors import KilnError
from kiln.eval.metrics import registry
from kiln.eval.metrics.output import EvalOutput

REPO = Path(__file__).parents[3]
DOC = REPO / "docs" / "extending.md"
# A python block of the doc whose first line names its file: "# src/kiln/eval/metrics/<name>/compute.py"
FILE_BLOCK = re.compile(r"```python\n# ([\w/.]+)[^\n]*\n(.*?)```", re.S)
FOLDER = "src/kiln/eval/metrics/token_accuracy/"
REGISTRY = "src/kiln/eval/metrics/registry.py"

# Run in the scratch copy: validate, measure with the real suite, render. argv: run folder, tokenizer,
# scratch folder; prints the eval output and the report's parts as JSON.
SCRIPT = """
import json, sys
from pathlib import Path
import kiln
from kiln import config as kiln_config
from kiln.config.settings import markdown_table
from kiln.eval.context import RunPaths
from kiln.eval.prepared import DataPaths, prepare
from kiln.eval.suite import evaluate
from kiln.report.run import metric_parts

run, tokenizer, work = map(Path, sys.argv[1:4])
assert kiln.__file__.startswith(str(work)), kiln.__file__
tiny = {k: v for k, v in kiln_config.read_yaml("tests/configs/tiny.yaml").items() if k != "eval"}
small = {"max_batches": 2, "prompts": ["def "], "max_new_tokens": 2, "infill_docs": 4,
         "lm_eval": {"tasks": [], "max_docs": 2}, "humaneval": {"problems": 0},
         "humaneval_infill": {"problems": 0}, "token_accuracy": {"batches": 1}}
cfg = kiln_config.RunConfig.of(kiln_config.stage_sections("eval", tiny, eval=small))
prepare(DataPaths(run / "shards", run / "tokens", run / "raw", tokenizer), cfg.eval, SEED, None, work / "eval_data")
paths = RunPaths(run / "train", run / "shards", run / "tokens", tokenizer, work / "eval_data")
out = evaluate(paths, cfg.eval, SEED, work / "eval")
data = {"eval": out, "config": cfg, "metrics": []}
print(json.dumps({
    "metrics": out.metrics, "samples": out.samples, "tables": metric_parts("tables", data),
    "settings": "eval.token_accuracy.batches" in markdown_table(),
}))
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer_path):
    return mixture_run(tmp_path_factory.mktemp("mixture-run"), tokenizer_path)


@pytest.fixture
def scratch(tmp_path):
    """A copy of src/ with the doc's folder written in and its registry line added, as the doc says."""
    blocks = dict(FILE_BLOCK.findall(DOC.read_text(encoding="utf-8")))
    src = tmp_path / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    written = []
    for path, text in blocks.items():
        if path.startswith(FOLDER):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text, encoding="utf-8")
            written.append(Path(path).name)
    assert sorted(written) == ["__init__.py", "compute.py", "report.py", "section.py"]
    with (tmp_path / REGISTRY).open("a", encoding="utf-8") as registry_file:
        registry_file.write(blocks[REGISTRY])
    return tmp_path


def test_the_docs_metric_is_configured_measured_by_the_suite_and_reported(scratch, run_dir, tokenizer_path):
    done = subprocess.run(
        [sys.executable, "-c", f"SEED = {SEED}\n" + SCRIPT, str(run_dir), str(tokenizer_path), str(scratch)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": f"{scratch / 'src'}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    metrics = found["metrics"]
    assert 0 <= metrics["token_accuracy"]["accuracy"] <= 1 and metrics["token_accuracy"]["tokens"] > 0
    # after every registered metric's keys, before the suite's own
    assert list(metrics)[-3:] == ["contamination", "token_accuracy", "n_params"]
    assert list(found["samples"]) == ["completions", "decoding", "infill", "code", "train_prompts"]
    tables = found["tables"]
    at = tables.index("### Next-token accuracy (held-out split)")
    assert tables.index("### Contamination (13-gram overlap with the training tokens)") < at
    assert (
        tables[at + 4] == f"| {metrics['token_accuracy']['tokens']:,} | {metrics['token_accuracy']['accuracy']:.4f} |"
    )
    assert found["settings"]  # the generated docs/settings.md lists the new key


def test_a_metric_registered_twice_or_a_key_given_twice_is_named():
    with pytest.raises(KilnError, match="eval metric 'code' is registered twice"):
        registry.register("code", "elsewhere.code", "again")
    one = EvalOutput({"val_loss": 1.0})
    with pytest.raises(KilnError, match="eval metric toy gives val_loss in metrics.json, which another metric gave"):
        one.add(EvalOutput({"val_loss": 2.0}), by="toy")


@pytest.mark.parametrize("metric", [m.name for m in registry.metrics() if m.section is not None])
def test_a_metrics_section_imports_first_in_a_fresh_process(metric):
    """A script whose first Kiln import is a metric's section.py (to read its defaults, say) gets it
    whole: kiln.config, whose eval section gathers every metric's section, is imported before it."""
    package = next(m.package for m in registry.metrics() if m.name == metric)
    done = subprocess.run([sys.executable, "-c", f"import {package}.section"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
