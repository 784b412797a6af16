"""Tessera's desktop app (PySide6). Start it with `python -m app` or the `tessera` launcher."""

from app import _refcount_guard

_refcount_guard.apply()
