"""The app as a user starts it: `python -m tessera.app` in a subprocess, offscreen, from another working directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_app(tmp_path, *args, timeout=120):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TESSERA_DATA_DIR=str(tmp_path / "data"),
               PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, "-m", "tessera.app", *args], cwd=tmp_path, env=env, capture_output=True,
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


@pytest.mark.slow
def test_model_and_prompt_from_the_command_line(tmp_path, tiny_gguf_model):
    from tessera.app.settings import Settings
    from tessera.app.store import ConversationStore

    data = tmp_path / "data"
    data.mkdir()
    s = Settings(data / "settings.ini")
    s.set("sampling/max_tokens", 6)
    s.sync()
    proc = run_app(tmp_path, "--model", str(tiny_gguf_model), "--prompt", "Hello", "--quit-when-done",
                   "--screenshot", str(tmp_path / "chat.png"))
    assert_clean(proc)
    store = ConversationStore(data / "conversations.sqlite3")
    (conv,) = store.conversations()
    user, reply = store.messages(conv.id)
    assert user.content == "Hello" and reply.state == "done" and 1 <= reply.metrics["generated_tokens"] <= 6
    assert Settings(data / "settings.ini").get("recent/models") == [str(tiny_gguf_model)]


@pytest.mark.slow
def test_without_a_model_argument_the_demo_model_opens(tmp_path):
    from tessera.app import paths
    from tessera.app.store import ConversationStore

    demo = paths.demo_model()
    assert demo is not None, "the demo model ships in tessera/resources/demo/"
    proc = run_app(tmp_path, "--prompt", "What is 12 + 30?", "--quit-when-done")
    assert_clean(proc)
    store = ConversationStore(tmp_path / "data" / "conversations.sqlite3")
    (conv,) = store.conversations()
    assert conv.model == demo.name
    assert store.messages(conv.id)[-1].state == "done"


@pytest.mark.slow
def test_serve_and_remote_screenshots(tmp_path):
    """The scripted shots of the Serve panel (serving the demo model) and of the Remote dialog after a connection test
    against a real `tessera-cli serve` on a free port."""
    import re
    from pathlib import Path

    demo = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"
    serve_shot, remote_shot = tmp_path / "serve.png", tmp_path / "remote.png"
    proc = run_app(tmp_path, "--model", str(demo), "--screenshot-target", "serve", "--screenshot", str(serve_shot))
    assert_clean(proc)
    assert serve_shot.stat().st_size > 10_000
    server = subprocess.Popen([sys.executable, "-m", "tessera.engine", "serve", str(demo), "--port", "0"],
                              stderr=subprocess.PIPE, text=True)
    try:
        url = next(m.group(1) for line in server.stderr if (m := re.search(r"at (http://\S+/v1);", line)))
        proc = run_app(tmp_path, "--no-demo", "--screenshot-target", "remote", "--remote-url", url,
                       "--screenshot", str(remote_shot))
    finally:
        server.terminate()
        server.wait(30)
    assert_clean(proc)
    assert remote_shot.stat().st_size > 10_000
