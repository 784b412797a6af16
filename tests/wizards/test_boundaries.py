"""The wizards' import border: only app/wizards/jobs.py reaches the engine, lazily, inside job functions that run on a
QThread; no wizard module imports torch; opening a wizard does not import the engine or torch."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

WIZARDS = pathlib.Path(__file__).resolve().parents[2] / "app" / "wizards"


def _imports(path: pathlib.Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level?) for every import in the file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module.split(".")[0], id(node) in top))
    return out


def test_only_jobs_touches_the_engine_and_only_lazily():
    for path in WIZARDS.glob("*.py"):
        imports = _imports(path)
        assert ("torch", True) not in imports and ("torch", False) not in imports, path.name
        engine = [at_top for name, at_top in imports if name == "engine"]
        if path.name in ("jobs.py", "__main__.py"):  # __main__ makes a model for its screenshots, lazily
            assert not any(engine), f"{path.name} imports the engine at module level"
        else:
            assert engine == [], f"{path.name} imports the engine"


def test_opening_the_wizards_does_not_import_engine_or_torch():
    code = ("import sys\nfrom PySide6.QtWidgets import QApplication\napp = QApplication([])\n"
            "from app.wizards.hardware_wizard import HardwareWizard\n"
            "from app.wizards.convert_wizard import ConvertWizard\n"
            "h, c = HardwareWizard(), ConvertWizard()\n"
            "print('torch' in sys.modules, 'engine' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["False", "False"], out.stderr
