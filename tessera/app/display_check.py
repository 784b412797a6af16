"""Can Qt open a window here? `python -m tessera.app.display_check`, run by ./run.sh before the app starts.

With a display (DISPLAY or WAYLAND_DISPLAY set, QT_QPA_PLATFORM not an off-screen platform) it asks `ldd` which system
libraries Qt's platform plugin cannot find and, if any are missing, prints the packages that provide them with the exact
install command for this distribution (Qt's own message names only libxcb-cursor0, whatever is really missing). When
nothing is missing it opens the display once in a child process, so any other failure (no X authority, a dead
server) is reported before the app starts. Without a display it says how to get one. Exit status 0: go ahead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# soname -> (Debian/Ubuntu package, Fedora package): everything Qt's xcb and wayland plugins link against that a
# minimal or server install may lack (checked with ldd on PySide6 6.12's Qt/plugins/platforms/libqxcb.so).
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb"),
    "libxcb-glx.so.0": ("libxcb-glx0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2"),
}

OFFSCREEN_PLATFORMS = ("offscreen", "minimal", "vnc", "linuxfb", "eglfs", "vkkhrdisplay", "minimalegl")


def platform(env: dict) -> str:
    """The platform plugin Qt will load, or "" when there is no display to open."""
    wanted = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if wanted:
        return wanted
    if env.get("WAYLAND_DISPLAY") and not env.get("DISPLAY"):
        return "wayland"
    return "xcb" if env.get("DISPLAY") else ""


def plugin_file(name: str) -> Path:
    from PySide6.QtCore import QLibraryInfo

    return Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)) / "platforms" / f"libq{name}.so"


def missing_libraries(ldd_output: str) -> list[str]:
    """The sonames `ldd` could not resolve, in order, each once."""
    found = re.findall(r"^\s*(\S+)\s+=>\s+not found", ldd_output, flags=re.MULTILINE)
    return list(dict.fromkeys(found))


def distro_family(os_release: str) -> str:
    """"debian" (Debian, Ubuntu, Mint...), "fedora" (Fedora, RHEL, Rocky...) or "" from /etc/os-release's text."""
    ids = " ".join(re.findall(r'^(?:ID|ID_LIKE)="?([^"\n]*)"?', os_release, flags=re.MULTILINE)).split()
    if any(i in ("debian", "ubuntu") for i in ids):
        return "debian"
    if any(i in ("fedora", "rhel", "centos") for i in ids):
        return "fedora"
    return ""


def install_commands(missing: list[str], as_root: bool = False) -> dict[str, str]:
    """{"debian": "apt-get install ...", "fedora": "dnf install ..."} for the missing sonames. Fedora resolves an
    unknown soname through RPM's automatic provides; Debian needs apt-file to find one this table does not know."""
    sudo = "" if as_root else "sudo "
    deb, rpm, unknown = [], [], []
    for soname in missing:
        names = PACKAGES.get(soname)
        if names is None:
            unknown.append(soname)
            rpm.append(f"'{soname}()(64bit)'")
            continue
        for packages, package in ((deb, names[0]), (rpm, names[1])):
            if package not in packages:
                packages.append(package)
    debian = f"{sudo}apt-get install {' '.join(deb)}" if deb else ""
    if unknown:
        find = " ; ".join(f"apt-file search {s}" for s in unknown)
        debian = f"{debian}   # and for {', '.join(unknown)}: {find}" if debian else find
    return {"debian": debian, "fedora": f"{sudo}dnf install {' '.join(rpm)}"}


def probe(env: dict, timeout: float = 30.0) -> tuple[bool, str]:
    """Open the display once in a child process: (worked, Qt's message when it did not)."""
    code = "import sys; from PySide6.QtGui import QGuiApplication; QGuiApplication(sys.argv[:1])"
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"opening the display did not finish in {timeout:.0f} s"
    return r.returncode == 0, r.stderr.strip()


def check(env: dict, os_release: str = "", as_root: bool = False) -> tuple[bool, str]:
    """(go ahead, what to tell the user)."""
    name = platform(env)
    if not name:
        return False, ("no display: DISPLAY and WAYLAND_DISPLAY are unset. Start Tessera from a desktop session (or "
                       "ssh -X); for screenshots without a display, set QT_QPA_PLATFORM=offscreen.")
    if name in OFFSCREEN_PLATFORMS:
        return True, ""
    plugin = plugin_file(name)
    if not plugin.is_file():
        return False, f"{plugin}: Qt's {name} platform plugin is missing (reinstall PySide6 in .venv)"
    try:
        ldd = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        ldd = ""  # no ldd (musl, minimal images): the probe below still tells
    missing = missing_libraries(ldd)
    if missing:
        commands = install_commands(missing, as_root)
        family = distro_family(os_release)
        lines = [f"Qt's {name} platform plugin cannot open a window: these system libraries are missing:",
                 "  " + " ".join(missing), "Install them with:"]
        order = [family] + [f for f in ("debian", "fedora") if f != family] if family else ["debian", "fedora"]
        label = {"debian": "Debian/Ubuntu", "fedora": "Fedora/RHEL"}
        for f in order:
            lines.append(f"  {commands[f]}" if f == family else f"  ({label[f]}: {commands[f]})")
        return False, "\n".join(lines)
    ok, message = probe(env)
    if ok:
        return True, ""
    shown = env.get("DISPLAY") or env.get("WAYLAND_DISPLAY") or ""
    tail = "\n".join(message.splitlines()[-6:])
    return False, (f"Qt could not open the display {shown} with its {name} plugin:\n{tail}\n"
                   "Check that the display is running and that this user may use it (xhost, XAUTHORITY); "
                   "QT_DEBUG_PLUGINS=1 ./run.sh shows Qt's reasons.")


def main() -> int:
    try:
        os_release = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        os_release = ""
    ok, message = check(dict(os.environ), os_release, as_root=os.geteuid() == 0)
    if message:
        print("tessera: " + message, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
