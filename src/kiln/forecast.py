"""`kiln plan`: price a run before anything is paid for.

The run's config is resolved exactly as `snakemake --configfile ... --config ...` resolves it; its
model's FLOPs per token come from the shape (ModelConfig.flops_per_token) and throughput is the
config's expected MFU x the GPU's dense bf16 peak x the ranks (plan.gpu, plan.mfu). Everything else
(tokens, steps, time, GPU-hours, cost, disk) is the smoke stage's plan, built by the same function
(kiln.plan.steps.build_plan), which replaces this prediction with a measurement once the smoke stage has run on the real hardware.
Memory per GPU is kiln.plan.memory's estimate of a step's peak at the config's micro-batch, precision,
activation checkpointing and parallelism (compiled, as train runs on a GPU), held against plan.gpu's
memory (kiln.plan.peaks): whether it fits, and when it does not, what to change.
The eval is priced beside training (kiln.eval.sizes): its `auto` sizes as a GPU resolves them, its
seconds and its share of the train stage.
Torch-free: it runs on a login node in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterable

from kiln import config as kiln_config
from kiln.config import settings
from kiln.config.batch import split_batch
from kiln.config.data_sections import TokenizerSection
from kiln.config.eval_switches import fim_trained
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.tokenizer import padded_vocab_size
from kiln.errors import KilnError
from kiln.eval import sizes
from kiln.layout import Layout
from kiln.plan import autofit
from kiln.plan.decode import Machine
from kiln.plan.memory import fit_report, optimizer_state_bytes, setting_of
from kiln.plan.peaks import GPU, planned_gpu
from kiln.plan.rehearsal import plan_rows
from kiln.plan.steps import StageTimes, build_plan
from kiln.plan.tables import aligned, render_plan

# Token counts of tiktoken's named encodings (tiktoken's own n_vocab), so a run on one of them is
# priced without fetching its ranks file.
TIKTOKEN_VOCAB = {"gpt2": 50257, "r50k_base": 50257, "p50k_base": 50281, "cl100k_base": 100277, "o200k_base": 200019}
ADAMW_BYTES_PER_PARAM = 4 + 4 + 4  # fp32 weights + exp_avg + exp_avg_sq: an AdamW run's checkpoint (muon: less)
# Text bytes a token, for a disk figure when the config gives no token count: ~3.6 for Python on
# seed 000's 32k vocabulary, ~4.8 for GPT-2's on FineWeb-Edu (their configs); the lower counts more
# tokens, so more disk.
TEXT_BYTES_PER_TOKEN = 4


def model_vocab(tokenizer: TokenizerSection, uses: Iterable[str] = SPECIAL_TOKENS) -> int:
    """The embedding rows the run's model will have, from the tokenizer section and (kind hf) the roles
    the run uses (kiln.config.settings.derived)."""
    if tokenizer.kind == "train":
        return padded_vocab_size(tokenizer.vocab_size)
    if tokenizer.kind == "tiktoken" and tokenizer.path is None and tokenizer.encoding in TIKTOKEN_VOCAB:
        return padded_vocab_size(TIKTOKEN_VOCAB[tokenizer.encoding] + len(SPECIAL_TOKENS))
    from kiln.data.tokenizer import id_space

    if tokenizer.kind == "hf":
        from kiln.data.tokenizer_build import hf_tokenizer

        return padded_vocab_size(id_space(hf_tokenizer(tokenizer.path, uses)[0]))
    from kiln.data.tokenizer_build import prebuilt_tokenizer  # a tokenizer.json, a .tiktoken file, an encoding

    return padded_vocab_size(id_space(prebuilt_tokenizer(tokenizer)))


def data_disk(run: RunConfig, vocab: int) -> dict[str, int | None]:
    """Bytes the data stages leave on disk, by stage: the download (kiln.data.raw's zstd parquet, at
    most the sources' text budgets, download.sources[].max_bytes), the pretokenized ids (train.bin,
    val.bin) and the shards (the same ids again, in rows): every token is stored twice. None where
    the config does not bound it."""
    sources, pre = run.download.sources, run.pretokenize
    raw = sum(s.max_bytes for s in sources) if all(s.max_bytes for s in sources) else None
    if pre.train_tokens:
        tokens = pre.train_tokens + pre.val_tokens
    else:  # every document
        tokens = raw // TEXT_BYTES_PER_TOKEN if raw else None
    itemsize = 2 if vocab <= 2**16 else 4  # kiln.data.token_plan.token_dtype
    ids = None if tokens is None else tokens * itemsize
    return {"raw": raw, "pretokenized": ids, "shards": ids}


def model_of(cfg: dict, run: RunConfig):
    """The run's ModelConfig before its data exists: the tokenizer section's vocabulary, shard.seq_len."""
    uses = settings.derived(cfg, "tokenizer").get("roles", SPECIAL_TOKENS)
    return model_config(run.model.as_dict(), vocab_size=model_vocab(run.tokenizer, uses), seq_len=run.shard.seq_len)


def eval_price(run: RunConfig, model, gpu: GPU, train_s: float) -> dict:
    """The eval's sizes as a GPU resolves them and their price (kiln.eval.sizes): {"sizes", "s", "share"
    of the train stage's time, benchmarks' parts}. A run trained without FIM from random weights is
    priced without infilling, which its eval does not run (kiln.eval.infill.not_run_reason; from the
    config alone, as the rehearsal decides it: kiln.config.eval_switches.fim_trained)."""
    machine = Machine.of(gpu, run.plan.mfu)
    priced = run.eval
    no_fim = not fim_trained(run.as_dict())
    if no_fim:
        priced = priced.replace(humaneval_infill=priced.humaneval_infill.replace(problems=0))
    samples = sizes.samples_within(priced, model, machine, train_s)
    resolved = sizes.resolve(priced, on_gpu=True, samples=samples)
    cost = sizes.price(resolved, model, machine)
    about = sizes.describe(resolved)
    if no_fim:
        about = about.replace("infilling off", "no infilling (trained without FIM)")
    return cost | {"sizes": about, "share": cost["s"] / train_s if train_s > 0 else None}


def in_loop_price(run: RunConfig, model, gpu: GPU, max_steps: int, train_s: float) -> dict | None:
    """eval.in_loop's HumanEval slice priced as the eval's code evals are (kiln.eval.sizes), at each of
    its steps (every `every`, and the last); None when it is off. Its time is the train stage's."""
    in_loop = run.eval.in_loop
    if not in_loop.every:
        return None
    machine = Machine.of(gpu, run.plan.mfu)
    slice_ = run.eval.replace(
        humaneval=run.eval.humaneval.replace(
            problems=in_loop.problems, samples=0, max_new_tokens=in_loop.max_new_tokens
        ),
        humaneval_infill=run.eval.humaneval_infill.replace(problems=0),
    )
    each = sizes.price(slice_, model, machine)["s"]
    evals = max_steps // in_loop.every + (max_steps % in_loop.every != 0)
    return {
        "evals": evals,
        "problems": in_loop.problems,
        "s_each": each,
        "s": evals * each,
        "share": evals * each / train_s,
    }


def predict(cfg: dict) -> dict:
    """The plan of a validated config, with what it assumed (plan.gpu, plan.mfu) recorded in it, and
    its eval priced beside it."""
    run = RunConfig.of(cfg)
    train, expect = run.train, run.plan
    gpu = planned_gpu(run.plan.gpu)
    peak = gpu.tflops * 1e12
    model = model_of(cfg, run)
    # micro_batch / activation_checkpointing auto: what the smoke stage would pick on plan.gpu
    train, picked = autofit.resolve(train, model, train.ranks, gpu.memory_gib, cuda=True)
    batch = split_batch(train.batch_tokens, train.micro_batch, run.shard.seq_len, train.ranks)
    tokens_per_s = expect.mfu * peak * batch.world / model.flops_per_token()
    n_params = model.num_params(non_embedding=False)
    # A budget buys steps at the assumed speed; what the stage spends besides steps is unknown here
    # (the smoke stage measures it), so it counts as nothing: this is the most the budget buys.
    times = StageTimes(step_s=batch.tokens_per_step / tokens_per_s, startup_s=0.0, validation_s=0.0, checkpoint_s=0.0)
    plan = build_plan(
        train,
        run.smoke.price_per_gpu_hour,
        batch=batch,
        times=times,
        tokens_per_s=tokens_per_s,
        n_params=n_params,
        train_tokens=run.pretokenize.train_tokens or 0,
        checkpoint_bytes=4 * n_params + optimizer_state_bytes(model, train.optimizer),  # fp32 weights + state
        model_bytes=4 * n_params,
        data_bytes=data_disk(run, model.vocab_size),
    )
    memory = fit_report(
        model, setting_of(train, world=batch.world, grad_accum=batch.grad_accum), gpu.fragment, gpu.memory_gib
    )
    train_s = plan.get("stage_s", plan["eta_s"])
    eval_cost = eval_price(run, model, gpu, train_s)
    eval_cost["cost"] = None if plan["cost"] is None else eval_cost["s"] / 3600 * plan["price_per_gpu_hour"]
    in_loop = in_loop_price(run, model, gpu, plan["max_steps"], train_s)
    return (
        plan
        | ({"in_loop_eval": in_loop} if in_loop else {})
        | {
            "eval": eval_cost,
            "memory": memory | ({"auto": picked} if picked else {}),
            "predicted_from": {
                "gpu": expect.gpu,
                "peak_tflops": peak / 1e12,
                "mfu": expect.mfu,
                "flops_per_token": model.flops_per_token(),
            },
        }
    )


def _override(text: str) -> dict:
    """One --config KEY=VALUE (the value is read as YAML by kiln.config.raw_config, as in the Snakefile)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise KilnError(f"--config {text!r}: expected KEY=VALUE, e.g. train='{{max_steps: 100}}'")
    return {key: value}


def experiment_of(args: argparse.Namespace) -> kiln_config.Experiment:
    """The runs --configfile and --config (add_run_arguments) mean, resolved as snakemake resolves them."""
    overrides: dict = {}
    for text in args.config or []:
        overrides |= _override(text)
    return kiln_config.resolve_experiment(args.configfile or [], overrides)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--configfile and --config, as given to snakemake."""
    parser.add_argument(
        "--configfile", nargs="+", metavar="FILE", help="run files, as given to snakemake (none: the embedded default)"
    )
    parser.add_argument("--config", nargs="+", metavar="KEY=VALUE", help="overrides, as given to snakemake")


def rehearsed(cfg: dict) -> dict | None:
    """The rehearse stage's figures for this config where they are in results/ (kiln.plan.rehearsal)."""
    return plan_rows(Path(Layout(cfg).output("rehearse")), settings.tracked(cfg, "rehearse"))


def _run(args: argparse.Namespace) -> int:
    experiment = experiment_of(args)
    plans = {run: predict(cfg) | {"rehearsal": rehearsed(cfg)} for run, cfg in experiment.runs.items()}
    if experiment.sweep:
        return _sweep(experiment.name, plans, args.json)
    plan = plans[experiment.name]
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    print(_titled(render_plan(plan), plan))
    return 0


def _titled(text: str, plan: dict, run: str | None = None) -> str:
    source = plan["predicted_from"]
    return text.replace(
        "# Plan for the full run",
        f"# Plan for {run or 'the full run'} (predicted: {source['gpu']} at {source['peak_tflops']:g} TFLOP/s bf16 x "
        f"MFU {source['mfu']:g}; the smoke stage measures it)",
        1,
    )


def sweep_total(plans: dict[str, dict]) -> dict:
    """The whole sweep: its arms' time, device-hours and cost added up (as if run one after another;
    arms run side by side where the devices allow, which shortens the wall time, not the device-hours)."""
    costs = [p["cost"] for p in plans.values()]
    # the data stages run once for arms that share their data (a sweep's usually do): counted once
    data = {tuple(sorted(p.get("data_bytes", {}).items())) for p in plans.values()}
    runs = sum(p["disk_bytes"] - sum(v for v in p.get("data_bytes", {}).values() if v) for p in plans.values())
    return {
        "arms": len(plans),
        "eta_h": sum(p["eta_h"] for p in plans.values()),
        "device_hours": sum(p["device_hours"] for p in plans.values()),
        "cost": sum(costs) if all(c is not None for c in costs) else None,
        "disk_bytes": runs + sum(v for d in data for _, v in d if v),
        "all_fit": all(p["memory"]["fits"] for p in plans.values()),
    }


def _sweep(name: str, plans: dict[str, dict], as_json: bool) -> int:
    total = sweep_total(plans)
    if as_json:
        print(json.dumps({"sweep": name, "runs": plans, "total": total}, indent=2))
        return 0
    rows = [("arm", "params", "steps", "tokens", "time", "device-hours", "cost", "memory/GPU", "fits")]
    for run, p in plans.items():
        rows.append(
            (
                run,
                f"{p['n_params'] / 1e6:,.1f}M",
                f"{p['max_steps']:,}",
                f"{p['total_tokens']:,}",
                f"{p['eta_h']:.2f} h",
                f"{p['device_hours']:.1f}",
                "" if p["cost"] is None else f"${p['cost']:,.2f}",
                f"{p['memory']['gib_per_gpu']:.1f} GiB",
                "yes" if p["memory"]["fits"] else "NO",
            )
        )
    cost = "" if total["cost"] is None else f"${total['cost']:,.2f}"
    rows.append(
        (
            "total",
            "",
            "",
            "",
            f"{total['eta_h']:.2f} h",
            f"{total['device_hours']:.1f}",
            cost,
            "",
            "yes" if total["all_fit"] else "NO",
        )
    )
    print(f"# Sweep {name}: {len(plans)} arms, each priced below in full\n")
    print("\n".join(aligned(rows)))
    print("\n(time adds the arms up as if run one after another; arms run side by side where the devices allow)\n")
    for run, plan in plans.items():
        print(_titled(render_plan(plan), plan, run) + "\n")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="print a config's plan (tokens, steps, time, GPU-hours, cost, disk) without training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(parser)
    parser.add_argument("--json", action="store_true", help="the plan as JSON")
    parser.set_defaults(run=_run)
