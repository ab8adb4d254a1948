"""The special tokens every Kiln vocabulary holds, in this order (StarCoder2's strings and ids 0-6),
and the smallest vocabulary a byte-level BPE can have."""

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<fim_prefix>",
    "<fim_middle>",
    "<fim_suffix>",
    "<fim_pad>",
    "<repo_name>",
    "<file_sep>",
)
BYTE_ALPHABET = 256  # a byte-level BPE starts from one symbol per byte value
SMALLEST_VOCAB = BYTE_ALPHABET + len(SPECIAL_TOKENS)
