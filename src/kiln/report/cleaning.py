"""The report's cleaning section: what the download stage dropped from each source, and why, from its
manifest (kiln.data.raw): exact and near duplicates, each quality filter's count, and the first
documents each one dropped; then what pretokenize left out of the train side for sharing text with
the held-out split (meta.json's heldout_overlap, kiln.data.heldout)."""

from __future__ import annotations

REASONS = (
    "skipped_non_utf8",
    "skipped_empty",
    "skipped_short",
    "skipped_long",
    "skipped_duplicate",
    "skipped_contaminated",
)


def cleaning_section(manifest: dict) -> list[str]:
    """Markdown lines: a table of kept and dropped documents per source, then examples by reason."""
    sources = manifest["sources"]
    filters = sorted({name for s in sources.values() for name in s.get("skipped_filter", {})})
    near = manifest.get("near_dup", {})
    head = ["source", "kept", *(r.removeprefix("skipped_").replace("_", "-") for r in REASONS), "near-duplicate"]
    lines = [
        "## Cleaning (download)",
        "",
        "Near duplicates: "
        + (
            f"MinHash LSH, {near['shingle']}-word shingles, {near['bands']} bands x {near['rows']} rows "
            f"(Jaccard ~{near['threshold']:.2f}), seed {near['seed']}."
            if near.get("enabled")
            else "not removed (download.near_dup.enabled: false)."
        ),
        "",
        "| " + " | ".join(head + filters) + " |",
        "|---|" + "---:|" * (len(head) - 1 + len(filters)),
    ]
    for name, s in sources.items():
        cells = [
            name,
            f"{s['rows']:,}",
            *(f"{s.get(r, 0):,}" for r in REASONS),
            f"{s.get('skipped_near_duplicate', 0):,}",
        ]
        cells += [f"{s.get('skipped_filter', {}).get(f, 0):,}" for f in filters]
        lines.append("| " + " | ".join(cells) + " |")
    examples = [
        f"- {reason}, {name}: `{ex['id']}` ({ex['why']})"
        for name, s in sources.items()
        for reason, shown in s.get("examples", {}).items()
        for ex in shown
    ]
    return lines + (["", "Examples of what was dropped:", "", *examples] if examples else [])


def heldout_section(meta: dict) -> list[str]:
    """Markdown lines, a blank one last: the train samples left out for overlapping the held-out split,
    with examples; none for a tokens folder from before the setting."""
    overlap = meta.get("heldout_overlap")
    if overlap is None:
        return []
    lines = ["## Decontamination against the held-out split (pretokenize)", ""]
    if not overlap["ngram"]:
        return lines + ["Not run (pretokenize.heldout_ngram: 0).", ""]
    lines.append(
        f"{overlap['docs']:,} train documents ({overlap['samples']:,} samples) left out: each shares a run of "
        f"{overlap['ngram']} words with a held-out document that at most {overlap['guard']} train samples share."
    )
    shown = [f"- `{', '.join(e['doc_ids'])}`: {e['why']}" for e in overlap["examples"]]
    return lines + (["", *shown] if shown else []) + [""]
