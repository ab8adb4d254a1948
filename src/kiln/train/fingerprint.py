"""What a checkpoint must share with the run that resumes it, and, when it does not, which part differs.

The fingerprint is a small dict saved in every checkpoint:

  model         the resolved model config (shape, family, vocabulary, context)
  tokenizer     the sha256 of the tokenizer file the shards were made with (pretokenize records it in
                tokens/meta.json, the shard stage in its manifest; None for folders made before)
  shards        {split: {file: sha256}} from the shard manifest
  seed          the model seed, train.seed (initial weights, data order)
  train         every train setting that shapes the trajectory (optimiser, schedule, steps or
                budget, global batch, precision, ...), with the steps the run trains (`steps`: a
                budget's, from the smoke stage's plan)

What does not shape the trajectory stays out: the train settings kiln.config.settings tags RUN for the
train stage (logging, validation and checkpoint cadence, the rank layout and where it runs, the
micro-batch at equal global batch) and, for an AdamW run, Muon's. The data order is a function of the
global sample index (kiln.data.loader), so a run may resume on fewer or more ranks with the same
global batch and see the same rows per step. The same table gives the rules their params, so a
setting that reruns train is exactly one that restarts its trajectory.
"""

from __future__ import annotations

from typing import Mapping

from kiln.config import settings
from kiln.errors import KilnError

PARTS = ("model", "tokenizer", "shards", "seed", "train")


def trajectory(train: Mapping, steps: int, init_sha256: str | None = None) -> dict:
    """The train settings a checkpoint must share with the run that resumes it, the steps it trains
    and, for a run started from another model's weights (train.init_from), what those were. `train`
    is the validated dict (TrainSection.as_dict: dataclasses.asdict would add unset keys)."""
    own = dict(sorted(settings.trajectory(train).items())) | {"steps": steps}
    return own | ({"init_from_sha256": init_sha256} if init_sha256 else {})


def of_run(model: dict, manifest: dict, seed: int, train: dict) -> dict:
    """`train` is `trajectory(...)`'s dict."""
    shards = {split: {s["file"]: s["sha256"] for s in entry["shards"]} for split, entry in manifest["splits"].items()}
    return {
        "model": model,
        "tokenizer": manifest.get("tokenizer_sha256"),
        "shards": shards,
        "seed": seed,
        "train": train,
    }


def _short(value) -> str:
    return f"{value[:12]}…" if isinstance(value, str) and len(value) > 16 else repr(value)


def differences(saved: dict, current: dict) -> list[str]:
    """What differs between two fingerprints, one phrase per part, the checkpoint's value first."""
    out = []
    if saved.get("tokenizer") != current.get("tokenizer"):
        out.append(
            f"tokenizer: sha256 {_short(saved.get('tokenizer'))} in the checkpoint, "
            f"{_short(current.get('tokenizer'))} now"
        )
    old_shards, new_shards = saved.get("shards", {}), current.get("shards", {})
    for split in sorted(set(old_shards) | set(new_shards)):
        old, new = old_shards.get(split, {}), new_shards.get(split, {})
        if old == new:
            continue
        changed = [f for f in sorted(set(old) & set(new)) if old[f] != new[f]]
        bits = [f"{f} sha256 {_short(old[f])} in the checkpoint, {_short(new[f])} now" for f in changed[:3]]
        if len(changed) > 3:
            bits.append(f"{len(changed) - 3} more changed")
        if set(new) - set(old):
            bits.append(f"{len(set(new) - set(old))} shard(s) added ({', '.join(sorted(set(new) - set(old))[:3])})")
        if set(old) - set(new):
            bits.append(f"{len(set(old) - set(new))} shard(s) gone ({', '.join(sorted(set(old) - set(new))[:3])})")
        out.append(f"{split} shards: " + "; ".join(bits))
    old_model, new_model = saved.get("model", {}), current.get("model", {})
    for key in sorted(set(old_model) | set(new_model)):
        if old_model.get(key) != new_model.get(key):
            out.append(f"model.{key}: {old_model.get(key)!r} in the checkpoint, {new_model.get(key)!r} now")
    if saved.get("seed") != current.get("seed"):
        out.append(f"seed: {saved.get('seed')} in the checkpoint, {current.get('seed')} now")
    old_train, new_train = saved.get("train", {}), current.get("train", {})
    for key in sorted(set(old_train) | set(new_train)):
        if old_train.get(key) != new_train.get(key):
            where = {"steps": "steps trained", "init_from_sha256": "train.init_from's weights (sha256)"}.get(
                key, f"train.{key}"
            )
            out.append(f"{where}: {_short(old_train.get(key))} in the checkpoint, {_short(new_train.get(key))} now")
    for part in sorted((set(saved) | set(current)) - set(PARTS)):  # parts of an older Kiln's fingerprint
        out.append(
            f"{part}: only in {'the checkpoint' if part in saved else 'this run'} (a checkpoint of an older Kiln)"
        )
    return out


def require_same(saved: dict | str, current: dict | str, where: str, root) -> None:
    """A KilnError naming `where` (the checkpoint file) and each part that differs, unless the two
    fingerprints are equal. A string is a digest (a checkpoint from before the parts were saved)."""
    if saved == current:
        return
    if isinstance(saved, dict) and isinstance(current, dict):
        what = "; ".join(differences(saved, current)) or "fingerprint parts differ"
    else:
        what = "one is a bare digest (a checkpoint from an older Kiln): model, data, seed or training settings changed"
    raise KilnError(
        f"{where}: checkpoint fingerprint does not match this run's: {what}; delete {root} to "
        "start over, or restore what changed"
    )
