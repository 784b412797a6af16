"""packaging/uninstall.sh offers to remove the packed-weight cache (issue 12 item 5): --remove-cache removes only the
cache's own entries, --keep-cache and a non-interactive run keep it and say how to remove it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNINSTALL = ROOT / "packaging" / "uninstall.sh"


def _setup(tmp_path: Path) -> tuple[Path, Path, dict]:
    home = tmp_path / "home"
    prefix = home / ".local" / "share" / "tessera"
    prefix.mkdir(parents=True)
    (prefix / "thing").write_text("installed")
    (prefix / "install-manifest.txt").write_text(f"# tessera\ndir {prefix}\nfile {prefix / 'thing'}\n"
                                                 f"file {prefix / 'install-manifest.txt'}\n")
    cache = home / ".cache" / "tessera" / "packed"
    for rel in ("layers/abc.pack", "models/abc.json", "model-AVX512-v3/layer000-x.pack"):
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(b"\0" * 1000)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "TESSERA_"))}
    env["HOME"] = str(home)
    return prefix, cache, env


def _run(env, *args):
    return subprocess.run(["bash", str(UNINSTALL), *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def test_remove_cache_removes_the_cache_and_nothing_else(tmp_path):
    prefix, cache, env = _setup(tmp_path)
    r = _run(env, "--remove-cache")
    assert r.returncode == 0, r.stderr
    assert not prefix.exists() and not cache.exists() and not cache.parent.exists()
    assert "removed the packed-weight cache" in r.stderr


def test_a_users_file_in_the_cache_folder_stays(tmp_path):
    prefix, cache, env = _setup(tmp_path)
    (cache / "mine.txt").write_text("keep me")
    assert _run(env, "--remove-cache").returncode == 0
    assert sorted(p.name for p in cache.iterdir()) == ["mine.txt"]


def test_without_a_terminal_the_cache_is_kept_and_the_way_to_remove_it_said(tmp_path):
    prefix, cache, env = _setup(tmp_path)
    r = _run(env)
    assert r.returncode == 0 and not prefix.exists()
    assert (cache / "layers" / "abc.pack").is_file() and "--remove-cache" in r.stderr
    r = _run(env, "--keep-cache")
    assert r.returncode == 1 and (cache / "layers" / "abc.pack").is_file()  # nothing installed there any more
    r = _run(env, "--remove-cache")  # what the message said: works after the app itself is gone
    assert r.returncode == 0 and not cache.exists(), r.stderr
