"""Tessera's desktop app (PySide6). Start it with `python -m tessera.app` or the `tessera` launcher."""

from tessera.app import _refcount_guard

_refcount_guard.apply()
