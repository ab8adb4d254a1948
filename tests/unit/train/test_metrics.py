"""FLOPs per token, the peak table, the throughput meter and the metrics file."""

import json

import pytest
import torch

from kiln import layout
from kiln.config.models import model_config
from kiln.errors import KilnError
from kiln.model.build import build_model
from kiln.plan.anchors import SEED_000_LOG
from kiln.plan.peaks import gpu_of, peak_flops_of
from kiln.plan.tables import format_eta
from kiln.train.metrics import MetricsSink, Throughput, flops_per_token, flops_per_token_torchtitan, peak_flops


def _meta_model(flavour: str, vocab: int, seq_len: int):
    with torch.device("meta"):
        return build_model(model_config({"flavour": flavour}, vocab, seq_len))


def test_flops_per_token_is_6n_plus_the_attention_term():
    gpt2 = _meta_model("gpt2-124m", 50257, 1024)
    # N leaves out the 1024 x 768 position table; the tied token table is the head, so it stays.
    n = 124_439_808 - 1024 * 768
    assert flops_per_token(gpt2) == 6 * n + 12 * 12 * 12 * 64 * 1024
    llama = _meta_model("llama3.2-1b", 32768, 8192)
    assert flops_per_token(llama) == 6 * 1_040_254_976 + 12 * 16 * 32 * 64 * 8192


@pytest.mark.parametrize(
    "name,tflops,gib",
    [
        ("NVIDIA H100 80GB HBM3", 989, 80),
        ("NVIDIA H100 PCIe", 756, 80),
        ("NVIDIA H100 NVL", 835, 94),
        ("NVIDIA H200", 989, 141),
        ("NVIDIA H200 NVL", 835, 141),
        ("NVIDIA A100-SXM4-80GB", 312, 80),
        ("NVIDIA A100-SXM4-40GB", 312, 40),
        ("NVIDIA B200", 2250, 180),
        ("NVIDIA L40S", 362, 48),
        ("NVIDIA L40", 181, 48),
        ("NVIDIA L4", 121, 24),
        ("NVIDIA A10", 125, 24),
        ("NVIDIA GeForce RTX 5090", 209.5, 32),
        ("NVIDIA GeForce RTX 4090", 165.2, 24),
        ("NVIDIA GeForce RTX 3090 Ti", 80, 24),
        ("NVIDIA GeForce RTX 3080 Ti", 68.2, 12),
        ("NVIDIA GeForce RTX 3080", 59.5, 10),
        ("Tesla V100-SXM2-16GB", None, None),
    ],
)
def test_peak_table(name, tflops, gib):
    """By the name CUDA reports; a longer name wins over its prefix (H200 NVL, A100 40GB, L40S, 3080 Ti)."""
    assert peak_flops_of(name) == (tflops * 1e12 if tflops else None)
    assert (gpu_of(name).memory_gib if gib else gpu_of(name)) == gib


def test_no_peak_and_so_no_mfu_on_cpu():
    assert peak_flops(torch.device("cpu")) is None
    assert Throughput(1e9, None, 1).rates(1000.0) == {"tokens_per_s": 1000.0, "tflops": 1.0, "mfu": None}


def test_mfu_is_per_device_flops_over_the_peak():
    # Seed 000's log line: 55,314 tokens/s per H100 on Llama-3.2-1B at seq 8192 -> 52.9% under this count.
    flops, tps = flops_per_token(_meta_model("llama3.2-1b", 32768, 8192)), SEED_000_LOG.tokens_per_s_per_gpu
    rates = Throughput(flops, 989e12, world=2).rates(2 * tps)
    assert rates["mfu"] == pytest.approx(0.529, abs=0.001)
    assert rates["tflops"] == pytest.approx(flops * tps / 1e12)


def test_torchtitans_count_halves_attention_and_leaves_the_tied_embedding_out():
    llama = _meta_model("llama3.2-1b", 32768, 8192)
    assert flops_per_token_torchtitan(llama) == 6 * (1_040_254_976 - 32768 * 2048) + 6 * 16 * 32 * 64 * 8192
    gpt2 = model_config({"flavour": "gpt2-124m"}, 50304, 1024)
    untied = model_config({"flavour": "gpt2-124m", "tie_embeddings": False}, 50304, 1024)
    assert gpt2.flops_per_token() - gpt2.flops_per_token_torchtitan() == 6 * 50304 * 768 + 6 * 12 * 12 * 64 * 1024
    # untied, the token table is out of both counts and the head in both: only attention differs
    assert untied.flops_per_token() - untied.flops_per_token_torchtitan() == 6 * 12 * 12 * 64 * 1024


def test_mfu_under_both_counts_reads_what_the_seeds_torchtitan_log_printed():
    """Seed 000's log: 55,314 tokens/s per H100 -> "mfu: 41.66%" (torchtitan); 52.9% under Kiln's."""
    llama = _meta_model("llama3.2-1b", 32768, 8192)
    meter = Throughput(flops_per_token(llama), 989e12, 1, flops_per_token_torchtitan(llama))
    rates = meter.rates(SEED_000_LOG.tokens_per_s_per_gpu)
    assert rates["mfu"] == pytest.approx(0.529, abs=0.001)
    assert rates["mfu_torchtitan"] == pytest.approx(0.4166, abs=0.0005)


def test_time_paused_in_a_window_is_left_out_of_its_rate():
    now = [0.0]
    meter = Throughput(1.0, None, 1, clock=lambda: now[0])
    now[0] = 5.0
    meter.window(500)  # the first window (compilation): reported, not in the steady rate
    now[0] += 2.0
    with meter.paused():  # a checkpoint save
        now[0] += 100.0
    now[0] += 2.0
    assert meter.window(400)["tokens_per_s"] == 100.0  # 400 tokens in 4 s of training
    with meter.paused():  # validation between windows
        now[0] += 50.0
    now[0] += 1.0
    assert meter.window(100)["tokens_per_s"] == 100.0
    assert meter.steady_tokens_per_s == 100.0


def test_throughput_leaves_the_first_window_out_of_the_steady_rate():
    meter = Throughput(1.0, None, 1)
    meter.window(10**9)  # a first window that cost compilation: not counted
    meter.window(1000)
    assert meter.timed_tokens == 1000
    lone = Throughput(1.0, None, 1)
    lone.window(500, last=True)  # ...unless it is the only one
    assert lone.timed_tokens == 500


def test_format_eta():
    assert format_eta(59) == "0m59s" and format_eta(3600 + 120) == "1h02m"


def test_metrics_file_drops_records_past_the_resume_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (10, 20, 30)))
    sink = MetricsSink(path, {"mode": "disabled"}, {}, resume_step=20)
    sink.log({"step": 30, "loss": 0.5})
    sink.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 10, "loss": 1.0},
        {"step": 20, "loss": 1.0},
        {"step": 30, "loss": 0.5},
    ]


def test_metrics_file_torn_last_line_is_dropped_on_resume(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in (10, 20, 30)]
    path.write_text("\n".join(lines) + "\n" + '{"step": 40, "lo')  # killed mid-write
    MetricsSink(path, {"mode": "disabled"}, {}, resume_step=30).close()
    assert path.read_text().splitlines() == lines
    assert "dropped its last line, torn by a kill mid-write" in caplog.text
    # A bad line before the last one is damage, not a kill: an error naming the file and line.
    path.write_text(lines[0] + "\n" + "garbage\n" + lines[1] + "\n")
    with pytest.raises(KilnError, match=r"metrics.jsonl: line 2 is not JSON: 'garbage'"):
        MetricsSink(path, {"mode": "disabled"}, {}, resume_step=30)


def test_a_resumed_sink_continues_the_same_wandb_run_and_a_set_aside_trajectory_takes_its_id(tmp_path, monkeypatch):
    """wandb offline, as the default config writes it: the second sink in the same train folder (a job
    resumed after a preemption) opens the first one's W&B run; once the trajectory is set aside
    (kiln.train.resume: a restart from step 0), the next sink opens a new one."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    train_dir = tmp_path / "train"
    cfg = {"mode": "offline", "project": "kiln-test"}

    def one_job(resume_step: int) -> str:
        sink = MetricsSink(train_dir / layout.METRICS, cfg, {"train": {}}, resume_step=resume_step)
        sink.log({"step": resume_step + 1, "loss": 1.0})
        run_id = sink.wandb.id
        sink.close()
        return run_id

    first = one_job(0)
    assert (train_dir / layout.WANDB / layout.WANDB_ID).read_text().strip() == first
    assert one_job(1) == first
    # Two jobs, two offline folders, one run: each holds run-<id>.wandb, which `wandb sync` files under
    # that id. (Jobs within one second get folders named offline-run-<time>-<id> and ...-<id>-1.)
    offline = sorted((train_dir / layout.WANDB).glob("offline-run-*"))
    assert len(offline) == 2
    assert [sorted(f.name for f in folder.glob("run-*.wandb")) for folder in offline] == [[f"run-{first}.wandb"]] * 2

    moved = layout.set_aside(train_dir)
    assert (moved / layout.WANDB / layout.WANDB_ID).read_text().strip() == first
    assert one_job(0) != first
