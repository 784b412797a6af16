"""tessera/app/display_check.py (run by ./run.sh before the window): missing system libraries of Qt's platform plugin
are named with the packages and the install command; a display that cannot be opened, or none at all,
is said in words."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tessera.app import display_check

ROOT = Path(__file__).resolve().parents[2]

# what ldd printed for PySide6 6.12's libqxcb.so on a Debian 12 machine without libxcb-icccm4 and libxcb-keysyms1
LDD_MISSING = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007f85251a8000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-util.so.1 => /lib/x86_64-linux-gnu/libxcb-util.so.1 (0x00007f85251a0000)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
"""


def test_missing_libraries_are_read_from_ldd_once_each():
    assert display_check.missing_libraries(LDD_MISSING) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert display_check.missing_libraries("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n") == []


def test_install_commands_name_the_packages():
    cmds = display_check.install_commands(["libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-shape.so.0",
                                           "libxcb-xfixes.so.0"])
    assert cmds["debian"] == "sudo apt-get install libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxcb-xfixes0"
    assert cmds["fedora"] == "sudo dnf install xcb-util-wm xcb-util-keysyms libxcb"  # one package for both
    root = display_check.install_commands(["libxcb-cursor.so.0"], as_root=True)
    assert root == {"debian": "apt-get install libxcb-cursor0", "fedora": "dnf install xcb-util-cursor"}


def test_an_unknown_library_is_still_findable():
    cmds = display_check.install_commands(["libxcb-icccm.so.4", "libfoo.so.3"])
    assert cmds["debian"].startswith("sudo apt-get install libxcb-icccm4") and "apt-file search libfoo.so.3" in cmds[
        "debian"]
    assert cmds["fedora"] == "sudo dnf install xcb-util-wm 'libfoo.so.3()(64bit)'"  # RPM's automatic soname provides


def test_distro_family():
    assert display_check.distro_family('ID=ubuntu\nID_LIKE=debian\n') == "debian"
    assert display_check.distro_family('ID="rocky"\nID_LIKE="rhel centos fedora"\n') == "fedora"
    assert display_check.distro_family('ID=fedora\n') == "fedora"
    assert display_check.distro_family('ID=arch\n') == ""


def test_platform_follows_the_environment():
    assert display_check.platform({"DISPLAY": ":0"}) == "xcb"
    assert display_check.platform({"WAYLAND_DISPLAY": "wayland-0"}) == "wayland"
    assert display_check.platform({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}) == "offscreen"
    assert display_check.platform({"QT_QPA_PLATFORM": "wayland;xcb"}) == "wayland"
    assert display_check.platform({}) == ""


def _run(tmp_path: Path, ldd_output: str | None, **env_extra) -> subprocess.CompletedProcess:
    """`python -m tessera.app.display_check` with a stand-in ldd that prints ldd_output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if ldd_output is not None:
        (bin_dir / "ldd.out").write_text(ldd_output)
        ldd = bin_dir / "ldd"
        ldd.write_text(f'#!/bin/sh\ncat "{bin_dir}/ldd.out"\n')
        ldd.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", **env_extra)
    return subprocess.run([sys.executable, "-m", "tessera.app.display_check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_missing_packages_stop_the_launch_with_the_install_command(tmp_path):
    r = _run(tmp_path, LDD_MISSING, DISPLAY=":87")
    assert r.returncode == 1
    assert "libxcb-icccm.so.4 libxcb-keysyms.so.1" in r.stderr
    assert "apt-get install libxcb-icccm4 libxcb-keysyms1" in r.stderr
    assert "dnf install xcb-util-wm xcb-util-keysyms" in r.stderr


def test_a_display_that_cannot_be_opened_is_reported(tmp_path):
    r = _run(tmp_path, "\tlibc.so.6 => /lib/libc.so.6 (0x1)\n", DISPLAY=":87")  # no X server on :87
    assert r.returncode == 1
    assert "Qt could not open the display :87 with its xcb plugin" in r.stderr


def test_no_display_and_offscreen(tmp_path):
    r = _run(tmp_path, None)
    assert r.returncode == 1 and "no display: DISPLAY and WAYLAND_DISPLAY are unset" in r.stderr
    assert "QT_QPA_PLATFORM=offscreen" in r.stderr
    r = _run(tmp_path, None, QT_QPA_PLATFORM="offscreen")
    assert r.returncode == 0 and r.stderr == ""


def test_run_sh_stops_before_the_app_when_the_check_fails(tmp_path):
    """run.sh in a scratch tree whose .venv/bin/python records what it is asked to run and fails the display check."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "run.sh", tree / "run.sh")
    (tree / "scripts" / "setup_env.sh").write_text(": # stand-in: the environment is set up\n")
    python = tree / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls.log"\n'
                      'case "$*" in "-m tessera.app.display_check") echo "tessera: no display" >&2; exit 1 ;; esac\n')
    python.chmod(0o755)
    r = subprocess.run(["bash", str(tree / "run.sh"), "--model", "x.gguf"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "tessera: no display" in r.stderr
    # the app never started
    assert (tmp_path / "calls.log").read_text().splitlines() == ["-m tessera.app.display_check"]
    (tmp_path / "calls.log").unlink()
    r = subprocess.run(["bash", str(tree / "run.sh"), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and (tmp_path / "calls.log").read_text().splitlines() == ["-m tessera.app --help"]
