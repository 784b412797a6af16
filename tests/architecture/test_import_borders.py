"""The layer borders of DESIGN.md §2, checked on every import statement (top level or inside functions).

- engine/ never imports Qt, pyqtgraph, the app, or transformers (the test oracle is never a runtime dependency).
- app/ reaches torch and the engine only through its workers: app/worker.py (the chat engine) and app/wizards/jobs.py
  (the wizards' background jobs), plus the wizards' screenshot driver. Views, widgets and dialogs only emit and receive
  signals.
- Only engine/native.py imports the compiled module engine._native.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# app/wizards/__main__.py is the screenshot driver (not part of the running app): it makes a model with make-model first.
APP_WORKERS = {"app/worker.py", "app/wizards/jobs.py", "app/wizards/__main__.py"}


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


def test_the_checker_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from PySide6 import QtCore\n    import torch\n")
    assert imported_modules(f) == [(2, "PySide6"), (2, "PySide6.QtCore"), (3, "torch")]


def test_engine_never_imports_qt_app_or_transformers():
    assert violations("engine", ("PySide6", "shiboken6", "pyqtgraph", "app", "transformers")) == []


def test_app_reaches_torch_and_engine_only_through_its_workers():
    assert violations("app", ("torch", "engine", "numpy"), APP_WORKERS) == []


@pytest.mark.parametrize("folder", ["engine", "app"])
def test_only_engine_native_imports_the_compiled_module(folder):
    assert violations(folder, ("engine._native",), {"engine/native.py"}) == []
