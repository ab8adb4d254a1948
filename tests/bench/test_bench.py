"""Every bench script still runs (issue 19, "benches rot unseen": bench/dataprep.py had failed in its
memory part for a while before anyone ran it). Each entry point in bench/ is run as a user types it,
`python bench/X.py --quick`, from the repository root: tiny input through every part that prints its
table. Its figures mean nothing at that size and are not asserted; it must exit 0 having printed the
lines its table begins with (or, for a script not listed in PRINTS, some markdown table).

Entry points are found, not listed: a bench/*.py with an `if __name__ == "__main__":` block that is
not in HELPERS, and a folder run as a script (`python bench/<folder>`, its __main__.py), so a new one
is run here the day it lands. Each takes its command line from bench/common.py's parser, which gives
it --quick; one that does not fails here with what to do. A module without a main block must be listed
in HELPERS (a script that forgot its main block would otherwise be skipped silently). No bench reaches
into Kiln's private names (issue 43): what a bench needs, the package offers publicly.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
MAIN_BLOCK = 'if __name__ == "__main__":'
PARSER = "common.parser("  # bench/common.py: --quick (and --rounds) for every entry point

# bench/ modules nobody runs by hand: imported by the entry points.
HELPERS = {"common.py": "every entry point's command line: --quick, --rounds"}
# Entry points whose quick mode another test file runs already.
ELSEWHERE = {
    "gpu_check": "tests/bench/test_gpu_check.py runs `python bench/gpu_check --cpu-dry-run` (also spelt --quick)"
}

# Lines each quick run must print: its table's header and what closes the run.
PRINTS = {
    "budget.py": ["| arm | budget s | stage s (launcher) | of budget |", "| quiet |"],
    "cleaning.py": ["### prose (prose filters)", "| corpus | filters | documents | MB | kept |"],
    "code_eval.py": [
        "| part | Kiln | s | baseline | s | Kiln is |",
        "canonical solutions pass@1: 1.00 (ours)",
        "| now | single_line 1 of 7, multi_line 1 of 28, random_span 1 of 10 | 6 |",
    ],
    "data_scatter.py": [
        "| cores | scatter wall s (snakemake) |",
        "| nodes | part jobs at once | scatter min |",
        "| cores | download scatter wall s (snakemake) |",
        "| nodes | download_part jobs at once | scatter min |",
    ],
    "dataprep.py": [
        "| pipeline | wall s | MiB/s | Kiln is |",
        "| Kiln pretokenize + shard |",
        "| pretokenize on | MiB | peak RSS MiB, stage process |",
        "| one 1 MiB document + 20 small |",
    ],
    "generate.py": ["| loop | new tokens/s | seconds | same output as baseline |", "cached batched / uncached"],
    "memory_estimate.py": [
        "| model | tokens | V | precision | AC | measured MiB |",
        "| llama 1x32 |",
        "| run | GPU | setting | estimated GiB per GPU |",
        "| llama3.2-1b flagship |",
    ],
    "quality.py": [
        "| arm | wall s | tokens | tokens/s | bpb held-out stdlib | bpb pip/_internal |",
        "ratio kiln/plain: ",
        "| kiln, stall@4:0.1 |",  # --quick's 50%:0.1, a share of its 8 steps
    ],
    "near_dup.py": ["| near-dup | documents/s | seconds | peak RSS MiB |", "Kiln / datasketch: "],
    "optimizer.py": ["| optimizer | lr (AdamW) | muon_lr |"],
    "rehearse_calibration.py": [
        "| config | ranks | micro-batch x seq | precision | rehearsed MiB | measured MiB |",
        "| default | 1 | 1 x 512 | fp32 |",
        "| tiny | 2 | 2 x 64 | bf16 |",
    ],
    "stage_times.py": ["| stage | wall s | CPU s | max RSS MiB |", "| report | not run |", "| **total** |"],
    "sweep.py": ["| job | s |", "| download (once) |", "| **sweep wall time** (snakemake start to end) |"],
    "train_throughput.py": ["| loop | tokens/s (median) | min-max | TFLOP/s | MFU |", "ours: "],
}


def _main_file(name: str) -> Path:
    """The file an entry point runs: bench/X.py, or a folder's __main__.py."""
    return BENCH / name if name.endswith(".py") else BENCH / name / "__main__.py"


def _has_main(path: Path) -> bool:
    return MAIN_BLOCK in path.read_text(encoding="utf-8")


MODULES = sorted(p.name for p in BENCH.glob("*.py"))
FOLDERS = sorted(p.parent.name for p in BENCH.glob("*/__main__.py"))
ENTRY_POINTS = [name for name in MODULES if name not in HELPERS and _has_main(BENCH / name)] + FOLDERS


def test_every_bench_module_is_an_entry_point_or_a_listed_helper():
    unlisted = [name for name in MODULES if name not in HELPERS and not _has_main(BENCH / name)]
    assert not unlisted, f"bench/{unlisted}: no {MAIN_BLOCK!r} block; add one, or list the module in HELPERS"
    assert set(HELPERS) <= set(MODULES), f"HELPERS lists modules bench/ no longer has: {set(HELPERS) - set(MODULES)}"
    assert set(PRINTS) <= set(ENTRY_POINTS), f"PRINTS lists scripts that are gone: {set(PRINTS) - set(ENTRY_POINTS)}"
    assert set(ELSEWHERE) <= set(ENTRY_POINTS), (
        f"ELSEWHERE lists entry points that are gone: {set(ELSEWHERE) - set(ENTRY_POINTS)}"
    )
    no_parser = [name for name in ENTRY_POINTS if PARSER not in _main_file(name).read_text(encoding="utf-8")]
    assert not no_parser, (
        f"bench/{no_parser}: build the command line with bench/common.py's parser ({PARSER}__doc__)), which "
        "gives it --quick: tiny input through every part that prints its table, in a few seconds"
    )


def _kiln_private_names(path: Path) -> list[str]:
    """`line: name` of each private name of Kiln's (one starting with a single underscore) that `path`
    imports (`from kiln.x import _y`) or reads off a Kiln module it imported (`x._y`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kiln":
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.lineno}: {node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)  # a module or a name in one: only a module has ._x
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kiln":
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_bench_uses_a_private_name_of_kilns():
    """A bench runs the package's public API: a private name it needs is made public in its module (and
    its callers renamed), so that the package may change what is private without breaking a bench unseen."""
    found = {
        str(path.relative_to(REPO)): names
        for path in sorted(BENCH.rglob("*.py"))
        if (names := _kiln_private_names(path))
    }
    assert not found, f"private names of kiln's used in bench/: {found}"


@pytest.mark.parametrize("name", [n for n in ENTRY_POINTS if n not in ELSEWHERE])
def test_quick_run_prints_its_table(name):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        [sys.executable, f"bench/{name}", "--quick"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"python bench/{name} --quick exited {done.returncode}:\n{out[-4000:]}"
    lines = done.stdout.splitlines()
    for want in PRINTS.get(name, []):
        assert any(line.startswith(want) for line in lines), f"bench/{name} --quick printed no {want!r}:\n{out[-4000:]}"
    if name not in PRINTS:  # a new script: some markdown table at least
        assert any(line.startswith("|---") for line in lines), f"bench/{name} --quick printed no table:\n{out[-4000:]}"
