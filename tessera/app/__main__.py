"""`python -m tessera.app` / `tessera`: parse arguments, build Settings, store, worker and window, run.

--model PATH             open and load a model at start (default: the last model loaded, or the demo model;
                         --no-demo: none)
--no-demo                do not open the demo model when no --model is given
--theme system|light|dark  set the theme (saved in the settings; system follows the desktop)
--size WxH               window size
The scripted-run flags (--prompt, --screenshot, --quit-after, ...) are tessera/app/automation.py's.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tessera.app import automation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tessera", description="Chat with Qwen3-MoE models locally.")
    p.add_argument("--model", help="GGUF file or Hugging Face folder to load at start (default: the last model "
                                   "loaded, or the demo model)")
    p.add_argument("--no-demo", action="store_true",
                   help="open no model at start (neither the last one loaded nor the demo model)")
    p.add_argument("--theme", choices=("system", "light", "dark"),
                   help="set the theme (saved in the settings; system follows the desktop's light or dark setting)")
    p.add_argument("--size", default="1280x820", help="window size WxH (screenshots)")
    automation.add_arguments(p)
    return p.parse_args(argv)


def show_notice(window, text: str, *, read_only: bool = False) -> None:
    """A non-modal warning over the window (the app keeps running; scripted runs are not blocked)."""
    from PySide6.QtWidgets import QMessageBox

    if read_only:
        window.setWindowTitle(window.windowTitle() + " (read-only session)")
    box = QMessageBox(QMessageBox.Icon.Warning, "Tessera", text, QMessageBox.StandardButton.Ok, window)
    box.setObjectName("startupNotice")
    box.setModal(False)
    box.show()


def main(argv: list[str] | None = None) -> int:
    """Runs the app; a failure while starting still opens a window that says what went wrong (launched from the desktop
    entry there is no terminal to read a traceback in)."""
    args = parse_args(argv)
    try:
        return _run(args)
    except Exception as e:  # noqa: BLE001 - the last resort: say it in a window
        import traceback

        from PySide6.QtWidgets import QApplication, QMessageBox

        traceback.print_exc()
        app = QApplication.instance() or QApplication(sys.argv[:1])  # noqa: F841 - the message box needs a live app
        box = QMessageBox(QMessageBox.Icon.Critical, "Tessera could not start", f"{type(e).__name__}: {e}")
        box.setDetailedText(traceback.format_exc())
        if not automation.wanted(args):
            box.exec()
        return 1


def _run(args: argparse.Namespace) -> int:
    from PySide6.QtWidgets import QApplication

    from tessera.app import paths
    from tessera.app.main_window import MainWindow
    from tessera.app.settings import Settings
    from tessera.app.store_open import open_store
    from tessera.app.theme import apply_theme
    from tessera.app.worker import EngineWorker

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Tessera")
    app.setOrganizationName("Tessera")
    app.setDesktopFileName("tessera")
    from PySide6.QtGui import QIcon

    icon = QIcon()
    for f in paths.app_icon_files():
        icon.addFile(str(f))
    app.setWindowIcon(icon)
    settings = Settings(paths.settings_path())
    if args.theme:
        settings.set("ui/theme", args.theme)
    apply_theme(app, settings.get("ui/theme"), settings.get("ui/font_size"))
    opened = open_store(paths.database_path())  # a damaged database is moved aside, a read-only folder read-only
    store = opened.store
    worker = EngineWorker()
    worker.start()
    window = MainWindow(settings, store, worker)
    if opened.notice:
        show_notice(window, opened.notice, read_only=opened.read_only)
    width, height = (int(v) for v in args.size.lower().split("x"))
    window.resize(width, height)
    signal.signal(signal.SIGINT, lambda *_: app.quit())

    model = args.model
    if model is None and not args.no_demo:  # the last model loaded (Settings > Reopen the last model), or the demo
        start = paths.startup_model(settings.get("recent/models"), settings.get("model/reopen_last"))
        model = str(start) if start else None

    window.show()
    model = str(Path(model).expanduser().resolve()) if model else None
    if automation.wanted(args):
        automation.start(app, window, args, model)
    elif model:
        window.load_model(model)
    code = app.exec()
    worker.shutdown()
    store.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
