"""The special tokens every Kiln vocabulary holds, in this order (StarCoder2's strings and ids 0-6),
and the smallest vocabulary a byte-level BPE can have; which of them a run's samples use."""

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<fim_prefix>",
    "<fim_middle>",
    "<fim_suffix>",
    "<fim_pad>",
    "<repo_name>",
    "<file_sep>",
)
FIM_ROLES = SPECIAL_TOKENS[1:5]  # the FIM sentinels, <fim_pad> with them as in StarCoder's vocabulary
REPO_ROLES = SPECIAL_TOKENS[5:]  # repository context's layout (kiln.data.packing)
BYTE_ALPHABET = 256  # a byte-level BPE starts from one symbol per byte value
SMALLEST_VOCAB = BYTE_ALPHABET + len(SPECIAL_TOKENS)


def roles_used(fim_rate: float, repo_context: bool) -> tuple[str, ...]:
    """The roles a run's samples use, in SPECIAL_TOKENS order: the end of a document always, the FIM
    sentinels when pretokenize.fim.rate is above 0, the repository layout's with pretokenize.repo_context."""
    return (SPECIAL_TOKENS[0],) + (FIM_ROLES if fim_rate > 0 else ()) + (REPO_ROLES if repo_context else ())
