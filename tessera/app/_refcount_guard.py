"""Work around a PySide6 reference-count bug seen with PySide6/shiboken6 6.12.0 on CPython 3.11.

In that build every Python call of a C++ method that returns void (`label.setText(...)`, `processEvents()`) and every
`Signal.emit` takes one reference from `None` (or `True`) without giving it back: the code assumes PEP 683's immortal
singletons, which only exist from CPython 3.12. After a few thousand such calls the count reaches zero and the
interpreter aborts with "Fatal Python error: none_dealloc" — in this app, a few minutes of streaming.

`apply()` measures the drift once and, only when it is there, lifts the reference counts of None, True and False by
2**40 — what CPython 3.12 does by making them immortal. These singletons are never freed anyway, so a larger count
changes nothing else. Nothing happens on CPython >= 3.12 or on a PySide6 build without the bug.
"""

from __future__ import annotations

import ctypes
import sys

HEADROOM = 1 << 40
_applied = False


def leaks_none(calls: int = 64) -> bool:
    """True when calling a void Qt method takes references from None."""
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(calls):
        probe.setObjectName("probe")
    return sys.getrefcount(None) - before <= -calls // 2


def apply() -> bool:
    """Make None/True/False effectively immortal if this PySide6 build leaks their references. Returns True if
    lifted."""
    global _applied
    if _applied or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return _applied
    if not leaks_none():
        return False
    for obj in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt is the first field of every PyObject
        refcnt.value += HEADROOM
    _applied = True
    return True
