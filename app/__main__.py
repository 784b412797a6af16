"""`python -m app` / `tessera`: parse arguments, build Settings, store, worker and window, run.

--model PATH             open and load a model at start (default: the last model loaded, or the demo model;
                         --no-demo: none)
--prompt TEXT            send TEXT once the model has loaded; repeat to send several turns, each after the last reply
--screenshot FILE        after the window is shown and any model has loaded, wait --quit-after ms, save a PNG, quit
--screenshot-target T    window (default) | settings | graphs
--quit-after MS          quit MS milliseconds after start-up (after the model loaded, when one was given)
--screenshot-at-token N  with --prompt: take the screenshot (and quit) when the last prompt's reply has N tokens,
                         i.e. in the middle of a streamed reply
--quit-when-done         with --prompt: quit (after any --screenshot) once the last reply is complete
--no-demo                do not open the demo model when no --model is given
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tessera", description="Chat with Qwen3-MoE models locally.")
    p.add_argument("--model", help="GGUF file or Hugging Face folder to load at start (default: the last model "
                                   "loaded, or the demo model)")
    p.add_argument("--prompt", action="append", default=[], help="message to send once the model has loaded "
                                                                    "(repeatable: one turn each)")
    p.add_argument("--screenshot", metavar="FILE", help="save a PNG of the window, then quit")
    p.add_argument("--screenshot-target", choices=("window", "settings", "graphs"), default="window")
    p.add_argument("--quit-after", metavar="MS", type=int, help="quit after MS milliseconds")
    p.add_argument("--screenshot-at-token", metavar="N", type=int,
                   help="with --prompt: screenshot when the last reply has streamed N tokens")
    p.add_argument("--quit-when-done", action="store_true",
                   help="with --prompt: quit once the last reply is complete")
    p.add_argument("--no-demo", action="store_true",
                   help="open no model at start (neither the last one loaded nor the demo model)")
    p.add_argument("--theme", choices=("light", "dark"), help="set the theme (saved in the settings)")
    p.add_argument("--size", default="1280x820", help="window size WxH (screenshots)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app import paths
    from app.main_window import MainWindow
    from app.settings import Settings
    from app.store import ConversationStore
    from app.theme import apply_theme
    from app.worker import EngineWorker

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
    apply_theme(app, settings.get("ui/theme"))
    store = ConversationStore(paths.database_path())
    worker = EngineWorker()
    worker.start()
    window = MainWindow(settings, store, worker)
    width, height = (int(v) for v in args.size.lower().split("x"))
    window.resize(width, height)
    signal.signal(signal.SIGINT, lambda *_: app.quit())

    model = args.model
    if model is None and not args.no_demo:  # the last model loaded (Settings > Reopen the last model), or the demo
        start = paths.startup_model(settings.get("recent/models"), settings.get("model/reopen_last"))
        model = str(start) if start else None

    def finish() -> None:
        if args.screenshot:
            save_screenshot(window, args.screenshot_target, args.screenshot)
        app.quit()

    prompts = list(args.prompt)

    def send_next(busy: bool = False) -> None:
        if not busy and prompts and window.state.loaded:
            window.chat.prompt.setPlainText(prompts.pop(0))
            window.chat.send_button.click()
        elif not busy and not prompts and args.quit_when_done and window.controller.messages:
            finish_once()

    window.controller.busy_changed.connect(send_next)
    done = [False]

    def finish_once() -> None:
        if not done[0]:
            done[0] = True
            finish()

    def at_token(_index: int, message) -> None:
        n = args.screenshot_at_token
        if (n and not prompts and message.state == "streaming"
                and message.metrics.get("generated_tokens", 0) >= n):
            finish_once()

    window.controller.message_changed.connect(at_token)

    def arm_quit(_ok: bool = True) -> None:
        send_next()
        if args.screenshot_target == "settings":
            window.open_settings()
        waits = args.quit_when_done or args.screenshot_at_token
        if args.quit_after is not None:
            QTimer.singleShot(args.quit_after, finish_once)
        elif args.screenshot and not waits:
            QTimer.singleShot(500, finish_once)
        if args.quit_when_done and not window.controller.busy and not prompts:
            finish_once()  # nothing to wait for (no prompt, or the model did not load)

    window.show()
    if model:
        window.model_ready.connect(arm_quit, type=_single_shot())
        window.load_model(str(Path(model).expanduser().resolve()))
    else:
        QTimer.singleShot(0, arm_quit)
    code = app.exec()
    worker.shutdown()
    store.close()
    return code


def _single_shot():
    from PySide6.QtCore import Qt

    return Qt.ConnectionType.SingleShotConnection


def save_screenshot(window, target: str, path: str) -> None:
    from PySide6.QtWidgets import QApplication

    from PySide6.QtCore import QEvent

    window.chat.flush()
    for _ in range(5):  # settle the layout (message heights follow their text) without taking in more tokens
        QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
    if target == "settings" and window.settings_dialog is not None:
        widget = window.settings_dialog
    elif target == "graphs":
        from PySide6.QtCore import Qt

        window.resizeDocks([window.graphs_dock], [max(250, window.height() // 2)], Qt.Orientation.Vertical)
        QApplication.processEvents()
        widget = window.graphs_dock
    else:
        widget = window
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if not widget.grab().save(path):
        print(f"error: {path}: could not write the screenshot", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
