"""A stock-style Hugging Face model folder made offline: a byte-level BPE trained with `tokenizers`
(not by Kiln), saved through transformers' PreTrainedTokenizerFast.save_pretrained beside a small
random Llama model, as a downloaded checkpoint would lie on disk. With bos, the tokenizer starts every
sequence with <s> as Llama 2's does (a TemplateProcessing post-processor, single = "<s> $A")."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# The FIM tokens of the families that have them (kiln.data.tokenizer_build takes either spelling).
FIM_STYLES = {
    "starcoder": ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"],
    "qwen": ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>"],
}
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n",
    "for i in range(10):\n    print(i * i)\n",
    "import os\nprint(os.path.join('a', 'b'))\n",
]


def source_tokenizer(vocab_size: int, eos: str, fim: str | None) -> Tokenizer:
    """A BPE with its own special tokens first (<s>, eos, then the FIM style's), as stock ones do."""
    specials = ["<s>", eos] + (FIM_STYLES[fim] if fim else [])
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXTS * 20, trainer=trainer)
    return tokenizer


def write_hf_folder(
    folder: Path,
    *,
    eos: str = "</s>",
    fim: str | None = None,
    vocab_size: int = 320,
    model: bool = True,
    bos: bool = False,
    tie: bool = True,
) -> Path:
    """folder with tokenizer.json, tokenizer_config.json and special_tokens_map.json (eos_token: eos),
    and, with model, a 2-layer Llama (GQA; its head tied to the embedding unless tie is false) whose
    embedding has exactly the tokenizer's rows. bos: the tokenizer's post-processor puts <s> before
    every sequence (Llama 2, TinyLlama)."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    tokenizer = source_tokenizer(vocab_size, eos, fim)
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token=eos,
        additional_special_tokens=FIM_STYLES[fim] if fim else [],
    )
    fast.save_pretrained(folder)
    if model:
        config = LlamaConfig(
            vocab_size=tokenizer.get_vocab_size(),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=tie,
            bos_token_id=tokenizer.token_to_id("<s>"),
            eos_token_id=tokenizer.token_to_id(eos),
        )
        LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def write_hf_shape(folder: Path, config: dict, eos: str) -> Path:
    """A stock checkpoint's folder as far as a config's validation and shape read it, without its
    weights: config.json as given, and a tokenizer of exactly config["vocab_size"] ids (a word-level
    vocabulary, eos first), so the run's vocabulary is the checkpoint's at its real size."""
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    vocab = {eos: 0, **{f"t{i}": i for i in range(1, config["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=eos))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
