"""Every import points down: the layers of the kiln package, named here and nowhere else, and a read of
every import statement (top-level and inside functions) that fails on one running up a layer or
across to a sibling declared independent.

A layer holds units: a package (kiln.data) or a top-level module (kiln.layout). A unit may import any
unit of a lower layer and anything inside itself; never a unit of a higher layer, nor a sibling in its
own layer (siblings are independent: generation, HF interop and planning know nothing of each other).
On top of the package sit the stage scripts (workflow/scripts, which import kiln and nothing of bench/
or tests/), and above them bench/ and tests/, which the package and the scripts never import.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Bottom to top. Units in one tuple are siblings, independent of each other.
LAYERS: list[tuple[str, ...]] = [
    ("kiln",),  # the package's own __init__: a docstring
    ("kiln.errors",),  # KilnError and the exit codes every layer raises
    ("kiln.io",),  # atomic files, JSON, Snakemake's benchmark files
    ("kiln.config",),  # the run config: files, schema, rules, settings, sections, model registry (torch-free)
    ("kiln.layout",),  # where results land
    ("kiln.data", "kiln.model"),  # text to token shards; the decoder models (torch)
    ("kiln.generate", "kiln.hf", "kiln.plan"),  # decoding; Hugging Face interop; planning and pricing
    ("kiln.train",),  # the loop, distributed code, checkpoints
    ("kiln.gate", "kiln.eval"),  # the smoke stage's checks; a checkpoint's evaluation (both drive train's parts)
    ("kiln.forecast", "kiln.report", "kiln.stage"),  # `kiln plan`; status and reports; the stage scripts' helper
    ("kiln.rehearse",),  # `kiln rehearse`: train's and the gate's parts on fake tensors, priced as `kiln plan` does
    ("kiln.main",),  # the `kiln` command
]

# Modules that live in another unit's folder, by pattern: each model family's torch-free half (its spec:
# defaults, rules, counts, memory terms; its Hugging Face mapping), the registry that names the families
# and the config.json fields families share sit in kiln/model/, beside the families' torch modules, so
# that one folder holds a family (kiln.model.registry). Config validates a model section with them and
# plan prices one, without torch: they are kiln.config's, and may import it but no torch module of
# kiln.model. Likewise each download source kind's keys and the registry that names the kinds sit in
# kiln/data/source_kinds/, beside the kinds' readers (kiln.data.source_kinds.registry): config builds
# download.sources' model from them without pyarrow or datasets.
PART_OF: dict[str, str] = {
    "kiln.model.registry": "kiln.config",
    "kiln.model.hf_fields": "kiln.config",
    "kiln.model.*.spec": "kiln.config",
    "kiln.model.*.hf": "kiln.config",
    "kiln.data.source_kinds.registry": "kiln.config",
    "kiln.data.source_kinds.*.config": "kiln.config",
    # Each eval metric's settings, and the registry that names the metrics: config builds the eval
    # section from them, without torch. A metric's report.py is the report's (it may use the report's
    # markdown helpers); its compute.py is kiln.eval's (kiln.eval.metrics.registry).
    "kiln.eval.metrics.registry": "kiln.config",
    "kiln.eval.metrics.*.section": "kiln.config",
    "kiln.eval.metrics.*.report": "kiln.report",
}

# Top-level module names of what sits above the package: nothing under src/ or workflow/scripts imports them.
ABOVE = ("bench", "tests", "workflow")


def layer_of() -> dict[str, tuple[int, int]]:
    """{unit: (layer index, position among its siblings)}."""
    return {unit: (i, j) for i, units in enumerate(LAYERS) for j, unit in enumerate(units)}


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the file, top-level or not; `from a import b` gives a.b
    (b may be a module or a name in a: the unit is the same either way, except for `from kiln import x`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def unit_of(name: str, units: dict[str, tuple[int, int]]) -> str | None:
    """The longest listed unit that `name` is, or lies inside (kiln.train.trainer -> kiln.train), a
    PART_OF pattern's unit first (kiln.model.llama.spec -> kiln.config). The root unit is
    kiln/__init__.py alone: kiln.x of no listed unit is in no layer."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        prefix = ".".join(parts[:n])
        part = next((unit for pattern, unit in PART_OF.items() if fnmatch.fnmatchcase(prefix, pattern)), None)
        if part is not None:
            return part
        if prefix in units:
            return prefix
    return name if name in units else None


def describe(unit: str, units: dict[str, tuple[int, int]]) -> str:
    return f"{unit} (layer {units[unit][0]}: {', '.join(LAYERS[units[unit][0]])})"


def layer_problems(src: Path) -> list[str]:
    """One line per import under src/kiln that runs up or sideways, or from a unit LAYERS does not place."""
    units = layer_of()
    problems = []
    for path in sorted((src / "kiln").rglob("*.py")):
        module = module_name(path, src)
        rel = path.relative_to(src.parent).as_posix()
        here = unit_of(module, units)
        if here is None:
            problems.append(
                f"{rel}: {module} is in no layer: add its package or module to LAYERS in tests/unit/test_layers.py"
            )
            continue
        for line, name in imported(path, module):
            top = name.split(".")[0]
            if top in ABOVE:
                problems.append(f"{rel}:{line}: {describe(here, units)} imports {name}, which sits above the package")
                continue
            if top != "kiln":
                continue
            there = unit_of(name, units)
            if there is None:
                problems.append(f"{rel}:{line}: imports {name}, which is in no layer: add it to LAYERS")
                continue
            if there == here:
                continue
            (hi, _), (ti, _) = units[here], units[there]
            if ti > hi:
                problems.append(
                    f"{rel}:{line}: {describe(here, units)} imports {name} from a higher layer, "
                    f"{describe(there, units)}"
                )
            elif ti == hi:
                problems.append(
                    f"{rel}:{line}: {here} imports {name} from {there}, a sibling it is declared "
                    f"independent of (layer {hi}: {', '.join(LAYERS[hi])})"
                )
    return problems


def above_problems(root: Path) -> list[str]:
    """The stage scripts import kiln (and the standard library and third parties), never bench/,
    tests/ or one another; no package module is imported from bench/ or tests/ by name."""
    scripts = root / "workflow" / "scripts"
    script_names = {p.stem for p in scripts.glob("*.py")}
    bench_names = {p.stem for p in (root / "bench").glob("*.py")} | {
        p.parent.name for p in (root / "bench").glob("*/__main__.py")
    }
    test_names = {p.stem for p in (root / "tests").rglob("*.py")}
    problems = []
    for path in sorted(scripts.glob("*.py")):
        for line, name in imported(path, path.stem):
            top = name.split(".")[0]
            if top in ABOVE or top in bench_names | test_names | script_names:
                problems.append(
                    f"{path.relative_to(root).as_posix()}:{line}: a stage script imports {name}; "
                    "the scripts import kiln only (shared code belongs in the package)"
                )
    return problems


def test_every_import_in_the_package_points_down():
    problems = layer_problems(REPO / "src")
    assert not problems, "imports that do not point down:\n  " + "\n  ".join(problems)


def test_stage_scripts_import_only_the_package():
    problems = above_problems(REPO)
    assert not problems, "\n  ".join(problems)


def test_every_package_and_module_is_placed_in_one_layer():
    listed = [unit for units in LAYERS for unit in units]
    assert len(listed) == len(set(listed)), "a unit listed twice in LAYERS"
    src = REPO / "src" / "kiln"
    present = (
        {"kiln"}
        | {f"kiln.{p.stem}" for p in src.glob("*.py") if p.stem != "__init__"}
        | {f"kiln.{p.parent.name}" for p in src.glob("*/__init__.py")}
    )
    assert present == set(listed), (
        f"not in LAYERS: {sorted(present - set(listed))}; "
        f"in LAYERS but not in src/kiln: {sorted(set(listed) - present)}"
    )


def test_an_upward_or_sideways_import_is_named_with_file_line_and_layers(tmp_path):
    """The check itself, on a small tree: model importing train runs up, generate importing plan runs
    sideways, train importing model points down, and a module of no layer is named."""
    files = {
        "kiln/__init__.py": "",
        "kiln/model/__init__.py": "",
        "kiln/model/gpt.py": "import torch\nfrom kiln.errors import KilnError\n\n\ndef f():\n    from kiln.train import trainer\n",
        "kiln/generate/__init__.py": "",
        "kiln/generate/decode.py": "from ..plan.steps import build_plan\n",
        "kiln/train/__init__.py": "",
        "kiln/train/trainer.py": "from kiln.model.gpt import GPT\nfrom kiln import layout\n",
        "kiln/extra.py": "",
        "kiln/errors.py": "",
        "kiln/layout.py": "import bench.gpu_check\n",
    }
    for rel, text in files.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    problems = layer_problems(tmp_path / "src")
    assert len(problems) == 4, problems
    up, sideways, above, unplaced = (
        next(p for p in problems if p.startswith(prefix))
        for prefix in (
            "src/kiln/model/gpt.py:6:",
            "src/kiln/generate/decode.py:1:",
            "src/kiln/layout.py:1:",
            "src/kiln/extra.py:",
        )
    )
    assert "kiln.model (layer" in up and "imports kiln.train.trainer from a higher layer, kiln.train (layer" in up
    assert "kiln.plan.steps.build_plan from kiln.plan, a sibling" in sideways
    assert "bench.gpu_check" in above and "kiln.extra is in no layer" in unplaced


def test_a_model_familys_torch_free_half_is_configs(tmp_path):
    """A family's spec and Hugging Face mapping belong to kiln.config (PART_OF): kiln.config may import the
    registry, a spec may import kiln.config, and a spec importing its family's torch module runs up."""
    files = {
        "kiln/__init__.py": "",
        "kiln/errors.py": "",
        "kiln/config/__init__.py": "from kiln.model import registry\n",
        "kiln/model/__init__.py": "",
        "kiln/model/registry.py": "from kiln.errors import KilnError\n",
        "kiln/model/toy/__init__.py": "",
        "kiln/model/toy/spec.py": "from kiln.config import models\nfrom kiln.model.toy.module import Toy\n",
        "kiln/model/toy/module.py": "from kiln.model.toy.spec import params\n",
    }
    for rel, text in files.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    problems = layer_problems(tmp_path / "src")
    assert len(problems) == 1 and problems[0].startswith("src/kiln/model/toy/spec.py:2:"), problems
    assert "kiln.config (layer" in problems[0] and "from a higher layer, kiln.model (layer" in problems[0]
