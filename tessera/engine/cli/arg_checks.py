"""Command-line values checked before anything loads: a sentence for each, never a traceback (issue 13 items 8, 10)."""

from __future__ import annotations

import os


def max_threads() -> int:
    """More threads than this only thrash: 4 per CPU, at least 64."""
    return max(64, 4 * (os.cpu_count() or 1))


def threads_problem(threads: int | None) -> str | None:
    if threads is None:
        return None
    if threads < 1:
        return f"must be >= 1, got {threads}"
    if threads > max_threads():
        return (f"{threads} is more than this machine can use: it has {os.cpu_count()} CPUs "
                f"(at most {max_threads()} threads are accepted)")
    return None


def text_problem(text: str) -> str | None:
    """A command-line string that is not valid UTF-8 arrives with lone surrogates (Python's surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = text[e.start : e.end].encode("utf-8", "surrogateescape")
        return f"is not valid UTF-8 (bytes {raw!r} at character {e.start}); check the terminal's encoding"
    return None
