"""packaging/install.sh in a temporary HOME: venv, GUI entry, icon, a .desktop file desktop-file-validate accepts, a
manifest of everything created; uninstall.sh then leaves HOME exactly as it was."""

from __future__ import annotations

import configparser
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL, UNINSTALL = ROOT / "packaging" / "install.sh", ROOT / "packaging" / "uninstall.sh"


def _snapshot(home: Path) -> set[str]:
    return {str(p.relative_to(home)) for p in home.rglob("*")}


def _env(home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    # pip runs `rustc --version` for its user-agent string; where rustc is a rustup proxy that creates ~/.rustup.
    # Not the installer's doing: keep rustup's state out of the HOME being checked.
    env.update(HOME=str(home), PYTHON=sys.executable, RUSTUP_HOME=str(home.parent / "rustup-state"), **extra)
    return env


def _read_entry(path: Path) -> dict:
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(path)
    return dict(cp["Desktop Entry"])


@pytest.mark.slow
def test_install_then_uninstall_leaves_nothing(tmp_path):
    home = tmp_path / "home with space"
    (home / ".local" / "share" / "applications").mkdir(parents=True)
    (home / ".local" / "share" / "applications" / "other.desktop").write_text("[Desktop Entry]\n")  # not ours
    before = _snapshot(home)
    env = _env(home)
    r = subprocess.run(["bash", str(INSTALL), "--system-site-packages", "--desktop"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    share = home / ".local" / "share"
    venv = share / "tessera" / "venv"
    entry_path = share / "applications" / "tessera.desktop"
    entry = _read_entry(entry_path)
    exe = str(venv / "bin" / "tessera")
    site = next((venv / "lib").glob("python3*/site-packages"))
    native = list((site / "tessera" / "engine").glob("_native*.so"))
    assert native, "the native kernels were not built into the environment"
    assert (site / "tessera" / "resources" / "icons" / "tessera.svg").is_file()  # run-time data ships in the wheel
    # One top-level name in site-packages, so Tessera cannot collide with another project's packages (issue
    # 15 item 21): every installed path is in the tessera package, its dist-info, or ../../../bin (launchers).
    record = next(site.glob("tessera-*.dist-info")) / "RECORD"
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines() if line}
    assert tops <= {"tessera", record.parent.name, ".."}, f"installed beside tessera/: {tops}"
    assert entry["Exec"] == f'"{exe}"'  # the path has a space: quoted per the Desktop Entry spec
    assert entry["TryExec"] == exe and os.access(exe, os.X_OK)
    assert entry["Terminal"] == "false" and entry["Type"] == "Application"
    assert Path(entry["Icon"]).is_file() and Path(entry["Icon"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    desk = home / "Desktop" / "tessera.desktop"
    assert desk.read_text() == entry_path.read_text() and desk.stat().st_mode & stat.S_IXUSR
    if shutil.which("desktop-file-validate"):
        v = subprocess.run(["desktop-file-validate", str(entry_path)], capture_output=True, text=True)
        assert v.returncode == 0 and v.stdout.strip() == "", v.stdout + v.stderr
    # The environment runs Tessera: the GUI entry point starts and quits (offscreen), the CLI answers.
    app_data = tmp_path / "app-data"
    run_env = dict(env, QT_QPA_PLATFORM="offscreen", TESSERA_DATA_DIR=str(app_data))
    g = subprocess.run([exe, "--no-demo", "--quit-after", "300"], env=run_env, capture_output=True, text=True,
                       timeout=120)
    assert g.returncode == 0 and "Traceback" not in g.stderr, g.stderr
    c = subprocess.run([str(venv / "bin" / "tessera-cli"), "check", "--json", "--quick", "--no-gpu"], env=run_env,
                       capture_output=True, text=True, timeout=120)
    assert c.returncode == 0 and '"auto_backend"' in c.stdout, c.stderr
    manifest = (share / "tessera" / "install-manifest.txt").read_text().splitlines()
    listed = {line.split(" ", 1)[1] for line in manifest if not line.startswith("#")}
    assert {str(entry_path), str(desk), str(venv), entry["Icon"]} <= listed
    assert str(share / "applications") not in listed  # existed before: not ours to remove
    again = subprocess.run(["bash", str(INSTALL), "--system-site-packages"], env=env, capture_output=True, text=True)
    assert again.returncode == 1 and "already installed" in again.stderr

    u = subprocess.run(["bash", str(UNINSTALL)], env=env, capture_output=True, text=True, timeout=120)
    assert u.returncode == 0, u.stderr
    assert _snapshot(home) == before


def test_bad_arguments_are_named(tmp_path):
    r = subprocess.run(["bash", str(INSTALL), "--source", str(tmp_path)], env=_env(tmp_path), capture_output=True,
                       text=True)
    assert r.returncode == 1 and f"{tmp_path}: not a Tessera source checkout" in r.stderr
    assert not (tmp_path / ".local").exists()  # nothing created before the checks pass
    u = subprocess.run(["bash", str(UNINSTALL)], env=_env(tmp_path), capture_output=True, text=True)
    assert u.returncode == 1 and "install-manifest.txt: not found" in u.stderr


@pytest.mark.skipif(not shutil.which("desktop-file-validate"),
                    reason="desktop-file-validate missing: install Debian's desktop-file-utils (scripts/setup_env.sh "
                           "does it when run as root)")
def test_entry_template_validates(tmp_path):
    """The template as the installer fills it, with a quoted Exec path, passes desktop-file-validate cleanly."""
    text = (ROOT / "packaging" / "tessera.desktop.in").read_text()
    exe = tmp_path / "with space" / "tessera"
    text = text.replace("@EXEC@", f'"{exe}"').replace("@TRYEXEC@", str(exe)).replace("@ICON@", "/opt/tessera.png")
    assert "@" not in text
    entry = tmp_path / "tessera.desktop"
    entry.write_text(text)
    v = subprocess.run(["desktop-file-validate", str(entry)], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.strip() == "", v.stdout
