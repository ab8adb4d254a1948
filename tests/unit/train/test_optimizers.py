"""train.optimizer: adamw | muon (kiln.train.optim, kiln.train.muon): which parameters Muon takes, the
schedule on each optimizer's own base LR, a flagged step never applied, checkpoints and exact resume
(in process, and on 2 gloo ranks under DDP and FSDP2), the fingerprint, the memory and checkpoint
estimates, and config errors."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from synthetic import train_sections, write_shards
from train_stage import run

from kiln import config as kiln_config
from kiln.config import ConfigError
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.forecast import predict
from kiln.model.build import build_model, load_model
from kiln.plan.memory import Setting, estimate, layer_params, setting_of
from kiln.train import checkpoint, fingerprint, launch
from kiln.train import muon as kiln_muon
from kiln.train.muon import Muon, ns_cost, owners, rounds
from kiln.train.optim import build_optimizer, hidden_matrices
from kiln.train.schedule import lr_at
from kiln.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)

TESTS = Path(__file__).resolve().parents[2]
ROOT = TESTS.parent
MUON = {"optimizer": "muon", "muon_lr": 0.02, "muon_weight_decay": 0.01}
N = 8  # steps of the resumed runs, checkpoints at N/2 and N


def _train(**over) -> dict:
    return train_sections(**over)["train"]


def _section(**over) -> TrainSection:
    return TrainSection.of(_train(**over))


def _named(model: torch.nn.Module, params) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize(
    "model, expected",
    [
        (
            {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 16, "bias": True, "tie_embeddings": False},
            {f"blocks.{i}.{w}.weight" for i in range(2) for w in ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")},
        ),
        (
            {"family": "llama", "n_layer": 1, "n_head": 2, "n_kv_head": 1, "d_model": 16},
            {
                f"blocks.0.{w}.weight"
                for w in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")
            },
        ),
    ],
)
def test_muon_takes_the_blocks_matrices_and_adamw_everything_else(model, expected):
    m = build_model(model_config(model, 64, 8))
    opt = build_optimizer(m, _section(**MUON), "cpu", bf16=True)
    muon, adamw = opt.parts
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    assert _named(m, hidden_matrices(m)) == _named(m, muon.param_groups[0]["params"]) == expected
    rest = {p for g in adamw.param_groups for p in g["params"]}
    assert _named(m, rest) == {name for name, _ in m.named_parameters()} - expected  # embeddings, head, gains, biases
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert m.config.n_layer * layer_params(m.config)[0] == sum(
        p.numel() for p in hidden_matrices(m)
    )  # the estimator's count
    (only,) = build_optimizer(m, _section(), "cpu", bf16=True).parts  # adamw: one AdamW over everything, as before
    assert isinstance(only, torch.optim.AdamW) and len(only.param_groups) == 2


def _llama_and_grads(seed: int = 0):
    torch.manual_seed(seed)
    m = build_model(model_config({"family": "llama", "n_layer": 2, "n_head": 2, "n_kv_head": 1, "d_model": 32}, 64, 16))
    x = torch.randint(0, 64, (4, 17))
    return m, x


def _backward(m, x) -> None:
    m.zero_grad(set_to_none=True)
    m(x[:, :-1], x[:, 1:])[1].backward()


def test_an_unflagged_muon_step_is_torch_muons_bit_for_bit():
    m, x = _llama_and_grads()
    ref = copy.deepcopy(m)
    ours = Muon(hidden_matrices(m), lr=0.02, momentum=0.95, weight_decay=0.01)
    theirs = torch.optim.Muon(hidden_matrices(ref), lr=0.02, momentum=0.95, weight_decay=0.01)
    for _ in range(3):  # the same gradients each step (only the matrices move, in both)
        _backward(m, x), _backward(ref, x)
        ours.found_inf = torch.zeros(())
        ours.step(), theirs.step()
    for p, q in zip(hidden_matrices(m), hidden_matrices(ref)):
        assert torch.equal(p, q) and torch.equal(ours.state[p]["momentum_buffer"], theirs.state[q]["momentum_buffer"])


@pytest.mark.parametrize("stack_elements", [1, 2 * 32 * 32, 1 << 22])
def test_muon_orthogonalises_same_shaped_matrices_in_stacks_with_torchs_bits(monkeypatch, stack_elements):
    # one matrix a stack, two of the 32 x 32 a stack, every same-shaped matrix in one: torch's bits each time
    monkeypatch.setattr(kiln_muon, "STACK_ELEMENTS", stack_elements)
    m, x = _llama_and_grads()
    ref = copy.deepcopy(m)
    ours = Muon(hidden_matrices(m), lr=0.02, momentum=0.95)
    theirs = torch.optim.Muon(hidden_matrices(ref), lr=0.02, momentum=0.95)
    stacks = []
    real = kiln_muon._stacked_newton_schulz
    monkeypatch.setattr(kiln_muon, "_stacked_newton_schulz", lambda u, g: stacks.append(tuple(u.shape)) or real(u, g))
    _backward(m, x), _backward(ref, x)
    ours.step(), theirs.step()
    assert all(torch.equal(p, q) for p, q in zip(hidden_matrices(m), hidden_matrices(ref)))
    shapes = [tuple(p.shape) for p in hidden_matrices(m)]  # 2 layers of q, k, v, o, gate, up, down
    assert sum(n for n, *_ in stacks) == len(shapes) == 14
    assert all(n * r * c <= max(stack_elements, r * c) for n, r, c in stacks)
    if stack_elements == 1 << 22:
        assert sorted(stacks) == sorted((shapes.count(s), *s) for s in set(shapes))


def test_an_fp32_runs_muon_iterates_in_fp32(monkeypatch):
    # a run whose precision is fp32 (a CPU without fast bf16): the updates and Newton-Schulz in fp32, near
    # the bf16 iteration's result and not it (tests/muon_worker.py: DDP's and FSDP2's, against torch's)
    m, x = _llama_and_grads()
    in_bf16 = copy.deepcopy(m)
    stacks = []
    real = kiln_muon._stacked_newton_schulz
    monkeypatch.setattr(kiln_muon, "_stacked_newton_schulz", lambda u, g: stacks.append(u.dtype) or real(u, g))
    (ours, _), (theirs, _) = (
        build_optimizer(mm, _section(**MUON), "cpu", bf16=b).parts for mm, b in ((m, False), (in_bf16, True))
    )
    _backward(m, x), _backward(in_bf16, x)
    ours.step()
    assert ours.dtype == torch.float32 and set(stacks) == {torch.float32}
    theirs.step()
    fp32, bf16 = hidden_matrices(m), hidden_matrices(in_bf16)
    assert all(p.dtype == torch.float32 for p in fp32)
    assert all(torch.allclose(p, q, atol=1e-2) and not torch.equal(p, q) for p, q in zip(fp32, bf16))


def _snapshot(m, opt) -> list[torch.Tensor]:
    states = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    return [t.clone() for t in [*m.parameters(), *states]]


def test_a_flagged_step_leaves_muon_and_adamw_state_and_weights_bitwise_unchanged():
    m, x = _llama_and_grads()
    opt = build_optimizer(m, _section(**MUON), "cpu", bf16=True)
    for _ in range(2):
        _backward(m, x)
        opt.found_inf = torch.zeros(())
        opt.step()
    before = _snapshot(m, opt)
    _backward(m, x)
    hidden_matrices(m)[3].grad.view(-1)[5] = float("inf")  # a Muon matrix
    opt.found_inf = torch.ones(())  # what the trainer agrees on for such a step
    opt.step()
    after = _snapshot(m, opt)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    muon = opt.parts[0]
    assert all(torch.isfinite(muon.state[p]["momentum_buffer"]).all() for p in hidden_matrices(m))
    _backward(m, x)
    opt.found_inf = torch.zeros(())
    opt.step()  # the next good step applies
    assert not torch.equal(
        hidden_matrices(m)[3], before[[id(p) for p in m.parameters()].index(id(hidden_matrices(m)[3]))]
    )


def test_the_schedule_scales_each_optimizer_from_its_own_base_lr(shards):
    train = {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 2, "max_steps": 6, **MUON}
    trainer = Trainer(RunConfig.of(train_sections(**train)), shards)
    muon, adamw = trainer.optimizer.parts
    for step in range(5):
        _, _, lr = trainer.train_step()
        assert lr == lr_at(step, lr=1e-2, min_lr=1e-3, warmup_steps=2, max_steps=6)
        assert [g["lr"] for g in adamw.param_groups] == [lr, lr]  # exactly the schedule, as before
        assert muon.param_groups[0]["lr"] == pytest.approx(lr * 0.02 / 1e-2, rel=1e-12)


def test_the_optimizers_state_dict_is_torchs_form_and_round_trips():
    m, x = _llama_and_grads()
    opt = build_optimizer(m, _section(**MUON), "cpu", bf16=True)
    for _ in range(2):
        _backward(m, x)
        opt.step()
    saved = opt.state_dict()
    n = len(list(m.parameters()))
    assert sorted(i for g in saved["param_groups"] for i in g["params"]) == list(range(n)) == sorted(saved["state"])
    other, _ = _llama_and_grads(seed=1)
    again = build_optimizer(other, _section(**MUON), "cpu", bf16=True)
    again.load_state_dict(copy.deepcopy(saved))
    theirs = dict(zip([name for name, _ in other.named_parameters()], other.parameters()))
    for name, p in m.named_parameters():
        mine, loaded = opt.state[p], again.state[theirs[name]]
        assert mine.keys() == loaded.keys() and all(torch.equal(mine[k], loaded[k]) for k in mine), name
    (only,) = (adamw := build_optimizer(m, _section(), "cpu", bf16=True)).parts
    assert adamw.state_dict() == only.state_dict()  # AdamW alone: the dict a lone AdamW gave


def test_taking_another_optimizers_state_is_an_error_naming_both(shards, tmp_path):
    results = tmp_path / "results"
    run(
        RunConfig.of(train_sections(max_steps=3, checkpoint_every=3, log_every=3)), shards, results / "source" / "train"
    )
    sections = train_sections(max_steps=4, init_from={"run": "source", "optimizer": True}, **MUON)
    with pytest.raises(
        KilnError, match=r"train.init_from.optimizer: run .* holds adamw state, and this run's train.optimizer is muon"
    ):
        run(RunConfig.of(sections), shards, results / "x" / "train")


def _momenta(state: dict) -> dict:
    return {k: v["momentum_buffer"] for k, v in state["optimizer"]["state"].items() if "momentum_buffer" in v}


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_a_muon_run_resumes_bitwise_from_its_checkpoint(shards, tmp_path, fmt):
    sections = train_sections(
        max_steps=N, log_every=2, eval_every=4, checkpoint_every=N // 2, checkpoint_format=fmt, **MUON
    )
    full = tmp_path / "full"
    losses = run(RunConfig.of(copy.deepcopy(sections)), shards, full).losses
    out = tmp_path / "resumed"
    mid = f"step-{N // 2:07d}"
    shutil.copytree(full / "checkpoints" / mid, out / "checkpoints" / mid)
    (out / "checkpoints" / checkpoint.MARKER).write_text(mid + "\n")
    resumed = run(RunConfig.of(copy.deepcopy(sections)), shards, out).losses
    assert resumed == losses[len(losses) // 2 :]
    ours, theirs = load_model(out).state_dict(), load_model(full).state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    if fmt == "full":
        a, b = (checkpoint.load_full(o / "checkpoints" / f"step-{N:07d}") for o in (out, full))
        assert _momenta(a).keys() == _momenta(b).keys() and len(_momenta(a)) == 4  # qkv, proj, up, down
        assert all(torch.equal(_momenta(a)[k], _momenta(b)[k]) for k in _momenta(b))


def test_a_skipped_step_in_a_muon_run_applies_nothing(shards, tmp_path, monkeypatch):
    """KILN_FAULT inf_grad: the gradient norm is inf, clipping zeroes every gradient, and Muon given
    zero gradients would still move the weights by its momentum: the step must not happen."""
    monkeypatch.setenv("KILN_FAULT", "inf_grad@3")
    sections = train_sections(
        max_steps=4, log_every=1, checkpoint_every=1, keep_checkpoints=4, nonfinite={"action": "skip"}, **MUON
    )
    out = tmp_path / "run"
    run(RunConfig.of(sections), shards, out)
    two, three = (checkpoint.load_full(out / "checkpoints" / f"step-{s:07d}") for s in (2, 3))
    assert three["skipped"] == 1
    assert all(torch.equal(three["model"][k], two["model"][k]) for k in two["model"])
    assert all(torch.equal(_momenta(three)[k], _momenta(two)[k]) for k in _momenta(two))


def test_the_optimizer_is_part_of_the_fingerprint_and_muons_settings_only_under_muon(shards, tmp_path, caplog):
    adamw, muon = _train(), _train(**MUON)
    assert fingerprint.trajectory(adamw, 10) != fingerprint.trajectory(muon, 10)
    assert fingerprint.trajectory(adamw, 10) == fingerprint.trajectory(_train(muon_lr=0.5), 10)  # unread by adamw
    assert fingerprint.trajectory(muon, 10) != fingerprint.trajectory(_train(**MUON | {"muon_lr": 0.5}), 10)
    # An AdamW run's checkpoints are not continued by a Muon run: it starts over, naming why.
    out = tmp_path / "run"
    run(RunConfig.of(train_sections(max_steps=4, checkpoint_every=2, log_every=2)), shards, out)
    result = run(RunConfig.of(train_sections(max_steps=4, checkpoint_every=2, log_every=2, **MUON)), shards, out)
    assert len(result.losses) == 2 and "train.optimizer: 'adamw' in the checkpoint, 'muon' now" in caplog.text


def test_muon_keeps_one_moment_for_the_blocks_matrices_in_the_estimates():
    cfg = model_config({"family": "llama", "n_layer": 4, "n_head": 4, "d_model": 64}, 512, 32)
    hidden = cfg.n_layer * layer_params(cfg)[0]
    for s in (Setting(micro_batch=2), Setting(micro_batch=2, world=4, parallel="fsdp")):
        adamw, muon = estimate(cfg, s), estimate(cfg, Setting(**{**s.__dict__, "optimizer": "muon"}))
        shard = s.world if s.parallel == "fsdp" else 1
        assert adamw.parts["optimizer"] - muon.parts["optimizer"] == 4 * hidden // shard
        assert adamw.total - muon.total == 4 * hidden // shard
    assert setting_of(TrainSection.of(_train(**MUON))).optimizer == "muon"
    # kiln plan's checkpoint size: 4 bytes fewer per hidden weight
    raw = kiln_config.load(ROOT / "config" / "config.yaml")
    plans = [
        predict(kiln_config.validate(copy.deepcopy(raw) | {"train": raw["train"] | o}))
        for o in ({"optimizer": "adamw"}, MUON)
    ]
    model = model_config(raw["model"], raw["tokenizer"]["vocab_size"], raw["shard"]["seq_len"])
    assert plans[0]["checkpoint_bytes"] == 12 * model.num_params(non_embedding=False)
    assert plans[0]["checkpoint_bytes"] - plans[1]["checkpoint_bytes"] == 4 * model.n_layer * layer_params(model)[0]


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"optimizer": "sgd"}, "train.optimizer: Input should be 'adamw' or 'muon' (got 'sgd')"),
        ({"muon_lr": 0}, "train.muon_lr: Input should be greater than 0 (got 0)"),
        ({"muon_momentum": 1.0}, "train.muon_momentum: Input should be less than 1 (got 1.0)"),
        (
            {"muon_adjust_lr": "none"},
            "train.muon_adjust_lr: Input should be 'original' or 'match_rms_adamw' (got 'none')",
        ),
    ],
)
def test_bad_optimizer_settings_name_the_key(change, expected):
    raw = kiln_config.load(ROOT / "tests" / "configs" / "tiny.yaml")
    raw["train"] |= change
    with pytest.raises(ConfigError) as info:
        kiln_config.validate(raw)
    assert expected in str(info.value)


# ---------------------------------------------------------------------------------------------
# 2 gloo ranks (tests/muon_worker.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    base = tmp_path_factory.mktemp("muon-dist")
    shards = write_shards(base / "shards")
    common = dict(max_steps=N, log_every=1, eval_every=N, checkpoint_every=N // 2, batch_tokens=8 * 16, **MUON)
    runs = []
    for strategy in ("ddp", "fsdp"):  # fsdp: sharded checkpoints (auto)
        sections = train_sections(nproc_per_node=2, parallel=strategy, micro_batch=4, **common)
        runs.append({"out": str(base / strategy), "sections": sections})
        mid = base / strategy / "checkpoints" / f"step-{N // 2:07d}"
        runs.append({"out": str(base / f"{strategy}-resumed"), "sections": sections, "resume_from": str(mid)})
    plan = base / "plan.json"
    plan.write_text(json.dumps({"shards": str(shards), "checks_out": str(base / "checks.json"), "runs": runs}))
    argv = launch.command(
        {"nproc_per_node": 2, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": f"127.0.0.1:{_free_port()}"},
        [str(TESTS / "muon_worker.py"), str(plan)],
    )
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    reference = base / "one-rank"
    run(RunConfig.of(train_sections(micro_batch=8, **common)), shards, reference)
    return base, json.loads((base / "checks.json").read_text()), reference


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
@pytest.mark.process
def test_a_two_rank_muon_step_is_torch_muon_on_the_whole_matrices_sharing_newton_schulz(launched, layout, precision):
    _, checks, _ = launched
    check = checks[f"{layout} {precision}"]
    per_rank = check.pop("newton_schulz_per_rank")
    assert checks["world"] == 2
    assert check == {
        "step_is_torch_muon": True,
        "momentum_same": True,
        "flagged_step_unchanged": True,
        "matrices": 7,
        # what travelled to each owner and what it iterated in: the step's precision
        "newton_schulz_dtypes": ["torch.bfloat16" if precision == "bf16" else "torch.float32"],
        **({"sharded": True, "uneven": True} if layout == "fsdp" else {}),
    }
    # each matrix orthogonalised on one rank a step, each rank doing its share (owners: 3 and 4)
    assert per_rank == owner_counts([(32, 32)] * 4 + [(35, 32)] * 2 + [(32, 35)], 2) == [3, 4]


def owner_counts(shapes, world):
    owner = owners(shapes, world)
    return [owner.count(r) for r in range(world)]


def test_newton_schulz_is_shared_out_by_cost_deterministically():
    # a llama layer (q, k, v, o, gate, up, down) x 4, with GQA's smaller k and v
    shapes = [(64, 64), (16, 64), (16, 64), (64, 64), (176, 64), (176, 64), (64, 176)] * 4
    for world in (1, 2, 3, 8, 40):
        owner = owners(shapes, world)
        assert owner == owners(list(shapes), world) and len(owner) == len(shapes)
        assert all(0 <= o < world for o in owner)
        load = [sum(ns_cost(s) for s, o in zip(shapes, owner) if o == r) for r in range(world)]
        assert max(load) - min(load) <= max(map(ns_cost, shapes))
        # every matrix exactly once, each rank's in index order, round by round
        held = [i for r in rounds(owner, world) for i in r if i is not None]
        assert sorted(held) == list(range(len(shapes)))
        assert all(owner[i] == r for rnd in rounds(owner, world) for r, i in enumerate(rnd) if i is not None)
    assert owners(shapes, 1) == [0] * len(shapes)
    assert max(owner_counts(shapes, 40)) == 1  # more ranks than matrices: one each at most
    assert owners([(2, 3), (3, 2), (4, 4)], 2) == [1, 1, 0]  # the costliest first, ties to the lower rank
    assert ns_cost((3, 5)) == ns_cost((5, 3)) == 3 * 3 * (2 * 5 + 3)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.process
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_with_muon_and_resume_bitwise(launched, strategy):
    base, _, reference = launched
    full, resumed = base / strategy, base / f"{strategy}-resumed"
    assert json.loads((resumed / "result.json").read_text())["losses"] == _losses(full)[N // 2 :]
    ours, theirs = load_model(resumed).state_dict(), load_model(full).state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert (full / "checkpoints" / f"step-{N:07d}" / checkpoint.SHARDS).is_dir() == (strategy == "fsdp")
    # the same training as one rank with the whole batch, up to reduction order (bf16 Newton-Schulz
    # can turn a last-bit difference in a gradient into one in the update)
    assert _losses(full) == pytest.approx(_losses(reference), abs=2e-3)
    assert _losses(full)[-1] < _losses(full)[0] - 0.5
