"""The PySide6 None-refcount workaround (tessera/app/_refcount_guard.py): with `app` imported, many void Qt calls and
emits must not abort the interpreter, whatever the PySide6 build does with None's reference count."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import sys
from tessera import app  # applies the guard
from PySide6.QtCore import QObject, Signal
class O(QObject):
    s = Signal(int)
o = O()
for i in range(300000):
    o.setObjectName("x")  # returns void
    o.s.emit(i)  # returns bool
assert sys.getrefcount(None) > 0 and sys.getrefcount(True) > 0
print("ok", app._refcount_guard._applied)
"""


def test_many_void_calls_do_not_abort():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


def test_guard_only_acts_when_the_leak_is_there():
    from tessera.app import _refcount_guard as g

    if sys.version_info >= (3, 12):
        assert not g._applied  # immortal singletons: nothing to do
    else:
        assert g._applied == g.leaks_none()  # lifted exactly when this PySide6 build takes references
