"""The app as a user starts it: `python -m app` in a subprocess, offscreen, from another working directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_app(tmp_path, *args, timeout=120):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TESSERA_DATA_DIR=str(tmp_path / "data"),
               PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


def assert_clean(proc):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "Error" not in out.replace("propagateSizeHints", ""), out


@pytest.mark.slow
def test_app_starts_and_quits_without_a_traceback(tmp_path):
    shot = tmp_path / "welcome.png"
    proc = run_app(tmp_path, "--no-demo", "--quit-after", "1000", "--screenshot", str(shot))
    assert_clean(proc)
    assert shot.stat().st_size > 10_000  # a real rendered window
    assert (tmp_path / "data" / "conversations.sqlite3").is_file()


@pytest.mark.slow
def test_bad_model_argument_shows_an_error_not_a_traceback(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    proc = run_app(tmp_path, "--model", str(bad), "--quit-after", "300")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
