"""The run's tokenizer as the stages after the tokenizer stage read it: its tokenizer.json, a Hugging
Face tokenizer loaded with `tokenizers` alone, and the stats.json the stage writes beside it. The stage
itself, which makes both by one of four routes, is kiln.data.tokenizer_build; this module imports none
of that one's packages (tiktoken, pyarrow), so that training, which loads the tokenizer for its samples
and its Hugging Face export, runs without them (tests/unit/test_train_imports.py).

Kiln's seven special tokens are *roles* (SPECIAL_TOKENS: end of document, the FIM sentinels, the
repository layout), named by Kiln's (StarCoder2's) spellings. Every route but `hf` holds them under
those spellings (appended when a pretrained vocabulary lacks them); a trained BPE gives them ids 0..6
in order. An `hf` source keeps its own: the end of document is its eos_token (tokenizer_config.json,
else special_tokens_map.json), and a FIM or repository role is its token of Kiln's spelling
(StarCoder2, SantaCoder) or of Qwen2.5-Coder's (<|fim_prefix|>, ...); only a role the run uses (the
FIM sentinels with pretokenize.fim.rate above 0, the repository layout's with repo_context) that it has
no token for gets Kiln's spelling appended, which grows the vocabulary (init_from starts those rows at
the mean row). A role neither the source nor the run has is not recorded (role_id: None), so a
continuation with FIM off and no repository context keeps the source's tokenizer exactly (and its
export the source's rows: export_vocab_size). Which token plays which role is recorded in stats.json
beside tokenizer.json ("special_tokens"), and every stage that lays out ids reads it there
(`token_roles`). Text that merely *contains* a special token's spelling is encoded as ordinary text
(`encode_special_tokens`), so a document quoting "<|endoftext|>" cannot end itself early; special ids
enter a sequence only where Kiln puts them.

A source that starts every document with a beginning-of-sequence token (Llama 2 / TinyLlama <s>,
Llama 3 <|begin_of_text|>) keeps that layout: its BOS is recorded beside tokenizer.json ("bos_token",
read back by `bos_token`; null for every other source and route), and Kiln then lays out every sample
as `<bos> text <eos>` and starts every text the model reads from its start with it (`with_bos`). The
source adds one when its tokenizer_config.json says add_bos_token: true (what transformers obeys for
Llama tokenizers), or, without that key, when its tokenizer.json's post-processor puts a token before
a single sequence; add_bos_token: false means none. The vocabulary is padded to a multiple of 64 for
the model (`padded_vocab_size`).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.errors import KilnError
from kiln.io import read_json

EOS = "<|endoftext|>"
VOCAB_MULTIPLE = 64
KILN_ROLES = {t: t for t in SPECIAL_TOKENS}
STATS_FILE = "stats.json"  # the stage's other output, beside tokenizer.json


def padded_vocab_size(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Embedding rows for a vocabulary of n tokens: rounded up so matmuls tile evenly on GPUs."""
    return -(-n // multiple) * multiple


def load_tokenizer(path: str | Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    # Not stored in tokenizer.json by every tokenizers release; set it on every load.
    tokenizer.encode_special_tokens = True
    tokenizer.kiln_roles = token_roles(path)  # which token plays each role (role_id)
    tokenizer.kiln_bos = bos_token(path)  # the source's BOS, when it starts every document with one (bos_id)
    return tokenizer


def role_id(tokenizer: Tokenizer, role: str) -> int | None:
    """The id of the token playing `role` (a Kiln spelling, SPECIAL_TOKENS) in tokenizer: the roles
    load_tokenizer read beside its file, Kiln's own spellings for a tokenizer made in memory; None
    for a role it has no token for (an hf source's tokenizer in a run that does not use the role)."""
    spelling = getattr(tokenizer, "kiln_roles", KILN_ROLES).get(role)
    return None if spelling is None else tokenizer.token_to_id(spelling)


def id_space(tokenizer: Tokenizer) -> int:
    """Ids in use, 0..n-1: the vocabulary size unless a pretrained one leaves gaps in its ids."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def special_ids(tokenizer: Tokenizer, roles: dict[str, str] | None = None) -> dict[str, int]:
    """Each role's id (keyed by Kiln's spelling), through `roles` where the tokenizer has its own spellings;
    a role `roles` does not name is left out."""
    roles = roles or KILN_ROLES
    return {role: tokenizer.token_to_id(roles[role]) for role in SPECIAL_TOKENS if role in roles}


def stage_stats(tokenizer_path: str | Path) -> dict:
    """The stats.json the tokenizer stage wrote beside the tokenizer.json at tokenizer_path; empty for
    a tokenizer.json that did not come from the stage."""
    stats = Path(tokenizer_path).with_name(STATS_FILE)
    return read_json(stats) if stats.is_file() else {}


def token_roles(tokenizer_path: str | Path) -> dict[str, str]:
    """Each role's spelling in the tokenizer.json at tokenizer_path, as the tokenizer stage recorded it
    in the stats.json beside it (an hf source's tokenizer names only the roles it has a token for);
    Kiln's own spellings where none is recorded (a tokenizer.json that did not come from the stage,
    or a stage output from before roles were recorded)."""
    recorded = stage_stats(tokenizer_path).get("special_tokens")
    return dict(recorded) if recorded else dict(KILN_ROLES)


def bos_token(tokenizer_path: str | Path) -> str | None:
    """The beginning-of-sequence token every sample starts with under the tokenizer.json at
    tokenizer_path, as the tokenizer stage recorded it in the stats.json beside it: an hf source's
    that adds one (source_bos), else None (every other route, or no stats.json: a tokenizer.json that
    did not come from the stage). An hf stage output from before the BOS was recorded is an error,
    not a silent layout without it."""
    stats = stage_stats(tokenizer_path)
    if stats.get("kind") == "hf" and "bos_token" not in stats:
        raise KilnError(
            f"tokenizer: {Path(tokenizer_path).with_name(STATS_FILE)} predates Kiln's record of the source's BOS "
            "(bos_token); rerun the tokenizer stage (snakemake --forcerun tokenizer) so that every sample starts "
            "as the source's did"
        )
    return stats.get("bos_token")


def bos_id(tokenizer: Tokenizer) -> int | None:
    """The id of the BOS that load_tokenizer read beside the tokenizer's file (bos_token), else None."""
    token = getattr(tokenizer, "kiln_bos", None)
    if token is None:
        return None
    found = tokenizer.token_to_id(token)
    if found is None:
        raise KilnError(
            f"tokenizer: the recorded bos_token {token!r} is not in the vocabulary; rerun the tokenizer stage"
        )
    return found


def with_bos(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    """ids of a text the model reads from its start, as training laid out every sample: the BOS
    first when the tokenizer has one (bos_id), else ids unchanged."""
    bos = bos_id(tokenizer)
    return list(ids) if bos is None else [bos, *ids]


def source_tokenizer_sha256(tokenizer_path: str | Path) -> str | None:
    """The sha256 of the HF tokenizer.json an hf tokenizer extends (recorded beside it), else None."""
    return stage_stats(tokenizer_path).get("source_tokenizer_sha256")


def export_vocab_size(tokenizer_path: str | Path, model_rows: int) -> int:
    """The embedding (and head) rows a Hugging Face export of a model with model_rows keeps: for a run
    on an hf source's tokenizer, the source's vocab_size, or the tokenizer's ids where it appended
    tokens beyond them (Kiln's padding to a multiple of 64 is a training detail: a drop-in continuation
    exports exactly the source's rows); model_rows for every other route, and for a stage output from
    before the source's size was recorded."""
    stats = stage_stats(tokenizer_path)
    if stats.get("source_vocab_size") is None:
        return model_rows
    return min(model_rows, max(stats["source_vocab_size"], stats["vocab_size"]))


def role_ids(tokenizer: Tokenizer, tokenizer_path: str | Path) -> dict[str, int]:
    """Each role's id in the tokenizer loaded from tokenizer_path, for the roles it holds (see token_roles)."""
    ids = special_ids(tokenizer, token_roles(tokenizer_path))
    missing = [role for role, i in ids.items() if i is None]
    if missing:
        raise KilnError(
            f"tokenizer: {tokenizer_path} has no token for {', '.join(missing)} (nor does the stats.json beside it "
            "name one); rerun the tokenizer stage, which adds them"
        )
    return ids
