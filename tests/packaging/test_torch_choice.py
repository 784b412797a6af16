"""Which torch build ./run.sh, ./test.sh (scripts/setup_env.sh) and packaging/install.sh install: CUDA when nvidia-smi
answers, else PyTorch's CPU index, else (index unreachable) pip's configured index with a warning; all from the one
function in scripts/torch_choice.sh. setup_env.sh runs here in a scratch tree with a stand-in `.venv/bin/python` that
records the pip commands, so nothing is installed."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHOICE = ROOT / "scripts" / "torch_choice.sh"


@pytest.fixture
def cpu_index(tmp_path):
    """A local stand-in for https://download.pytorch.org/whl/cpu: answers 200 for /torch/."""
    served = tmp_path / "index"
    (served / "whl" / "cpu" / "torch").mkdir(parents=True)
    page = "<a href='torch-2.13.0+cpu-cp311-none-any.whl'>torch</a>"
    (served / "whl" / "cpu" / "torch" / "index.html").write_text(page)
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(served), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"  # the check asks for URL/torch/
    server.shutdown()


@pytest.fixture
def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"  # nothing listens there any more


def _bin(tmp_path: Path, nvidia: str | None) -> str:
    """PATH with a stand-in nvidia-smi: "gpu" answers, "broken" fails as without a driver, None: not installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if nvidia == "gpu":
        fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA GeForce RTX 4090'\n")
    elif nvidia == "broken":
        fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    if fake.exists():
        fake.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def _choose(tmp_path: Path, index_url: str, nvidia: str | None, requested: str = "") -> list[str]:
    env = dict(os.environ, PATH=_bin(tmp_path, nvidia), TESSERA_TORCH_CPU_INDEX=index_url, PYTHON=sys.executable)
    r = subprocess.run(["bash", "-c", f'source "{CHOICE}"; choose_torch "{requested}" "torch==2.13.0"; '
                                      'printf "%s\\n%s\\n%s\\n" "$torch_spec" "$torch_index" "$torch_kind"'],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_gpu_gets_the_default_index(tmp_path, cpu_index):
    spec, index, kind = _choose(tmp_path, cpu_index, "gpu")
    assert (spec, index) == ("torch==2.13.0", "") and kind.startswith("CUDA build")


@pytest.mark.parametrize("nvidia", [None, "broken"])
def test_no_gpu_gets_the_cpu_index(tmp_path, cpu_index, nvidia):
    spec, index, kind = _choose(tmp_path, cpu_index, nvidia)
    assert (spec, index) == ("torch==2.13.0", cpu_index) and kind.startswith("CPU build (no working nvidia-smi)")


def test_unreachable_cpu_index_falls_back_and_says_so(tmp_path, closed_port_url):
    spec, index, kind = _choose(tmp_path, closed_port_url, None)
    assert (spec, index) == ("torch==2.13.0", "")
    assert f"{closed_port_url} cannot be reached" in kind and "CUDA build" in kind and "TESSERA_TORCH" in kind


def test_requested_build_wins(tmp_path, cpu_index):
    assert _choose(tmp_path, cpu_index, None, "torch==2.5.1+cu121") == ["torch==2.5.1+cu121", "", "as requested"]


def _scratch_tree(tmp_path: Path) -> Path:
    """The files setup_env.sh reads, and a .venv whose python records its arguments instead of running pip."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("setup_env.sh", "torch_choice.sh"):
        shutil.copy(ROOT / "scripts" / name, tree / "scripts" / name)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    shutil.copy(ROOT / "CMakeLists.txt", tree / "CMakeLists.txt")
    (tree / "native").mkdir()
    (tree / "native" / "kernel.cpp").write_text("// stand-in\n")
    venv_bin = tree / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    python = venv_bin / "python"
    python.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/../calls.log"\n'
                      'case "$1" in -c) echo "2.13.0+cpu CPU build" ;; esac\n')
    python.chmod(0o755)
    return tree


def _setup_env(tree: Path, tmp_path: Path, index_url: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=_bin(tmp_path, None), TESSERA_TORCH_CPU_INDEX=index_url, PYTHON=sys.executable)
    env.pop("TESSERA_TORCH", None)
    env.pop("TESSERA_EXTRAS", None)
    return subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/setup_env.sh"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)


def test_setup_env_installs_the_chosen_build_once(tmp_path, cpu_index):
    tree = _scratch_tree(tmp_path)
    first = _setup_env(tree, tmp_path, cpu_index)
    assert first.returncode == 0, first.stderr
    calls = (tree / ".venv" / "calls.log").read_text().splitlines()
    assert f"-m pip install -q torch==2.13.0 --index-url {cpu_index}" in calls
    assert any(c.startswith("-m pip install -q --no-build-isolation -e .") for c in calls)
    assert f"torch: torch==2.13.0 from {cpu_index}, CPU build (no working nvidia-smi)" in first.stderr
    assert "torch in .venv: 2.13.0+cpu CPU build" in first.stderr
    assert calls[-1] == "-m compileall -q tessera"  # the bytecode, after the install
    # nothing changed: no second install (the stamp), and not even the index check; only the (cheap, up-to-date)
    # bytecode pass, which keeps Tessera's .pyc current after its sources change
    (tree / ".venv" / "calls.log").unlink()
    again = _setup_env(tree, tmp_path, "http://127.0.0.1:9/unused")
    assert again.returncode == 0, again.stderr
    assert (tree / ".venv" / "calls.log").read_text().splitlines() == ["-m compileall -q tessera"]
    assert "installing" not in again.stderr


def test_setup_env_falls_back_where_the_cpu_index_is_unreachable(tmp_path, closed_port_url):
    tree = _scratch_tree(tmp_path)
    r = _setup_env(tree, tmp_path, closed_port_url)
    assert r.returncode == 0, r.stderr
    calls = (tree / ".venv" / "calls.log").read_text().splitlines()
    assert "-m pip install -q torch==2.13.0" in calls  # pip's configured index: no --index-url
    assert not any("--index-url" in c for c in calls)
    assert "cannot be reached" in r.stderr


def test_installer_shows_the_same_choice(tmp_path, cpu_index, closed_port_url):
    install = ROOT / "packaging" / "install.sh"

    def show(index_url: str, nvidia: str | None, *extra: str) -> str:
        env = dict(os.environ, HOME=str(tmp_path), PATH=_bin(tmp_path, nvidia), TESSERA_TORCH_CPU_INDEX=index_url,
                   PYTHON=sys.executable)
        r = subprocess.run(["bash", str(install), "--show-torch", *extra], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert show(cpu_index, "gpu").startswith("torch  # CUDA build")
    assert show(cpu_index, "broken").startswith(f"torch --index-url {cpu_index}  # CPU build")
    assert "cannot be reached" in show(closed_port_url, "broken")
    assert show(cpu_index, None, "--torch", "torch==2.5.1").startswith("torch==2.5.1  # as requested")
