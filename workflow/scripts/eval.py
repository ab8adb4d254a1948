"""eval stage: held-out loss, perplexity, bits per byte (against a unigram baseline), completions of
fixed prompts, and single-line FIM infilling exact match on held-out documents.

Writes eval/metrics.json and eval/samples.json.
"""

import math
from pathlib import Path

import numpy as np
import torch

from kiln.cli import run_main, stage_config, stage_parser
from kiln.data.loader import ShardRows
from kiln.data.sources import read_documents
from kiln.data.tokenizer import EOS, load_tokenizer
from kiln.eval.generate import generate
from kiln.eval.infill import make_problems, run_infill
from kiln.eval.perplexity import bits_per_byte, unigram_loss, val_rows_loss
from kiln.io import read_json, write_json
from kiln.train.trainer import load_model

BATCH = 16


def completions(model, tokenizer, cfg: dict, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    eos = frozenset({tokenizer.token_to_id(EOS)})
    out = []
    for prompt in cfg["prompts"]:
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        row = {"prompt": prompt}
        for name, temperature in (("greedy", 0.0), ("sampled", cfg["temperature"])):
            new = generate(model, ids, cfg["max_new_tokens"], temperature=temperature, top_k=cfg["top_k"],
                           stop_ids=eos, vocab_size=tokenizer.get_vocab_size(), generator=generator)
            row[name] = tokenizer.decode(new, skip_special_tokens=False)
        out.append(row)
    return out


def main() -> None:
    parser = stage_parser("eval", __doc__)
    parser.add_argument("--model", required=True, type=Path, help="train stage output folder")
    parser.add_argument("--shards", required=True, type=Path)
    parser.add_argument("--tokens", required=True, type=Path, help="pretokenize stage output folder")
    parser.add_argument("--raw", required=True, type=Path, help="download stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/eval")
    args = parser.parse_args()
    cfg = stage_config(args, "eval")
    seed, ecfg = cfg["seed"], cfg["eval"]
    torch.manual_seed(seed)
    model, tokenizer = load_model(args.model), load_tokenizer(args.tokenizer)
    meta = read_json(args.tokens / "meta.json")
    val_rows = ShardRows(args.shards, "val")
    loss, n_tokens = val_rows_loss(model, val_rows, BATCH, ecfg["max_batches"])
    train_tokens = np.memmap(args.tokens / "train.bin", dtype=meta["dtype"], mode="r")
    unigram = unigram_loss(train_tokens, val_rows, meta["padded_vocab_size"], BATCH, ecfg["max_batches"])
    val = meta["splits"]["val"]
    val_ids = set((args.tokens / "val_ids.txt").read_text(encoding="utf-8").split("\n"))
    val_docs = [d for d in read_documents(args.raw, read_json(args.raw / "manifest.json")) if d.id in val_ids]
    infill = run_infill(model, tokenizer, make_problems(val_docs, ecfg["infill_docs"], seed))
    metrics = {
        "val_loss": loss, "val_perplexity": math.exp(loss),
        "val_bits_per_byte": bits_per_byte(loss, val["tokens"], val["bytes"]),
        "val_tokens_evaluated": n_tokens,
        "unigram_val_loss": unigram,
        "unigram_bits_per_byte": bits_per_byte(unigram, val["tokens"], val["bytes"]),
        "infill_problems": infill["problems"], "infill_exact_match": infill["exact_match"],
        "n_params": model.num_params(non_embedding=False),
    }
    write_json(args.out / "samples.json", {"completions": completions(model, tokenizer, ecfg, seed),
                                           "infill": infill["examples"]})
    write_json(args.out / "metrics.json", metrics)
    print(f"eval: val loss {loss:.4f} (unigram {unigram:.4f}), {metrics['val_bits_per_byte']:.3f} bits/byte, "
          f"infill exact match {infill['exact_match']} -> {args.out}")


if __name__ == "__main__":
    run_main(main)
