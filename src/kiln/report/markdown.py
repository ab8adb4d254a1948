"""Markdown pieces the report's sections share (kiln.report.run, each eval metric's report.py)."""

from __future__ import annotations


def fence(text: str) -> str:
    """A code block holding `text` (a ``` inside it shown as ʼʼʼ, so it cannot close the block)."""
    return "```\n" + text.replace("```", "ʼʼʼ") + "\n```"


def number(value) -> str:
    """A table cell: n/a for None, a float to 4 places, anything else as it prints."""
    return "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
