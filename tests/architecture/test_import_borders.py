"""The layer borders of DESIGN.md §2, in one place: checked on every import statement (top level or inside functions),
and at run time for what an import pulls in.

- tessera/engine/ never imports Qt, pyqtgraph, the app, or transformers (the test oracle is never a runtime dependency).
- tessera/app/ reaches the engine and torch only through its two worker doors: tessera/app/worker.py (the chat engine,
  with tessera/app/serving.py, the half of it that serves the loaded model and runs on the worker thread, imported by
  nobody else) and tessera/app/wizards/jobs.py (the wizards' background jobs), plus the wizards' screenshot driver.
  Views, widgets and dialogs only emit and receive signals, and never mention the engine.
- No torch before a model loads: importing the window, the worker, the app's entry point or the wizards, and opening
  the wizards, imports no torch (the workers may import the engine's plain modules, engine.errors and engine.events).
- Only tessera/engine/native.py and tessera/engine/backends.py (the backend list) import the compiled module
  engine._native.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# tessera/app/wizards/__main__.py is the screenshot driver (not part of the running app): it makes a model with
# make-model first.
APP_WORKERS = {"tessera/app/worker.py", "tessera/app/serving.py", "tessera/app/wizards/jobs.py",
               "tessera/app/wizards/__main__.py"}
NATIVE_IMPORTERS = {"tessera/engine/native.py", "tessera/engine/backends.py"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def violations(folder: str, forbidden: tuple[str, ...], allowed_files: set[str] = frozenset()) -> list[str]:
    found = []
    for path in sources(folder):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed_files:
            continue
        for line, name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{rel}:{line} imports {name}")
    return found


def test_only_the_worker_imports_its_serving_half():
    serving = "tessera.app.serving"
    importers = [p.relative_to(ROOT).as_posix() for p in sources("tessera/app")
                 if any(name == serving or name.startswith(serving + ".") for _, name in imported_modules(p))]
    assert importers == ["tessera/app/worker.py"]


def test_the_checker_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from PySide6 import QtCore\n    import torch\n")
    assert imported_modules(f) == [(2, "PySide6"), (2, "PySide6.QtCore"), (3, "torch")]


def test_engine_never_imports_qt_app_or_transformers():
    assert violations("tessera/engine", ("PySide6", "shiboken6", "pyqtgraph", "tessera.app", "transformers")) == []


def test_app_reaches_torch_and_engine_only_through_its_workers():
    assert violations("tessera/app", ("torch", "tessera.engine", "numpy"), APP_WORKERS) == []


def test_no_wizard_module_imports_torch():
    assert violations("tessera/app/wizards", ("torch",)) == []


def test_views_never_mention_the_engine():
    views = ROOT / "tessera" / "app" / "views"
    hits = [p.name for p in views.rglob("*.py") if "engine" in p.read_text(encoding="utf-8")]
    assert hits == []


@pytest.mark.parametrize("folder", ["tessera/engine", "tessera/app"])
def test_only_native_and_the_backend_list_import_the_compiled_module(folder):
    assert violations(folder, ("tessera.engine._native",), NATIVE_IMPORTERS) == []


def _imports_torch(code: str) -> str:
    code = "import sys\n" + code + "\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"})
    return out.stdout.strip() or out.stderr


def test_no_torch_before_a_model_loads():
    modules = "tessera.app.main_window, tessera.app.worker, tessera.app.__main__, tessera.app.wizards.jobs"
    assert _imports_torch(f"import {modules}") == "False"


def test_opening_the_wizards_imports_no_torch():
    code = ("from PySide6.QtWidgets import QApplication\napp = QApplication([])\n"
            "from tessera.app.wizards.hardware_wizard import HardwareWizard\n"
            "from tessera.app.wizards.convert_wizard import ConvertWizard\n"
            "h, c = HardwareWizard(), ConvertWizard()")
    assert _imports_torch(code) == "False"
