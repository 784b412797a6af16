"""`tessera-cli serve` as a user runs it: a subprocess on a free loopback port, answered through the openai client,
stopped with Ctrl-C; and the refusal to serve another address without a key."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import openai
from server_support import DEMO, NAME

CLI = [sys.executable, "-m", "tessera.engine"]


def test_serve_refuses_a_network_address_without_a_key():
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_API_KEY"}
    r = subprocess.run([*CLI, "serve", str(DEMO), "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 1
    assert "error: --host: 0.0.0.0 is reachable from other machines" in r.stderr and "--api-key" in r.stderr
    assert "loading" not in r.stderr  # refused before loading the model


def test_serve_answers_and_stops_on_ctrl_c():
    proc = subprocess.Popen([*CLI, "serve", str(DEMO), "--port", "0", "--api-key", "k3y", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True)
    try:
        url, deadline, lines = None, time.monotonic() + 120, []
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"at (http://127\.0\.0\.1:\d+/v1); API key required", line)
            url = m and m.group(1)
        assert url, "".join(lines)
        client = openai.OpenAI(base_url=url, api_key="k3y", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=NAME, temperature=0, max_tokens=80,
                                               messages=[{"role": "user", "content": "What is 12 + 30?"}])
        assert reply.choices[0].message.content.endswith("12 + 30 = 42.")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_help_lists_serve():
    r = subprocess.run([*CLI, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--api-key" in r.stdout and "--max-queue" in r.stdout
