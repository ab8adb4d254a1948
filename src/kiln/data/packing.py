"""How documents become token sequences: a sample is one document, or (with repository context) the
consecutive files of one repository, laid out as pieces the encoder turns into ids.

  document     text <|endoftext|>                      (train: FIM-transformed, kiln.data.fim)
  repository   <repo_name>name<file_sep>path\\ncode<file_sep>path\\ncode...<|endoftext|>
               (StarCoder2; FIM, on the train side, is applied to each file's code on its own and
               never to the repository name or the paths)

A run whose tokenizer comes from a source that starts every document with a beginning-of-sequence
token (a Llama's <s> or <|begin_of_text|>: kiln.data.tokenizer.bos_token) puts it first in every
sample, train side (FIM or not) and validation side, before <repo_name> with repository context:
`<bos> text <|endoftext|>`, the layout the source was pretrained on. The piece `BOS` names that
role; the run's token for it comes with the other roles' ids.

A piece is a special token's spelling, or a span (string, start, end) of text: a document's text is
never copied to be laid out. A sample's id is its first document's id, which is what the train/val
split hashes, so a repository lands whole on one side.
"""

from __future__ import annotations

from collections import Counter

from kiln.config.data_sections import Fim
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.fim import fim_pieces
from kiln.data.sources import Document

EOS, REPO_NAME, FILE_SEP = SPECIAL_TOKENS[0], "<repo_name>", "<file_sep>"
BOS = "<bos>"  # the piece of a source's beginning-of-sequence role (only ever an id, never text)

Span = tuple[str, int, int]
Piece = str | Span


def group_samples(repos: list[str | None], repo_context: bool) -> list[list[int]]:
    """Indices of the documents of each sample, in order, from each document's repository: consecutive
    files of one repository together when repo_context is on, else one document per sample."""
    groups: list[list[int]] = []
    for i, repo in enumerate(repos):
        if repo_context and repo is not None and groups and repos[groups[-1][-1]] == repo:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _whole(text: str) -> list[Piece]:
    return [(text, 0, len(text))] if text else []


def sample_pieces(
    docs: list[Document], repo_context: bool, fim: Fim | None, seed: int, modes: Counter, bos: bool = False
) -> list[Piece]:
    """The pieces of one sample, BOS first when `bos` (the run's tokenizer has one), EOS last; fim None
    lays it out plain (the validation side). Each document's FIM mode is counted in `modes`."""
    as_repo = repo_context and docs[0].repo is not None
    pieces: list[Piece] = [BOS] if bos else []
    if as_repo:
        pieces += [REPO_NAME, *_whole(docs[0].repo)]
    for doc in docs:
        if as_repo:
            pieces += [FILE_SEP, *_whole(doc.path + "\n")]
        if fim is None:
            pieces += _whole(doc.text)
            continue
        mode, parts = fim_pieces(len(doc.text), seed, doc.id, fim)
        modes[mode] += 1
        pieces += [p if isinstance(p, str) else (doc.text, p[0], p[1]) for p in parts]
    pieces.append(EOS)
    return pieces


def metadata_bytes(docs: list[Document], repo_context: bool) -> int:
    """UTF-8 bytes of the text a sample adds beyond its documents: repository name and paths."""
    if not (repo_context and docs[0].repo is not None):
        return 0
    return len(docs[0].repo.encode("utf-8")) + sum(len(d.path.encode("utf-8")) + 1 for d in docs)
