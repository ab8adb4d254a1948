"""What each setting means to each stage, derived from the settings' declarations (kiln.config.declare:
every field of the section models names the stages that read it, each OUTPUT, RUN or a When).

  SETTINGS              {dotted path: Reads} for every leaf, in declaration order
  tracked / untracked   a rule's params: the OUTPUT leaves as JSON Snakemake compares, and the rest
                        of the stage's sections as a value it cannot represent and so ignores
                        (snakemake.persistence skips such params), passed to the script all the same;
  trajectory            the train leaves a checkpoint's fingerprint holds (kiln.train.fingerprint);
  derived               what a stage reads that the config implies rather than sets (the roles an hf
                        tokenizer must hold, the eval batches the rehearsal rehearses), tracked and
                        keyed with the stage where it applies;
  data_key              the content key of a shared data folder (kiln.layout);
  markdown_table        docs/settings.md (`python -m kiln.config settings`; a test keeps it current).

Nothing here lists keys by stage: a new setting is one field in its section's model.
"""

from __future__ import annotations

import collections.abc
import copy
import hashlib
import json
import types
import typing
from typing import Mapping

from kiln.config.declare import DATA_STAGES, OUTPUT, RUN, STAGES, Reads, When
from kiln.config.eval_switches import eval_batches_on
from kiln.config.run_config import DEFAULT_SEED, REQUIRED
from kiln.config.schema import leaves as schema_leaves
from kiln.config.special_tokens import roles_used
from kiln.errors import KilnError

__all__ = ["DATA_STAGES", "OUTPUT", "RUN", "STAGES", "SETTINGS", "When"]


def _table() -> dict[str, Reads]:
    return {path: leaf.declared.reads for path, leaf in schema_leaves().items() if leaf.declared.reads is not None}


SETTINGS: dict[str, Reads] = _table()
DERIVED = "derived"  # the key of a stage's derived values in its tracked params (no section is called this)


class Untracked:
    """A rule param Snakemake does not compare between runs: snakemake.persistence records only
    params of builtin types, so this value's changes rerun nothing. The shell gets str(value)."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def check_table(leaves: Mapping | None = None) -> None:
    """A KilnError naming every leaf (of `leaves`, by default every setting's) declared without Reads
    (kiln.config.declare: setting(..., tag))."""
    leaves = schema_leaves() if leaves is None else leaves
    untagged = [path for path, leaf in leaves.items() if leaf.declared.reads is None]
    if untagged:
        raise KilnError(
            "; ".join(f"{p}: a setting declared without the stages it concerns (its Reads)" for p in untagged)
        )


# ------------------------------------------------------------------------------------------------
# What each stage reads, and what reruns it


def effect(path: str, stage: str, cfg: Mapping) -> str | None:
    """OUTPUT, RUN, or None (the stage does not read it) for `path` in this config."""
    tag = SETTINGS[path].stages.get(stage)
    if isinstance(tag, When):
        return OUTPUT if tag.test(cfg) else RUN
    return tag


def _get(cfg: Mapping, path: str):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _put(tree: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = copy.deepcopy(value)


def sections(stage: str) -> tuple[str, ...]:
    """The top-level sections a stage reads (whole: a script reads a section as one typed object)."""
    return tuple(dict.fromkeys(path.split(".")[0] for path, s in SETTINGS.items() if stage in s.stages))


def _split(cfg: Mapping, stage: str) -> tuple[dict, dict]:
    """(the OUTPUT leaves, everything else of the stage's sections), each a nested dict."""
    tracked: dict = {}
    for path in SETTINGS:
        if effect(path, stage, cfg) == OUTPUT:
            try:
                _put(tracked, path, _get(cfg, path))
            except KeyError:  # a key the config leaves unset (no default): nothing to track
                pass
    rest = {name: copy.deepcopy(cfg[name]) for name in sections(stage) if name in cfg}
    _prune(rest, tracked)
    return tracked, rest


def _prune(tree: dict, remove: Mapping) -> None:
    for key, value in remove.items():
        if isinstance(value, Mapping) and isinstance(tree.get(key), dict) and value:
            _prune(tree[key], value)
            if not tree[key]:
                del tree[key]
        else:
            tree.pop(key, None)


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def derived(cfg: Mapping, stage: str) -> dict:
    """What `stage` reads that the config implies rather than sets, as JSON; empty for every stage but
    the tokenizer and the rehearsal, so their params and data keys are what they were.

    "roles", for an hf source only: the tokenizer stage of an hf source appends a token for each role
    the run uses that the source lacks, and only for those (kiln.data.tokenizer_build.hf_tokenizer),
    the roles the run's samples use (pretokenize.fim.rate, pretokenize.repo_context:
    kiln.config.special_tokens.roles_used). A derived value, not a tag on those settings, so a trained
    BPE, which holds every role, is never rerun for them, and the tokenizer's data key moves only for an
    hf source whose roles change. The rehearsal reads them too: the roles appended are embedding rows.

    "eval_batches_on", the rehearsal's always: the eval stage's batches the config turns on
    (kiln.config.eval_switches), each a phase of the rehearsal. Derived, not tags on the settings that
    switch them (eval.lm_eval.tasks, eval.infill_docs, eval.humaneval.problems, ...), so a batch turned
    on or off reruns the rehearsal and a change of its size (1 problem or 2) does not; and the rehearse
    stage, which does not read the pretokenize section, learns from it whether the run trains with FIM."""
    implied: dict = {}
    if stage in ("tokenizer", "rehearse") and cfg["tokenizer"]["kind"] == "hf":
        pretokenize = cfg["pretokenize"]
        implied["roles"] = list(roles_used(pretokenize["fim"]["rate"], pretokenize["repo_context"]))
    if stage == "rehearse":
        implied["eval_batches_on"] = eval_batches_on(cfg)
    return implied


def tracked(cfg: Mapping, stage: str) -> str:
    """The rule's tracked params: the stage's OUTPUT leaves as canonical JSON, and what it derives from
    the config (under DERIVED, where there is any), so Snakemake reruns the stage exactly when one of
    them changes."""
    params, implied = _split(cfg, stage)[0], derived(cfg, stage)
    return _canonical({**params, DERIVED: implied} if implied else params)


def untracked(cfg: Mapping, stage: str) -> Untracked:
    """The rest of what the stage reads (its RUN leaves and the other keys of its sections), as a
    param Snakemake does not compare."""
    return Untracked(_canonical(_split(cfg, stage)[1]))


def stage_config(cfg: Mapping, stage: str) -> dict:
    """The sections a stage reads, whole: what a script gets by hand (--config) and, joined from
    the two params, under Snakemake."""
    return join(*_split(cfg, stage))


def join(tracked_part: Mapping, rest: Mapping) -> dict:
    """The two params of a rule joined back into the stage's sections."""
    out = copy.deepcopy(dict(rest))
    for key, value in tracked_part.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = join(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


def trajectory(train: Mapping) -> dict:
    """The train section's leaves that shape the trajectory (OUTPUT for the train stage), nested as
    the section is; train.seed is left to the fingerprint's own seed part."""
    cfg = {"train": train}
    kept: dict = {}
    for path in SETTINGS:
        if path.startswith("train.") and path != "train.seed" and effect(path, "train", cfg) == OUTPUT:
            try:
                _put(kept, path, _get(cfg, path))
            except KeyError:
                pass
    return kept.get("train", {})


def data_key(cfg: Mapping, stage: str, chars: int) -> str:
    """The content key of a shared data stage's folder: a hash of the sections that shape it and
    every data stage before it, with each RUN leaf held at its schema default (so a retry setting
    moves no data, and the keys of configs written before the tags stay what they were), and what
    those stages derive from the config where they derive anything (`derived`)."""
    upto = DATA_STAGES[: DATA_STAGES.index(stage) + 1]
    names = sorted({name for s in upto for name in sections(s)})
    shaped = {name: copy.deepcopy(cfg[name]) for name in names}
    implied = {s: derived(cfg, s) for s in upto if derived(cfg, s)}
    if implied:
        shaped[DERIVED] = implied
    leaves = schema_leaves()
    for path in SETTINGS:
        if any(effect(path, s, cfg) == RUN for s in upto) and not any(effect(path, s, cfg) == OUTPUT for s in upto):
            if not leaves[path].declared.unset:
                _put(shaped, path, leaves[path].default)
    return hashlib.sha256(_canonical(shaped).encode()).hexdigest()[:chars]


# ------------------------------------------------------------------------------------------------
# docs/settings.md


def markdown_table() -> str:
    """docs/settings.md: every setting by section, with its type, default, the stages it reruns, those
    that read it only to run, and what it does."""
    lines = [
        "# Settings",
        "",
        "Made by `python -m kiln.config settings > docs/settings.md` from the section models in `kiln.config`",
        "(each setting is one declared field; a test keeps this file current). **reruns**: the stages whose",
        "outputs the setting changes; Snakemake reruns them, and what reads their outputs, when it changes.",
        "**read to run**: stages that read it only for how they run or show their work (logging, cadence,",
        "placement, retries): a change there reruns nothing. A default of `-` means unset unless given.",
        "With `tokenizer.kind: hf`, `pretokenize.fim.rate` (0 or above) and `pretokenize.repo_context` also rerun",
        "the tokenizer: they decide which special tokens the source's tokenizer gets appended (the roles the run",
        "uses, derived from them: kiln.config.settings.derived).",
        "A setting that turns one of the eval stage's batches on or off also reruns the rehearsal, which rehearses",
        "each batch on (`eval.infill_docs`, `eval.lm_eval.tasks`, `eval.humaneval.problems` and",
        "`eval.humaneval_infill.problems` set to 0 or [] or from it; `pretokenize.fim.rate` to or from 0 and",
        "`train.init_from` set or unset, which decide whether the run may infill: kiln.config.eval_switches).",
    ]
    section = None
    for path, leaf in schema_leaves().items():
        top = path.split(".")[0] if "." in path else "(top level)"
        if top != section:
            section = top
            lines += ["", f"## {top}", "", "| setting | type | default | reruns | read to run | what it does |"]
            lines.append("|---|---|---|---|---|---|")
        tags = leaf.declared.reads
        reruns = [s if tag == OUTPUT else f"{s} ({tag!r})" for s, tag in tags.stages.items() if tag != RUN]
        runs = [s for s, tag in tags.stages.items() if tag == RUN]
        about = " ".join(filter(None, [leaf.field.description, f"({tags.note})" if tags.note else ""]))
        cells = [
            f"`{path}`",
            type_name(leaf.field.annotation, whole="." not in path),
            _default_cell(path, leaf),
            ", ".join(reruns) or "-",
            ", ".join(runs) or "-",
        ]
        lines.append("| " + " | ".join(cells + [about.replace("|", "\\|")]) + " |")
    return "\n".join(lines) + "\n"


def _default_cell(path: str, leaf) -> str:
    """A leaf's default as docs/settings.md shows it; the top-level keys as a whole config has them."""
    if path in REQUIRED or leaf.field.is_required():
        return "required"
    if path == "seed":
        return f"`{DEFAULT_SEED}`"
    return "-" if leaf.declared.unset else f"`{json.dumps(leaf.default)}`"


def type_name(annotation, whole: bool = False) -> str:
    """A field's type in words: integer, number, text, true/false, one of its values, a list, a section."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (types.UnionType, typing.Union):
        names = [type_name(a) for a in args if a is not type(None)]
        if set(names) == {"integer", "number"}:  # kiln.config.declare.Number
            names = ["number"]
        # a top-level key (`whole`) is None only in a stage's part of the config, never in a run's
        return " \\| ".join(dict.fromkeys(names)) + (" \\| null" if type(None) in args and not whole else "")
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if origin in (dict, collections.abc.Mapping):
        return f"mapping to {type_name(args[1])}"
    names = {int: "integer", float: "number", str: "text", bool: "true/false"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))
