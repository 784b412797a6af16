"""How the app words the work left to save a first load's packs (engine.pack_store): the packs to write, and before
them, for a file version seen for the first time, the bytes of the model file still to hash for their keys."""

from __future__ import annotations


def work_left(left: int, hashing: int) -> str:
    """"5.13 GB left to write", or "5.13 GB left to write, after hashing 7.50 GB of the model file" (`left`: all the
    work in bytes, hashing included)."""
    text = f"{max(left - hashing, 0) / 1e9:.2f} GB left to write"
    return text + (f", after hashing {hashing / 1e9:.2f} GB of the model file" if hashing > 0 else "")
