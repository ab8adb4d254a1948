"""Data parallelism for real: `torchrun --nproc_per_node 2` with gloo on CPU (tests/dist_worker.py).

2 ranks x micro-batch b give the loss sequence (and final weights) of 1 rank x 2b in fp32, with DDP
and with FSDP2, with and without gradient accumulation; ranks read disjoint rows; accumulation
skips the gradient all-reduce (no_sync) until the last micro-batch; per-block compilation under
DDP changes nothing; FSDP2 in bf16 (bf16 gathers, fp32 reduction) learns; a DDP checkpoint resumes
under FSDP2; greedy samples logged during training match one rank's; the smoke gate's checks pass on
2 ranks under DDP and FSDP2 (no collective left waiting). A run that loses a rank resumes on one
with twice the accumulation, and a one-rank run on two (DDP and FSDP2), training on the same rows
per step (batch hashes) with the same losses, across an epoch boundary: from full checkpoints and
from sharded ones (each rank's shards written by itself, async too, resharded on load), which eval's
load_weights reads whole. The launch goes through the multi-node form of the command (static
rendezvous at an explicit endpoint, nnodes 1), the single-node form runs in test_pipeline. Two
such launches of 2 ranks each, nnodes 2, make HSDP: a (2, 2) mesh, the losses of one rank.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from synthetic import TRAIN_ROWS, greedy_sampler, smoke_sections, train_sections, write_shards

from kiln.config.run_config import RunConfig
from kiln.model.build import load_model
from kiln.train import checkpoint, launch
from kiln.train.callbacks import default_callbacks
from kiln.train.trainer import Trainer

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
STEPS = 8
COMMON = dict(max_steps=STEPS, log_every=1, eval_every=4, checkpoint_every=STEPS // 2, keep_checkpoints=2)
GLOBAL_BATCH = 8 * 16  # tokens: 8 rows of seq_len 16 per optimizer step
# name -> (parallel, micro_batch per rank, extra train keys); every run has the same global batch.
RUNS = {
    "ddp": ("ddp", 4, {}),  # 2 ranks x 4 rows
    "ddp-accum": ("ddp", 2, {"activation_checkpointing": "full"}),  # 2 ranks x 2 micro-batches x 2 rows
    "fsdp-accum": ("fsdp", 2, {"activation_checkpointing": "selective", "checkpoint_format": "full"}),
    "fsdp-async": ("fsdp", 4, {"async_checkpoint": True}),  # sharded (auto under fsdp), written in the background
    "ddp-compiled": ("ddp", 2, {"compile": True}),  # each block compiled; accumulation as ddp-accum
    # seed 000's setting (fsdp + compile), and with selective recomputation: FSDP2 over compiled blocks
    "fsdp-compiled": ("fsdp", 2, {"compile": True}),
    "fsdp-compiled-recomputed": ("fsdp", 2, {"compile": True, "activation_checkpointing": "selective"}),
    "fsdp-bf16": ("fsdp", 4, {"precision": "bf16"}),  # bf16 gathers and fp32 reduction: runs, learns
    "fsdp-resumed": ("fsdp", 4, {}),  # resumes from ddp's mid-run (full) checkpoint, saves sharded
    # 12 steps of 8 of the 64 rows cross an epoch boundary after step 8; checkpoints at 6 and 12.
    "ddp-long": ("ddp", 4, {"max_steps": 12, "checkpoint_every": 6}),
    "ddp-long-from-one-rank": ("ddp", 4, {"max_steps": 12, "checkpoint_every": 6}),  # one-rank-long's step 6
    # ... under FSDP2, accum 2, from one-rank-long-sharded's step 6 (its shards resharded onto 2 ranks)
    "fsdp-long-from-one-rank": ("fsdp", 2, {"max_steps": 12, "checkpoint_every": 6}),
}
LONG = {"max_steps": 12, "checkpoint_every": 6}


def _resume_from(folder: Path, out: Path) -> Path:
    """out/checkpoints holding a copy of one checkpoint folder, as a rerun elsewhere would find it."""
    shutil.copytree(folder, out / "checkpoints" / folder.name)
    (out / "checkpoints" / "LATEST").write_text(folder.name + "\n")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _losses(out: Path) -> list[float]:
    return [r["loss"] for r in _records(out)]


def _assert_same_weights(a: Path, b: Path) -> None:
    ours, theirs = load_model(a).state_dict(), load_model(b).state_dict()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-5, msg=key)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One torchrun launch of every run in RUNS, and the 1-rank x 2b reference run in-process."""
    base = tmp_path_factory.mktemp("dist")
    shards = write_shards(base / "shards")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    # One rank x 2 micro-batches of 4 rows, before the launch: two ranks resume from its step 6.
    Trainer(RunConfig.of(train_sections(micro_batch=4, batch_tokens=GLOBAL_BATCH, **COMMON | LONG)), shards).fit(
        base / "one-rank-long", callbacks=default_callbacks()
    )
    Trainer(
        RunConfig.of(
            train_sections(micro_batch=4, batch_tokens=GLOBAL_BATCH, checkpoint_format="sharded", **COMMON | LONG)
        ),
        shards,
    ).fit(base / "one-rank-long-sharded", callbacks=default_callbacks())
    runs = []
    for name, (strategy, micro, extra) in RUNS.items():
        sections = train_sections(
            nproc_per_node=2, parallel=strategy, micro_batch=micro, batch_tokens=GLOBAL_BATCH, **COMMON | extra
        )
        spec = {"out": str(base / name), "sections": sections}
        if name == "fsdp-resumed":
            spec["resume_from"] = str(base / "ddp" / "checkpoints" / f"step-{STEPS // 2:07d}")
        if name.endswith("-from-one-rank"):
            source = "one-rank-long-sharded" if name.startswith("fsdp") else "one-rank-long"
            spec["resume_from"] = str(base / source / "checkpoints" / "step-0000006")
        runs.append(spec)
    plan = base / "plan.json"
    smoke = [
        {
            "out": str(base / f"smoke-{strategy}"),
            "sections": smoke_sections(train={"nproc_per_node": 2, "parallel": strategy, "micro_batch": 4}),
        }
        for strategy in ("ddp", "fsdp")
    ]
    sampling = train_sections(nproc_per_node=2, parallel="fsdp", micro_batch=4, batch_tokens=GLOBAL_BATCH, **COMMON)
    plan.write_text(
        json.dumps(
            {
                "shards": str(shards),
                "checks_out": str(base / "checks.json"),
                "runs": runs,
                "smoke": smoke,
                "sampling": sampling,
            }
        )
    )
    argv = launch.command(
        {"nproc_per_node": 2, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": f"127.0.0.1:{_free_port()}"},
        [str(TESTS / "dist_worker.py"), str(plan)],
    )
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]

    reference = base / "reference"
    Trainer(RunConfig.of(train_sections(micro_batch=8, batch_tokens=GLOBAL_BATCH, **COMMON)), shards).fit(
        reference, callbacks=default_callbacks(greedy_sampler)
    )
    # The node with rank 1 is lost after step 6: the run resumes on one rank with twice the accumulation.
    for name in ("ddp-long", "fsdp-accum", "fsdp-async"):
        step = 6 if name == "ddp-long" else STEPS // 2
        out = _resume_from(base / name / "checkpoints" / f"step-{step:07d}", base / f"one-rank-from-{name}")
        extra = LONG if name == "ddp-long" else {}
        Trainer(RunConfig.of(train_sections(micro_batch=4, batch_tokens=GLOBAL_BATCH, **COMMON | extra)), shards).fit(
            out, callbacks=default_callbacks()
        )
    torch.set_num_threads(before)
    return base, json.loads((base / "checks.json").read_text()), reference


def test_sampling_under_fsdp_decodes_the_same_tokens_and_stops_together_on_every_rank(launched):
    """Each rank sampled with its own seed (tests/dist_worker.py check_sampling_agrees): the ranks
    still returned (no hang) with identical rows, some of them cut short by a stop id."""
    _, checks, _ = launched
    rank0, rank1 = checks["fsdp_samples"]
    assert checks["fsdp_sampled"] and rank0 == rank1
    assert any(len(row["completion"]) < 12 for row in rank0)  # a stop came before max_new_tokens


def test_ddp_with_compiled_blocks_turns_off_dynamos_graph_splitting(launched):
    """kiln.train.parallel: each block is compiled whole (fullgraph), and DDPOptimizer, which would cut
    those graphs at bucket boundaries, is off once a compiled model is wrapped in DDP."""
    _, checks, _ = launched
    assert checks["ddp_compiled_blocks_unsplit"]


def test_launch_ran_two_ranks_that_read_disjoint_rows(launched):
    _, checks, _ = launched
    assert checks["world"] == 2
    assert checks["disjoint"] and checks["rows_covered"] == TRAIN_ROWS


def test_accumulation_skips_the_all_reduce_until_the_last_micro_batch(launched):
    _, checks, _ = launched
    assert checks["local_differ"], "no_sync still averaged the gradients"
    assert checks["synced_equal"] and checks["synced_is_mean"]


def test_ddp_broadcasts_no_buffers_before_a_forward(launched):
    """kiln.train.parallel wraps DDP without the per-forward buffer broadcast (the RoPE tables are
    derived, not trained: broadcasting them every step is NCCL traffic for nothing)."""
    _, checks, _ = launched
    assert checks["buffers_kept"], "rank 0's buffers overwrote rank 1's in the forward"


@pytest.mark.parametrize(
    "name",
    ["ddp", "ddp-accum", "fsdp-accum", "ddp-compiled", "fsdp-compiled", "fsdp-compiled-recomputed", "fsdp-async"],
)
def test_two_ranks_match_one_rank_with_twice_the_batch(launched, name):
    base, _, reference = launched
    wrapped = json.loads((base / name / "result.json").read_text())
    assert (wrapped["ddp"], wrapped["sharded"]) == ((True, False) if name.startswith("ddp") else (False, True))
    want = _losses(reference)
    assert len(want) == STEPS
    assert _losses(base / name) == pytest.approx(want, abs=1e-5, rel=0)
    ours, theirs = load_model(base / name).state_dict(), load_model(reference).state_dict()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["ddp", "fsdp-accum"])
def test_samples_during_training_match_one_rank(launched, name):
    # Every rank decodes (an FSDP forward is collective); rank 0 logs what one rank would have.
    base, _, reference = launched
    samples = (base / name / "samples.jsonl").read_text()
    assert samples == (reference / "samples.jsonl").read_text()
    assert [json.loads(line)["step"] for line in samples.splitlines()] == [4, 4, 8, 8]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_smoke_gate_under_two_ranks(launched, strategy):
    base, _, _ = launched
    report = json.loads((base / f"smoke-{strategy}" / "report.json").read_text())
    assert [c["name"] for c in report["checks"] if not c["passed"]] == []
    assert report["world"] == 2 and report["batch"]["world"] == 2 and report["probe"]["tokens_per_s"] > 0


def test_fsdp_in_bf16_learns(launched):
    base, _, reference = launched
    losses = _losses(base / "fsdp-bf16")
    assert losses[-1] < losses[0] - 0.5
    assert losses == pytest.approx(_losses(reference), abs=0.1)  # bf16 rounding, not another run


def test_ddp_checkpoint_resumes_under_fsdp(launched):
    base, _, reference = launched
    resumed = json.loads((base / "fsdp-resumed" / "result.json").read_text())
    assert resumed["losses"] == pytest.approx(_losses(reference)[STEPS // 2 :], abs=1e-5, rel=0)
    ours, theirs = load_model(base / "fsdp-resumed").state_dict(), load_model(reference).state_dict()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-5, msg=key)


def test_two_and_one_rank_train_on_the_same_rows_per_step(launched):
    base, _, _ = launched
    two, one = _records(base / "ddp-long"), _records(base / "one-rank-long")
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, 13))
    assert len({r["batch_hash"] for r in one}) == 12
    assert [r["batch_hash"] for r in two] == [r["batch_hash"] for r in one]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], abs=1e-5, rel=0)


@pytest.mark.parametrize(
    "resumed, uninterrupted, first",
    [
        ("one-rank-from-ddp-long", "ddp-long", 7),  # 2 ranks -> 1 rank x 2 micro-batches, across the epoch end
        ("one-rank-from-fsdp-accum", "fsdp-accum", STEPS // 2 + 1),  # an FSDP2 checkpoint on one rank
        ("one-rank-from-fsdp-async", "fsdp-async", STEPS // 2 + 1),  # ... a sharded one, written async
        ("ddp-long-from-one-rank", "one-rank-long", 7),  # 1 rank -> 2 ranks under DDP
        ("fsdp-long-from-one-rank", "one-rank-long", 7),  # ... and under FSDP2, from one rank's shards
    ],
)
def test_a_run_resumed_on_another_rank_count_continues_the_same_rows(launched, resumed, uninterrupted, first):
    base, _, _ = launched
    ours, theirs = _records(base / resumed), _records(base / uninterrupted)
    ours = [r for r in ours if r["step"] >= first]
    theirs = [r for r in theirs if r["step"] >= first]
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] and ours
    assert [r["batch_hash"] for r in ours] == [r["batch_hash"] for r in theirs]
    assert [r["loss"] for r in ours] == pytest.approx([r["loss"] for r in theirs], abs=1e-5, rel=0)
    _assert_same_weights(base / resumed, base / uninterrupted)


@pytest.mark.parametrize(
    "name, step",
    [
        ("fsdp-resumed", STEPS // 2),  # a full checkpoint (ddp's) resumed by 2 ranks
        ("ddp-long-from-one-rank", 6),  # ... written by one rank
        ("fsdp-long-from-one-rank", 6),  # a sharded one: state.pt without model and optimizer
    ],
)
def test_a_resume_hashes_the_checkpoint_once_and_every_rank_maps_it(launched, name, step):
    """Rank 0 alone hashes the files of the checkpoint a 2-rank run resumes, each once, and tells rank 1
    which checkpoint it is; every rank memory-maps its state.pt, so the ranks of a node share one copy
    in the page cache instead of each reading the whole state into its own memory (issue 18: 8 ranks
    x 12.5 GB for a 1B in the full format). The worker records both (dist_worker.py)."""
    base = launched[0]
    ranks = [json.loads((base / name / f"resume-rank{r}.json").read_text()) for r in (0, 1)]
    folder = (base / name / "checkpoints" / f"step-{step:07d}").resolve()
    files = json.loads((folder / checkpoint.MANIFEST).read_text())["files"]
    assert sorted(h for h in ranks[0]["hashed"] if h.startswith(f"{folder}/")) == sorted(str(folder / f) for f in files)
    assert ranks[1]["hashed"] == []  # rank 1 writes no manifest either
    for rank in ranks:
        (resumed,) = rank["resumed"]
        if resumed["sharded"]:  # model and optimizer come from the shards, each rank reading its part
            assert resumed["tensors"] == 0
        else:
            assert resumed["tensors"] > 0 and resumed["mapped"] == resumed["tensors"]


def test_sharded_checkpoints_hold_each_ranks_own_shards_and_eval_reads_them_whole(launched):
    base, _, reference = launched
    last = f"step-{STEPS:07d}"
    for name in ("fsdp-async", "fsdp-resumed"):  # sharded under FSDP2 (auto), async or not
        folder = base / name / "checkpoints" / last
        assert sorted(p.name for p in (folder / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert "model" not in torch.load(folder / "state.pt", weights_only=False)  # only in the shards
        weights, at = checkpoint.load_weights(folder)  # one process, no process group: whole tensors
        assert at["step"] == STEPS
        final = load_model(base / name).state_dict()  # model.safetensors, gathered at the end
        assert weights.keys() == final.keys()
        for key in final:
            assert weights[key].equal(final[key]), key
    assert (base / "one-rank-long-sharded" / "checkpoints" / "step-0000006" / "shards").is_dir()
    for name in ("ddp", "fsdp-accum", "one-rank-long"):  # DDP's default, and asked for: one full file
        assert not list((base / name / "checkpoints").glob("*/shards"))


@pytest.fixture(scope="module")
def hsdp(launched):
    """Two torchruns of 2 ranks each, nnodes 2 on this machine (2 "nodes"), with FSDP: HSDP. Its
    mid-run (sharded) checkpoint then resumes on one rank."""
    base, _, _ = launched
    shards = base / "shards"
    out = base / "hsdp"
    sections = train_sections(
        nproc_per_node=2,
        nnodes=2,
        parallel="fsdp",
        micro_batch=2,
        batch_tokens=GLOBAL_BATCH,
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        **COMMON,
    )
    plan = base / "hsdp-plan.json"
    plan.write_text(
        json.dumps(
            {
                "shards": str(shards),
                "checks_out": str(base / "hsdp-checks.json"),
                "runs": [{"out": str(out), "sections": sections}],
            }
        )
    )
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    nodes = [
        subprocess.Popen(
            launch.command(sections["train"] | {"node_rank": rank}, [str(TESTS / "dist_worker.py"), str(plan)]),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    for node in nodes:
        output, _ = node.communicate(timeout=600)
        assert node.returncode == 0, output[-5000:]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    resumed = _resume_from(out / "checkpoints" / f"step-{STEPS // 2:07d}", base / "one-rank-from-hsdp")
    Trainer(RunConfig.of(train_sections(micro_batch=8, batch_tokens=GLOBAL_BATCH, **COMMON)), shards).fit(
        resumed, callbacks=default_callbacks()
    )
    torch.set_num_threads(before)
    return out, resumed


def test_fsdp_on_two_nodes_is_hsdp_with_the_losses_of_one_rank(launched, hsdp):
    base, _, reference = launched
    out, resumed = hsdp
    result = json.loads((out / "result.json").read_text())
    # Sharded within a node, replicated across: parameters are DTensors on a (nodes, ranks per node) mesh.
    assert result["nnodes"] == 2 and result["sharded"]
    assert result["mesh"] == {"shape": [2, 2], "dims": ["replicate", "shard"], "placements": ["R", "S(0)"]}
    want = _losses(reference)
    assert _losses(out) == pytest.approx(want, abs=1e-5, rel=0)
    assert _losses(out) == pytest.approx(_losses(base / "fsdp-accum"), abs=1e-5, rel=0)  # 1-D FSDP2
    _assert_same_weights(out, reference)
    # Its checkpoint: one shard file per rank, read back onto one rank, which continues alike.
    assert len(list((out / "checkpoints" / f"step-{STEPS // 2:07d}" / "shards").glob("*.distcp"))) == 4
    assert [r["loss"] for r in _records(resumed)] == pytest.approx(want[STEPS // 2 :], abs=1e-5, rel=0)
    _assert_same_weights(resumed, reference)


def _two_ranks(script_args: list[str], timeout_s: float = 300, **env_vars: str) -> tuple[int | None, str]:
    """A script on 2 gloo ranks under kiln.train.launch's torchrun: (exit code, output). Past
    timeout_s the launch and both ranks are killed and the code is None."""
    argv = launch.command(
        {"nproc_per_node": 2, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": f"127.0.0.1:{_free_port()}"},
        script_args,
    )
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    env.update(env_vars)
    job = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        output, _ = job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # a hang: end the launch and both ranks
        os.killpg(job.pid, signal.SIGKILL)
        return None, job.communicate()[0]
    return job.returncode, output


def _launch_rank_worker(plan: Path, timeout_s: float = 300) -> tuple[int | None, str]:
    """tests/rank_worker.py (one training run) on 2 gloo ranks."""
    return _two_ranks([str(TESTS / "rank_worker.py"), str(plan)], timeout_s)


def test_an_oom_on_one_rank_in_the_smoke_probe_ends_every_rank_with_the_same_error(tmp_path):
    """The smoke stage's script on 2 gloo ranks, rank 1 out of memory at probe step 3 (KILN_FAULT):
    rank 0, by then in that step's gradient all-reduce, learns of it (kiln.gate.oom) and both end
    at once with the same error naming the rank, not after train.collective_timeout_s (300 s here,
    beyond the launch's 120 s allowance) with one that says nothing of memory."""
    shards = write_shards(tmp_path / "shards")
    sections = smoke_sections(train={"nproc_per_node": 2, "micro_batch": 4, "collective_timeout_s": 300})
    args = [str(REPO / "workflow" / "scripts" / "smoke.py"), "--params", json.dumps(sections), "--untracked", "{}"]
    code, output = _two_ranks(
        [*args, "--shards", str(shards), "--out", str(tmp_path / "smoke")], timeout_s=120, KILN_FAULT="oom@3:1"
    )
    assert code not in (None, 0), output[-3000:]
    error = "smoke: preflight FAILED: out of memory on rank 1 of 2 in the probe steps"
    assert output.count(error) == 2, output[-3000:]  # one line from each rank
    assert "KILN_FAULT=oom@3" in output and not (tmp_path / "smoke" / "report.json").exists()


def test_the_final_mirror_copy_outlasting_the_collective_timeout_ends_the_run_cleanly(tmp_path):
    """Rank 0 waits for the final checkpoint's copy off the node (train.checkpoint_mirror, a command
    that takes 6 s here) while rank 1 is done. That wait comes after both ranks have left the process
    group: were it inside fit, rank 1 would wait for rank 0 in the shutdown barrier and give up after
    train.collective_timeout_s (2 s), failing a run that trained fine."""
    shards = write_shards(tmp_path / "shards")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    plan = tmp_path / "plan.json"
    sections = train_sections(
        nproc_per_node=2,
        micro_batch=4,
        max_steps=4,
        checkpoint_every=4,
        collective_timeout_s=2,
        checkpoint_mirror=f"sleep 6 && cp -r {{src}} {mirror}/{{name}}",
    )
    plan.write_text(
        json.dumps(
            {
                "shards": str(shards),
                "out": str(tmp_path / "run"),
                "error_out": str(tmp_path / "error.txt"),
                "result_out": str(tmp_path / "result.json"),
                "sections": sections,
            }
        )
    )
    code, output = _launch_rank_worker(plan)
    assert code == 0, output[-3000:]
    assert json.loads((tmp_path / "result.json").read_text()) == {"steps": 4, "mirror_failures": 0}
    assert (mirror / "step-0000004" / "complete.json").is_file()


def _stalled_run(tmp_path: Path, step: int) -> tuple[int | None, str, Path]:
    """A 4-step run on 2 gloo ranks whose rank 1 sleeps 5 s (KILN_FAULT stall) as `step` starts, under
    a 2 s collective timeout and a 60 s first-step allowance: (exit code, output, the error file)."""
    plan = tmp_path / "plan.json"
    sections = train_sections(
        nproc_per_node=2, micro_batch=4, max_steps=4, collective_timeout_s=2, first_step_timeout_s=60
    )
    spec = {"shards": str(write_shards(tmp_path / "shards")), "out": str(tmp_path / "run"), "sections": sections}
    plan.write_text(json.dumps(spec | {"error_out": str(tmp_path / "error.txt")}))
    code, output = _two_ranks([str(TESTS / "rank_worker.py"), str(plan)], 300, KILN_FAULT=f"stall@{step}:5:1")
    return code, output, tmp_path / "error.txt"


def test_a_slow_first_step_has_its_own_allowance_and_a_slow_later_step_ends_the_run(tmp_path):
    """The first step's waits (a rank's compilation, here a 5 s stall) fall under
    train.first_step_timeout_s, not the 2 s train.collective_timeout_s that bounds every step after
    it: the same stall at step 3 ends the run with the error naming both keys."""
    code, output, _ = _stalled_run(tmp_path / "first", 1)
    assert code == 0, output[-3000:]
    code, output, error = _stalled_run(tmp_path / "third", 3)
    assert code not in (None, 0), output[-3000:]
    assert "waited more than train.collective_timeout_s = 2 s (train.first_step_timeout_s = 60 s" in error.read_text()


def test_a_stuck_rank_ends_the_job_within_the_collective_timeout(tmp_path):
    """Rank 1 sleeps for an hour instead of training; rank 0's first collective (the resume's: which
    checkpoint, if any, every rank continues; kiln.train.checkpoint.resume_state) gives up after
    train.first_step_timeout_s (2 s here, before any step) with an error naming the keys, and torchrun
    ends the job. Without the key passed to the process group, gloo would wait torch's default 30 min
    and the launch below would outlive its 300 s allowance."""
    shards = write_shards(tmp_path / "shards")
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "shards": str(shards),
                "out": str(tmp_path / "run"),
                "stuck_s": 3600,
                "error_out": str(tmp_path / "error.txt"),
                "sections": train_sections(
                    nproc_per_node=2, micro_batch=4, max_steps=4, collective_timeout_s=2, first_step_timeout_s=2
                ),
            }
        )
    )
    code, output = _launch_rank_worker(plan)
    assert code != 0, output[-3000:]
    error = (tmp_path / "error.txt").read_text()
    assert "waited more than train.collective_timeout_s = 2 s (train.first_step_timeout_s = 2 s" in error, output[
        -3000:
    ]
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""  # no step completed
