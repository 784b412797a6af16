"""Import borders (STYLE 16-18): only app/worker.py touches the engine or torch; views never mention the engine;
QSettings only in app/settings.py. Checked on the source, so a violation fails here before it ships."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

APP = pathlib.Path(__file__).resolve().parents[2] / "app"
OWN = [p for p in APP.rglob("*.py") if "wizards" not in p.parts]


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_worker_imports_engine_or_torch():
    offenders = [p.relative_to(APP).as_posix() for p in OWN
                 if imported_modules(p) & {"engine", "torch"} and p.name != "worker.py"]
    assert offenders == []


def test_views_never_mention_the_engine():
    hits = [p.name for p in (APP / "views").rglob("*.py") if "engine" in p.read_text()]
    assert hits == []


def test_importing_the_window_does_not_import_torch():
    code = ("import sys, app.main_window, app.worker, app.__main__; "
            "print('torch' in sys.modules, 'engine' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["False", "False"], out.stderr
