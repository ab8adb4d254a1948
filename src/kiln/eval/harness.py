"""lm-evaluation-harness adapter: a Kiln checkpoint as an lm-eval model named "kiln".

    lm_eval --model kiln --model_args pretrained=results/<run>/train,tokenizer=results/data/tokenizer-<key>/tokenizer.json \
            --tasks kiln_heldout_perplexity --include_path <tasks dir>
    # on a GPU, under bf16 autocast as the eval stage runs it there: add --device cuda and precision=bf16

`TemplateLM` turns loglikelihood requests into token pairs; this class scores them in batches
(right-padded, one forward per batch; causal attention means padding after a sequence cannot change
its logits). Rolling loglikelihood uses lm-eval's own disjoint windows of the model's context length.

A run whose tokenizer has a BOS (a Llama source's, kiln.data.tokenizer.bos_token: every training
sample starts with it) reads every text from its start as training did, as lm-eval's HFLM does by
default for a Llama tokenizer (add_bos_token unset: the tokenizer's own, which prepends its BOS):
`tok_encode` puts the BOS before a context (lm-eval splits the continuation off the end, so the BOS
is never scored), `prefix_token_id` is the BOS (the context of an empty-context request), and rolling
loglikelihood gives the BOS as the first window's prefix only: it is the context of the text's first
token, never a predicted token, so bits per byte count the text's tokens alone (HFLM's default would
also put a second BOS into the scored tokens). Without a BOS, nothing is prepended and the prefix is
EOS (lm-eval's default), as before.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from kiln.data.tokenizer import EOS, bos_id, load_tokenizer, role_id
from kiln.generate.decode import generate
from kiln.train.device import eval_autocast


@register_model("kiln")
class KilnLM(TemplateLM):
    def __init__(
        self,
        pretrained: str,
        tokenizer: str,
        batch_size: int | str = 8,
        max_batch_size: int | None = None,
        device: str | None = None,
        max_gen_toks: int = 128,
        precision: str = "fp32",
        **kwargs,
    ):
        """precision is train.precision: bf16 runs the model under bf16 autocast on a GPU (on the
        CPU it stays fp32, as in the eval stage: kiln.train.device.eval_autocast)."""
        super().__init__()
        from kiln.model.build import load_model

        self._device = torch.device(device or "cpu")
        self.model = load_model(Path(pretrained), self._device)
        self.autocast = eval_autocast(self._device, precision)
        self.tokenizer = load_tokenizer(tokenizer)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        if max_batch_size is not None:
            self.batch_size = min(self.batch_size, int(max_batch_size))
        self.max_gen_toks = int(max_gen_toks)

    @property
    def eot_token_id(self) -> int:
        return role_id(self.tokenizer, EOS)

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is (lm-eval) and the rolling windows start from: the BOS when the
        tokenizer has one, else EOS, as HFLM's default."""
        bos = bos_id(self.tokenizer)
        return self.eot_token_id if bos is None else bos

    @property
    def max_length(self) -> int:
        return self.model.config.seq_len

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The string's ids, after the BOS (when the tokenizer has one) unless add_special_tokens is
        False: lm-eval encodes contexts (and context + continuation) with None, continuations alone
        with False. A special token's spelling in the string stays text, as in training."""
        ids = self.tokenizer.encode(string, add_special_tokens=False).ids
        bos = None if add_special_tokens is False else bos_id(self.tokenizer)
        return ids if bos is None else [bos, *ids]

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @torch.no_grad()
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether greedy decoding gives the continuation)
        for each (context ids, continuation ids), the context cut from the left to fit."""
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            rows = [(pairs[i][0] + pairs[i][1])[-(self.max_length + 1) :][:-1] for i in batch]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long)
            for j, row in enumerate(rows):
                ids[j, : len(row)] = torch.tensor(row)
            with self.autocast():
                logits, _ = self.model(ids.to(self.device))  # (B, T, V), bf16 under autocast
            for j, i in enumerate(batch):
                cont = pairs[i][1]
                end = len(rows[j])
                # fp32 log-probabilities of the continuation's positions only: (len(cont), V), not the
                # batch's (B, T, V) (16 GiB in fp32 for 16 x 8192 tokens over a 32k vocabulary)
                scores = F.log_softmax(logits[j, end - len(cont) : end].float(), dim=-1)
                target = torch.tensor(cont, device=self.device)
                total = scores.gather(1, target[:, None]).sum().item()
                out[i] = (total, bool((scores.argmax(-1) == target).all()))
        return out  # type: ignore[return-value]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        return self._score([(context, continuation) for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        results = []
        for (text,) in (r.args for r in requests):
            windows = [
                lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text, add_special_tokens=False),  # the BOS is the prefix
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            results.append(sum(score for score, _ in self._score(windows)))
        return results

    def _stop_ids(self, until: tuple[str, ...]) -> frozenset[int]:
        """EOS and every token whose text contains a stop string: decoding can end on the token
        that completes a line instead of running to max_gen_toks (the text is cut afterwards)."""
        vocab = range(self.tokenizer.get_vocab_size())
        return frozenset({self.eot_token_id} | {i for i in vocab if any(s in self.tok_decode([i]) for s in until)})

    def _settings(self, gen_kwargs: dict) -> tuple:
        """(until, max_gen_toks, temperature, top_k, top_p) of a request: requests that share them
        decode in one batch. Sampling settings count only with do_sample (greedy otherwise)."""
        until = gen_kwargs.get("until", [])
        until = (until,) if isinstance(until, str) else tuple(until)
        sample = bool(gen_kwargs.get("do_sample"))
        top_k = gen_kwargs.get("top_k") if sample else None
        return (
            until,
            int(gen_kwargs.get("max_gen_toks", self.max_gen_toks)),
            float(gen_kwargs.get("temperature", 0.0)) if sample else 0.0,
            None if top_k is None else int(top_k),
            float(gen_kwargs.get("top_p", 1.0)) if sample else 1.0,
        )

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continuations, each cut at its first stop string. Requests with the same settings are
        decoded together, batch_size at a time (generate crops each context from the left)."""
        args = [r.args for r in requests]
        groups: dict[tuple, list[int]] = {}
        for i, (_, gen_kwargs) in enumerate(args):
            groups.setdefault(self._settings(gen_kwargs), []).append(i)
        results: list[str] = [""] * len(args)
        for (until, max_new, temperature, top_k, top_p), members in groups.items():
            with self.autocast():
                new = generate(
                    self.model,
                    [self.tok_encode(args[i][0]) for i in members],
                    max_new,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    stop_ids=self._stop_ids(until),
                    vocab_size=self.tokenizer.get_vocab_size(),
                    keep_stop=True,
                    batch_size=self.batch_size,
                )
            for i, ids in zip(members, new):
                text = self.tokenizer.decode(ids, skip_special_tokens=True)  # drops a final EOS
                for stop in until:
                    text = text.split(stop)[0]
                results[i] = text
        return results
