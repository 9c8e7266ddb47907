"""Counts in words: ``1 wave``, ``2 waves``.  One function, so that no message says "1 waves" again."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun``, in the plural (``nouns``, default ``noun + "s"``) unless ``n`` is 1."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
