"""Published HumanEval and HumanEval-Infilling figures to print beside a Kiln model's own scores.

A registry in the litgpt style: one frozen `PublishedScore` per number, in `PUBLISHED`, and
`for_benchmark` to pick the rows of one benchmark, smallest model first. Nothing here reads the
network; the numbers are typed in by hand.

How they were found: each number was looked up with the project's search tools (stored copies of
the papers' text, arXiv pages and Hugging Face model cards) and checked against the table or card
it stands in; `where` names that table or section and `quote` is the row as read there. A figure
that could not be read in a source was left out rather than recalled or taken from a secondary
summary. Left out for that reason: TabNine and code-davinci-002 (no parameter count), the FIM
paper's 50M-164M models (their infilling results are plotted, never stated as numbers), and
CodeGen-350M-mono (its table was only seen quoted second-hand).

Read these numbers with care before putting them next to a Kiln score:
- `percent` is on a 0-100 scale, as the sources print it (`fraction` gives 0-1).
- The protocols differ. Codex Table 1 is pass@k from n=200 samples per task with top-p 0.95, at
  the best temperature for each k. The FIM paper's infilling "pass rate" is pass@1 estimated from
  100 samples per task at T=0.2 (its Tables 1 and 4; Table 2 does not say). The BigCode model
  cards do not say how their numbers were sampled. `protocol` records what the source says.
- `source_kind` says whether the number was read in the paper ("paper") or in the authors' model
  card ("model-card"). The SantaCoder, StarCoderBase and StarCoder2 numbers come from the cards;
  those papers' own tables were not readable in the stored copies.
- SantaCoder's HumanEval is the MultiPL-E Python version of HumanEval, and its single-line
  infilling figure is exact match, not pass@1 (metric "exact_match"). Compare metrics, not only
  benchmarks.
- Codex models were fine-tuned from GPT-3-family checkpoints on 159 GB of Python for 100B tokens
  (Codex paper §3.1-3.2). The FIM paper's models were trained from scratch on the same Python data
  (FIM paper Appendix A).
"""

from __future__ import annotations

from dataclasses import dataclass

BENCHMARKS = (
    "humaneval",
    "humaneval-infilling-single-line",
    "humaneval-infilling-multi-line",
    "humaneval-infilling-random-span",
)
METRICS = ("pass@1", "pass@10", "pass@100", "exact_match")
SOURCE_KINDS = ("paper", "model-card")


@dataclass(frozen=True)
class PublishedScore:
    """One published number, with the place it was read."""

    model: str
    params_b: float  # parameters, billions, as the source states the size
    benchmark: str  # one of BENCHMARKS
    metric: str  # one of METRICS
    percent: float  # 0-100, as printed in the source
    protocol: str  # how the source says the number was sampled and scored
    source: str  # paper or model card title
    url: str
    where: str  # the table / section / card field the number stands in
    quote: str  # the row or field as read there
    source_kind: str = "paper"  # one of SOURCE_KINDS
    note: str = ""

    @property
    def fraction(self) -> float:
        return self.percent / 100.0


CODEX = "Chen et al. 2021, Evaluating Large Language Models Trained on Code (Codex)"
CODEX_URL = "https://arxiv.org/abs/2107.03374"
CODEX_WHERE = "Table 1 (Codex, GPT-Neo & TabNine evaluations for HumanEval)"
CODEX_PROTOCOL = (
    "unbiased pass@k from n=200 samples/task (§2.1), nucleus top-p 0.95 (§3.2), temperature tuned per k "
    "(§3.3: T*=0.2 for pass@1, T*=0.8 for pass@100)"
)
NEO_PROTOCOL = "n=200 samples/task, top-p 0.95, best of T in {0.2, 0.4, 0.8} (§3.4)"
GPTJ_PROTOCOL = "n=200 samples/task, top-p 0.95, best of T in {0.2, 0.8} (§3.4)"

FIM = "Bavarian et al. 2022, Efficient Training of Language Models to Fill in the Middle"
FIM_URL = "https://arxiv.org/abs/2207.14255"
FIM_TABLE4_PROTOCOL = "SPM mode, T=0.2, 100 samples/task, pass rate (pass@1)"
FIM_TABLE1_PROTOCOL = "T=0.2, 100 samples/task, pass rate (pass@1)"
FIM_BENCH = {
    "single": "humaneval-infilling-single-line",
    "multi": "humaneval-infilling-multi-line",
    "random": "humaneval-infilling-random-span",
}


def _pass_at_k_rows(
    model: str, params_b: float, values: tuple[float, float, float], quote: str, protocol: str, note: str = ""
) -> tuple[PublishedScore, ...]:
    return tuple(
        PublishedScore(
            model=model,
            params_b=params_b,
            benchmark="humaneval",
            metric=metric,
            percent=value,
            protocol=protocol,
            source=CODEX,
            url=CODEX_URL,
            where=CODEX_WHERE,
            quote=quote,
            note=note,
        )
        for metric, value in zip(("pass@1", "pass@10", "pass@100"), values)
    )


def _fim_rows(
    model: str,
    params_b: float,
    values: dict[str, float],
    where: str,
    quote: str,
    protocol: str,
    note: str = "",
) -> tuple[PublishedScore, ...]:
    return tuple(
        PublishedScore(
            model=model,
            params_b=params_b,
            benchmark=FIM_BENCH[span],
            metric="pass@1",
            percent=value,
            protocol=protocol,
            source=FIM,
            url=FIM_URL,
            where=where,
            quote=quote,
            note=note,
        )
        for span, value in values.items()
    )


_CODEX_NOTE = "fine-tuned from a GPT-3-family checkpoint on 159 GB of Python for 100B tokens (§3.1-3.2)"
_NEO_NOTE = "trained on The Pile (about 8% GitHub code), no code fine-tuning (§3.4)"

_CODEX_ROWS = (
    _pass_at_k_rows(
        "GPT-Neo 125M", 0.125, (0.75, 1.88, 2.97), "GPT-NEO 125M 0.75% 1.88% 2.97%", NEO_PROTOCOL, _NEO_NOTE
    )
    + _pass_at_k_rows(
        "GPT-Neo 1.3B", 1.3, (4.79, 7.47, 16.30), "GPT-NEO 1.3B 4.79% 7.47% 16.30%", NEO_PROTOCOL, _NEO_NOTE
    )
    + _pass_at_k_rows(
        "GPT-Neo 2.7B", 2.7, (6.41, 11.27, 21.37), "GPT-NEO 2.7B 6.41% 11.27% 21.37%", NEO_PROTOCOL, _NEO_NOTE
    )
    + _pass_at_k_rows("GPT-J 6B", 6.0, (11.62, 15.74, 27.74), "GPT-J 6B 11.62% 15.74% 27.74%", GPTJ_PROTOCOL, _NEO_NOTE)
    + _pass_at_k_rows(
        "Codex-12M", 0.012, (2.00, 3.62, 8.58), "CODEX-12M 2.00% 3.62% 8.58%", CODEX_PROTOCOL, _CODEX_NOTE
    )
    + _pass_at_k_rows(
        "Codex-25M", 0.025, (3.21, 7.1, 12.89), "CODEX-25M 3.21% 7.1% 12.89%", CODEX_PROTOCOL, _CODEX_NOTE
    )
    + _pass_at_k_rows(
        "Codex-42M", 0.042, (5.06, 8.8, 15.55), "CODEX-42M 5.06% 8.8% 15.55%", CODEX_PROTOCOL, _CODEX_NOTE
    )
    + _pass_at_k_rows(
        "Codex-85M", 0.085, (8.22, 12.81, 22.4), "CODEX-85M 8.22% 12.81% 22.4%", CODEX_PROTOCOL, _CODEX_NOTE
    )
    + _pass_at_k_rows(
        "Codex-300M", 0.3, (13.17, 20.37, 36.27), "CODEX-300M 13.17% 20.37% 36.27%", CODEX_PROTOCOL, _CODEX_NOTE
    )
    + _pass_at_k_rows(
        "Codex-679M", 0.679, (16.22, 25.7, 40.95), "CODEX-679M 16.22% 25.7% 40.95%", CODEX_PROTOCOL, _CODEX_NOTE
    )
    + _pass_at_k_rows(
        "Codex-2.5B", 2.5, (21.36, 35.42, 59.5), "CODEX-2.5B 21.36% 35.42% 59.5%", CODEX_PROTOCOL, _CODEX_NOTE
    )
    + _pass_at_k_rows(
        "Codex-12B", 12.0, (28.81, 46.81, 72.31), "CODEX-12B 28.81% 46.81% 72.31%", CODEX_PROTOCOL, _CODEX_NOTE
    )
)

_FIM_SCRATCH = "trained from scratch on the Codex Python data (Appendix A)"
_FIM_ROWS = (
    # Appendix G, Table 4: the 6.9B models (6.5B non-embedding), 100B tokens.
    _fim_rows(
        "FIM paper 6.9B, FIM rate 0.5 (FIM50)",
        6.9,
        {"single": 73.0, "multi": 40.6, "random": 52.1},
        "Appendix G, Table 4",
        "FIM50 0.730 0.406 0.521",
        FIM_TABLE4_PROTOCOL,
        "100B tokens, " + _FIM_SCRATCH,
    )
    + _fim_rows(
        "FIM paper 6.9B, FIM rate 0.9 (FIM90)",
        6.9,
        {"single": 75.1, "multi": 44.1, "random": 55.1},
        "Appendix G, Table 4",
        "FIM90 0.751 0.441 0.551",
        FIM_TABLE4_PROTOCOL,
        "100B tokens, " + _FIM_SCRATCH,
    )
    + _fim_rows(
        "InCoder-6.7B",
        6.7,
        {"single": 69.0, "multi": 38.6},
        "Appendix G, Table 4",
        "INCODER 0.690 0.386 N/A",
        "InCoder's self-reported numbers, as quoted in the FIM paper (not evaluated in its framework)",
        "random span not reported",
    )
    # §4.3, Table 1: "large" models (844M parameters, Table 3), joint PSM+SPM training.
    + _fim_rows(
        "FIM paper Large 844M, joint PSM+SPM, FIM rate 0.5, PSM inference",
        0.844,
        {"single": 55.0, "multi": 26.5, "random": 36.7},
        "§4.3, Table 1 (row Joint 0.5, PSM columns)",
        "Joint 0.5 | single 0.550 / 0.595 | multi 0.265 / 0.293 | random 0.367 / 0.379 (PSM / SPM)",
        FIM_TABLE1_PROTOCOL,
        "size from Table 3 ('Large', 844M total); training tokens not stated for this table "
        "(paper default 100B; the §4.2 FIM-rate runs of this size used 50B). " + _FIM_SCRATCH,
    )
    + _fim_rows(
        "FIM paper Large 844M, joint PSM+SPM, FIM rate 0.5, SPM inference",
        0.844,
        {"single": 59.5, "multi": 29.3, "random": 37.9},
        "§4.3, Table 1 (row Joint 0.5, SPM columns)",
        "Joint 0.5 | single 0.550 / 0.595 | multi 0.265 / 0.293 | random 0.367 / 0.379 (PSM / SPM)",
        FIM_TABLE1_PROTOCOL,
        "size from Table 3 ('Large', 844M total); training tokens not stated for this table "
        "(paper default 100B; the §4.2 FIM-rate runs of this size used 50B). " + _FIM_SCRATCH,
    )
    + _fim_rows(
        "FIM paper Large 844M, joint PSM+SPM, FIM rate 0.9, PSM inference",
        0.844,
        {"single": 61.6, "multi": 29.0, "random": 39.7},
        "§4.3, Table 1 (row Joint 0.9, PSM columns)",
        "Joint 0.9 | single 0.616 / 0.622 | multi 0.290 / 0.305 | random 0.397 / 0.420 (PSM / SPM)",
        FIM_TABLE1_PROTOCOL,
        "size from Table 3 ('Large', 844M total); training tokens not stated for this table. " + _FIM_SCRATCH,
    )
    + _fim_rows(
        "FIM paper Large 844M, joint PSM+SPM, FIM rate 0.9, SPM inference",
        0.844,
        {"single": 62.2, "multi": 30.5, "random": 42.0},
        "§4.3, Table 1 (row Joint 0.9, SPM columns)",
        "Joint 0.9 | single 0.616 / 0.622 | multi 0.290 / 0.305 | random 0.397 / 0.420 (PSM / SPM)",
        FIM_TABLE1_PROTOCOL,
        "size from Table 3 ('Large', 844M total); training tokens not stated for this table. " + _FIM_SCRATCH,
    )
    # §4.5, Table 2: "medium" models (411M parameters, Table 3), PSM mode, character-level spans.
    + _fim_rows(
        "FIM paper Medium 411M, character-level random spans, PSM",
        0.411,
        {"single": 55.7, "multi": 25.0, "random": 32.1},
        "§4.5, Table 2 (row Character-level random span)",
        "Character-level random span 0.557 0.250 0.321",
        "PSM mode (§4.5); sampling temperature and samples/task not stated for this table",
        "size from Table 3 ('Medium', 411M total); training tokens not stated for this table. " + _FIM_SCRATCH,
    )
)

_SANTACODER = "SantaCoder model card (Allal et al. 2023, SantaCoder: don't reach for the stars!, arXiv 2301.03988)"
_SANTACODER_URL = "https://huggingface.co/bigcode/santacoder"
_SANTACODER_NOTE = "the 'final' 1.1B model, 236B tokens of Python/Java/JavaScript (card, Training section)"
_BIGCODE_ROWS = tuple(
    PublishedScore(
        model="SantaCoder 1.1B",
        params_b=1.1,
        benchmark="humaneval",
        metric=metric,
        percent=value,
        protocol="MultiPL-E HumanEval (Python); sampling not stated on the card",
        source=_SANTACODER,
        url=_SANTACODER_URL,
        where="model card, model-index: MultiPL HumanEval (Python)",
        quote=f"name: {metric}, type: {metric}, value: {value / 100:.2f}",
        source_kind="model-card",
        note=_SANTACODER_NOTE,
    )
    for metric, value in (("pass@1", 18.0), ("pass@10", 29.0), ("pass@100", 49.0))
) + (
    PublishedScore(
        model="SantaCoder 1.1B",
        params_b=1.1,
        benchmark="humaneval-infilling-single-line",
        metric="exact_match",
        percent=44.0,
        protocol="exact match of the infilled line (not pass@1); sampling not stated on the card",
        source=_SANTACODER,
        url=_SANTACODER_URL,
        where="model card, model-index: HumanEval FIM (Python), dataset loubnabnl/humaneval_infilling",
        quote="name: single_line, type: exact_match, value: 0.44",
        source_kind="model-card",
        note=_SANTACODER_NOTE + "; the same single-line tasks (Fried et al. 2022) the FIM paper scores by pass@1",
    ),
    PublishedScore(
        model="StarCoderBase-1B",
        params_b=1.0,
        benchmark="humaneval",
        metric="pass@1",
        percent=15.17,
        protocol="not stated on the card",
        source="StarCoderBase-1B model card (BigCode; StarCoder paper arXiv 2305.06161)",
        url="https://huggingface.co/bigcode/starcoderbase-1b",
        where="model card, model-index: HumanEval (openai_humaneval)",
        quote="name: pass@1, type: pass@1, value: 15.17",
        source_kind="model-card",
        note="80+ languages, The Stack v1.2, FIM objective, 1T tokens (card, Model Summary)",
    ),
    PublishedScore(
        model="StarCoderBase-3B",
        params_b=3.0,
        benchmark="humaneval",
        metric="pass@1",
        percent=21.46,
        protocol="not stated on the card",
        source="StarCoderBase-3B model card (BigCode; StarCoder paper arXiv 2305.06161)",
        url="https://huggingface.co/bigcode/starcoderbase-3b",
        where="model card, model-index: HumanEval (openai_humaneval)",
        quote="name: pass@1, type: pass@1, value: 21.46",
        source_kind="model-card",
        note="80+ languages, The Stack v1.2, FIM objective, 1T tokens (card, Model Summary)",
    ),
    PublishedScore(
        model="StarCoder2-3B",
        params_b=3.0,
        benchmark="humaneval",
        metric="pass@1",
        percent=31.7,
        protocol="not stated on the card",
        source="StarCoder2-3B model card (Lozhkov et al. 2024, StarCoder 2 and The Stack v2, arXiv 2402.19173)",
        url="https://huggingface.co/bigcode/starcoder2-3b",
        where="model card, model-index: HumanEval (humaneval)",
        quote="name: HumanEval, type: humaneval, metrics: type: pass@1, value: 31.7",
        source_kind="model-card",
        note="the card also gives HumanEval+ pass@1 27.4 (HumanEval+ is not one of BENCHMARKS)",
    ),
)

PUBLISHED: tuple[PublishedScore, ...] = _CODEX_ROWS + _FIM_ROWS + _BIGCODE_ROWS


def for_benchmark(benchmark: str, metric: str | None = None) -> list[PublishedScore]:
    """The published rows of one benchmark (optionally one metric), smallest model first."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
    if metric is not None and metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    rows = [s for s in PUBLISHED if s.benchmark == benchmark and (metric is None or s.metric == metric)]
    return sorted(rows, key=lambda s: (s.params_b, s.model, METRICS.index(s.metric)))
