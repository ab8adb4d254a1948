"""The config contract: shipped configs validate; bad input fails naming the key path."""

import copy
from pathlib import Path

import pytest
import yaml

from kiln import config as kiln_config
from kiln.config import ConfigError
from kiln.errors import KilnError

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted(ROOT.glob("config/**/*.yaml")) + sorted((ROOT / "tests" / "configs").glob("*.yaml"))


@pytest.fixture()
def tiny() -> dict:
    return yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_configs_validate(path, tmp_path, monkeypatch):
    """A run file alone; a sweep file over the run it is given after (tests/dag/test_run_configs.py runs
    those through Snakemake), every arm validated. A run continuing a Hugging Face checkpoint is
    validated beside a stand-in of it (the folder it names is downloaded by the user, not shipped)."""
    source = kiln_config.read_yaml(path).get("train", {}).get("init_from", {}).get("hf")
    if source:
        from hf_folder import write_hf_folder

        monkeypatch.chdir(tmp_path)
        write_hf_folder(tmp_path / source, eos="<|endoftext|>")
    if "sweep" in kiln_config.read_yaml(path):
        base = (
            ROOT
            / "config"
            / ("config.yaml" if path.name.startswith("stdlib") else "experiments/fineweb-edu-gpt2-124m.yaml")
        )
        runs = kiln_config.resolve_experiment([base, path]).runs
        with pytest.raises(ConfigError, match="a sweep of 3 runs"):
            kiln_config.load(path)
    else:
        runs = {"run": kiln_config.load(path)}
    for cfg in runs.values():
        train = cfg["train"]
        assert train["budget"] is not None or train["max_steps"] > train["warmup_steps"]


def test_defaults_are_filled_without_touching_the_input(tiny):
    before = copy.deepcopy(tiny)
    cfg = kiln_config.validate(tiny)
    assert tiny == before
    assert cfg["train"]["beta2"] == 0.95
    assert cfg["pretokenize"]["fim"]["psm"] == 0.5
    assert cfg["download"]["sources"][0]["include"]  # stdlib default include kept


def _error(cfg: dict) -> str:
    with pytest.raises(ConfigError) as info:
        kiln_config.validate(cfg)
    return str(info.value)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c["train"].update(learning_rate=1e-3), "train.learning_rate: unknown key"),
        (lambda c: c.update(trian={}), "trian: unknown key"),
        (
            lambda c: c["download"]["sources"][0].update(includes=["x"]),
            "download.sources.0: kind stdlib has no key includes",
        ),
        (
            lambda c: c["train"].update(lr="fast"),
            "train.lr: Input should be a valid integer (got 'fast'), or Input should be a valid number",
        ),
        (lambda c: c["shard"].update(seq_len=0), "shard.seq_len: Input should be greater than or equal to 1 (got 0)"),
        (lambda c: c["shard"].update(seq_len=-5), "shard.seq_len"),
        (lambda c: c["model"].update(d_model=100, n_head=3), "model.d_model: 100 is not divisible by model.n_head=3"),
        (lambda c: c["tokenizer"].update(vocab_size=200), "tokenizer.vocab_size: 200 is smaller than the 263"),
        (
            lambda c: c["download"]["sources"][0].update(kind="ftp"),
            "download.sources.0.kind: Input should be 'stdlib', 'local' or 'hf' (got 'ftp')",
        ),
        (
            lambda c: c["download"].update(invalid_utf8="ignore"),
            "download.invalid_utf8: Input should be 'skip' or 'fail' (got 'ignore')",
        ),
        (lambda c: c["pretokenize"].update(val_fraction=0.1), "pretokenize.val_fraction: unknown key"),
        (
            lambda c: c["pretokenize"].update(mixture={"nope": 1.0}, train_tokens=10),
            "pretokenize.mixture: nope not among download.sources (stdlib)",
        ),
        (
            lambda c: c["pretokenize"].update(mixture={"stdlib": 1.0}),
            "pretokenize.mixture: weights need pretokenize.train_tokens",
        ),
        (
            lambda c: c["pretokenize"].update(mixture={"stdlib": 0}, train_tokens=10),
            "pretokenize.mixture.stdlib: Input should be greater than 0 (got 0)",
        ),
        (lambda c: c.update(tokenizer={"kind": "file"}), "tokenizer: kind file needs key path"),
        (lambda c: c.update(tokenizer={"kind": "hf"}), "tokenizer: kind hf needs key path"),
        (
            lambda c: c.update(tokenizer={"kind": "hf", "path": "x", "vocab_size": 9}),
            "tokenizer: kind hf has no key vocab_size",
        ),
        (
            lambda c: c.update(tokenizer={"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 9}),
            "tokenizer: kind tiktoken has no key vocab_size",
        ),
        (lambda c: c["pretokenize"].update(fim={"psm": 0.6}), "pretokenize.fim: psm + spm + middle_only must sum to 1"),
        (lambda c: c["train"].update(min_lr=1.0), "train.min_lr"),
        (lambda c: c["train"].update(warmup_steps=10_000), "train.warmup_steps"),
        (
            lambda c: c["train"].update(warmup_steps=0, init_from={"run": "tiny", "warmup_from": 1e-4}),
            "train.init_from.warmup_from: needs train.warmup_steps above 0",
        ),
        (
            lambda c: c["train"].update(init_from={"run": "tiny", "warmup_from": "sauce"}),
            "train.init_from.warmup_from",
        ),
        (lambda c: c["model"].pop("n_layer"), "model: no flavour, so the shape itself: n_layer missing"),
        (lambda c: c["model"].update(flavour="gpt5"), "model.flavour: 'gpt5' is not a known flavour"),
        (lambda c: c["train"].update(batch_tokens=1000), "train.batch_tokens: 1000 is not a multiple of 1 ranks"),
        (
            lambda c: c["train"].update(nnodes=2, node_rank=2, rdzv_endpoint="n0:29500"),
            "train.node_rank: 2 must be below",
        ),
        (
            lambda c: c["train"].update(async_checkpoint=True),  # ddp: auto is the full format
            "train.async_checkpoint: needs sharded checkpoints, but train.checkpoint_format is auto under train.parallel ddp",
        ),
        (lambda c: c["train"].update(fsdp_one_rank=True), "train.fsdp_one_rank: needs train.parallel fsdp, got ddp"),
        (lambda c: c["train"].update(rdzv_endpoint="n0"), "train.rdzv_endpoint: String should match pattern"),
        (
            lambda c: c["train"].update(schedule="linear"),
            "train.schedule: Input should be 'cosine', 'wsd' or 'constant' (got 'linear')",
        ),
        (
            lambda c: c["train"].update(collective_timeout_s=0),
            "train.collective_timeout_s: Input should be greater than 0 (got 0)",
        ),
        (
            lambda c: c["train"].update(collective_timeout_s="10m"),
            "train.collective_timeout_s: Input should be a valid integer (got '10m')",
        ),
        (lambda c: c["eval"]["reference"].pop("date"), "eval.reference.date: Field required"),
        (
            lambda c: c["eval"]["reference"].update(measured_on=2),
            "eval.reference.measured_on: Input should be a valid string (got 2)",
        ),
        (lambda c: c["eval"]["reference"].update(date="Dec 2026"), "eval.reference.date: String should match pattern"),
        (lambda c: c["download"]["sources"].append(dict(c["download"]["sources"][0])), "names must be unique"),
        (
            lambda c: c["download"]["sources"].append({"name": "x", "kind": "local"}),
            "download.sources.1: kind local needs key paths",
        ),
    ],
)
def test_bad_config_names_the_key(tiny, mutate, expected):
    mutate(tiny)
    assert expected in _error(tiny)


def test_a_references_unquoted_yaml_date_is_kept_as_the_text_written(tiny):
    """YAML reads `date: 2026-12-06` as a date; the validated config (JSON, the rule params) holds its text."""
    assert kiln_config.validate(tiny)["eval"]["reference"]["date"] == "2026-12-06"


def test_warmup_from_source_is_refused_for_a_hf_folder(tiny, tmp_path):
    """A Hugging Face folder records no LR: the user gives the number (the model section is the stock one's)."""
    from hf_folder import write_hf_folder

    write_hf_folder(tmp_path / "stock")
    del tiny["model"]
    tiny["train"]["init_from"] = {"hf": str(tmp_path / "stock"), "warmup_from": "source"}
    message = _error(tiny)
    assert "train.init_from.warmup_from: source reads the last LR of a Kiln run or checkpoint" in message
    assert "a Hugging Face folder records none: give the LR as a number" in message
    tiny["train"]["init_from"]["warmup_from"] = 1e-4  # the number the message asks for
    assert kiln_config.validate(tiny)["train"]["init_from"]["warmup_from"] == 1e-4


@pytest.mark.parametrize("source", [{"run": "tiny"}, {"checkpoint": "results/tiny/train/checkpoints/step-0000010"}])
def test_warmup_from_source_is_accepted_for_a_run_or_a_checkpoint(tiny, source):
    """Both record the LR of their last step (metrics.jsonl, the checkpoint's state); only hf does not."""
    tiny["train"]["init_from"] = source | {"warmup_from": "source"}
    assert kiln_config.validate(tiny)["train"]["init_from"]["warmup_from"] == "source"


def test_every_problem_is_reported_at_once(tiny):
    tiny["train"]["lr"] = "fast"
    tiny["eval"]["bogus"] = 1
    message = _error(tiny)
    assert "train.lr" in message and "eval.bogus: unknown key" in message


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        kiln_config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        kiln_config.load(bad)


def _format_of(cfg: dict) -> str:
    train = kiln_config.validate(cfg)["train"]
    return kiln_config.checkpoint_format(train["checkpoint_format"], train["parallel"])


def test_checkpoint_format_auto_is_sharded_under_fsdp_only(tiny):
    formats = {}
    for parallel in ("ddp", "fsdp"):
        tiny["train"]["parallel"] = parallel
        formats[parallel] = _format_of(tiny)
    assert formats == {"ddp": "full", "fsdp": "sharded"}
    tiny["train"].update(checkpoint_format="sharded", async_checkpoint=True, parallel="ddp")
    assert _format_of(tiny) == "sharded"


def test_config_overrides_read_as_the_user_typed_them_in_lists_too():
    """`--config download={sources: [{..., max_rows: 150}]}`: Snakemake's parser leaves every nested
    scalar a string, inside lists too; Kiln reads them as YAML (an int here, not '150'), and a glob YAML
    would not take bare (*.md) as typed."""
    from snakemake.cli import parse_config

    from kiln.config.files import yaml_values

    typed = (
        "download={sources: [{name: a, kind: local, paths: ['x/**/*.md', '*.md'], max_rows: 150}], rows_per_part: 20}"
    )
    prompts = "train={samples: {prompts: ['def main():', 'x = 1']}}"  # strings YAML would make a mapping of
    parsed = parse_config([typed, prompts])
    assert parsed["download"]["sources"][0]["max_rows"] == "150"  # Snakemake's reading
    assert yaml_values(parsed) == {
        "download": {
            "sources": [{"name": "a", "kind": "local", "paths": ["x/**/*.md", "*.md"], "max_rows": 150}],
            "rows_per_part": 20,
        },
        "train": {"samples": {"prompts": ["def main():", "x = 1"]}},
    }


def test_seed_000_on_two_nodes_stops_at_validation_naming_the_micro_batch_that_keeps_its_batch():
    """config/experiments/swallow-code-llama-1b.yaml is 4 ranks x 6 rows x 8,192 tokens = 196,608; on
    two nodes 8 ranks x 6 rows is twice that, so the config stops before any job, naming both fixes:
    a batch that divides, or micro-batch 3, which keeps the seed's batch (and its trajectory)."""
    with pytest.raises(KilnError) as caught:
        kiln_config.resolve([ROOT / "config" / "experiments" / "swallow-code-llama-1b.yaml"], {"train": "{nnodes: 2}"})
    said = str(caught.value)
    assert "train.batch_tokens: 196608 is not a multiple of 8 ranks" in said
    assert "nearest that are: 393216" in said
    assert "keep the batch with train.micro_batch: 3 (1 micro-batch a step)" in said
