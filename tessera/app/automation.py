"""Scripted runs of the app, for screenshots and smoke tests (`tessera --prompt TEXT --screenshot FILE ...`): send
prompts once the model has loaded, save a PNG of the window, the settings dialog or the graphs, and quit. A normal run
never uses it; tessera/app/__main__.py hands it the window when any of its flags is given.

--prompt TEXT            send TEXT once the model has loaded; repeat to send several turns, each after the last reply
--screenshot FILE        after the window is shown and any model has loaded, wait --quit-after ms, save a PNG, quit
--screenshot-target T    window (default) | settings | graphs | serve (the window, serving the loaded model) |
                         remote (the Remote server dialog, after testing --remote-url when given)
--remote-url URL         with --screenshot-target remote: fill the dialog with URL and test the connection first
--quit-after MS          quit MS milliseconds after start-up (after the model loaded, when one was given)
--screenshot-at-token N  with --prompt: take the screenshot (and quit) when the last prompt's reply has N tokens,
                         i.e. in the middle of a streamed reply
--quit-when-done         with --prompt: quit (after any --screenshot) once the last reply is complete
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtWidgets import QApplication


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scripted runs (screenshots, smoke tests)")
    g.add_argument("--prompt", action="append", default=[], help="message to send once the model has loaded "
                                                                    "(repeatable: one turn each)")
    g.add_argument("--screenshot", metavar="FILE", help="save a PNG of the window, then quit")
    g.add_argument("--screenshot-target", choices=("window", "settings", "graphs", "serve", "remote"),
                   default="window")
    g.add_argument("--remote-url", metavar="URL",
                   help="with --screenshot-target remote: fill the Remote dialog with URL and test it first")
    g.add_argument("--quit-after", metavar="MS", type=int, help="quit after MS milliseconds")
    g.add_argument("--screenshot-at-token", metavar="N", type=int,
                   help="with --prompt: screenshot when the last reply has streamed N tokens")
    g.add_argument("--quit-when-done", action="store_true",
                   help="with --prompt: quit once the last reply is complete")


def wanted(args: argparse.Namespace) -> bool:
    """Whether the flags ask for a scripted run."""
    return bool(args.prompt or args.screenshot or args.quit_after is not None or args.quit_when_done)


def start(app: QApplication, window, args: argparse.Namespace, model: str | None) -> None:
    """Wire the script to the shown window, then load `model` (None: start the script at once)."""
    prompts = list(args.prompt)
    done = [False]

    def finish_once() -> None:
        if not done[0]:
            done[0] = True
            if args.screenshot:
                save_screenshot(window, args.screenshot_target, args.screenshot)
            app.quit()

    def send_next(busy: bool = False) -> None:
        if not busy and prompts and window.state.loaded:
            window.chat.prompt.setPlainText(prompts.pop(0))
            window.chat.send_button.click()
        elif not busy and not prompts and args.quit_when_done and window.controller.messages:
            finish_once()

    def at_token(_index: int, message) -> None:
        n = args.screenshot_at_token
        if (n and not prompts and message.state == "streaming"
                and message.metrics.get("generated_tokens", 0) >= n):
            finish_once()

    def shoot_when(shown) -> None:
        """Poll (on this, the GUI thread) until shown() says the view has the worker's answer, then shoot."""
        if shown():
            QTimer.singleShot(300, finish_once)  # let the answer's labels lay out
        else:
            QTimer.singleShot(100, lambda: shoot_when(shown))

    def fill_remote() -> None:
        dialog = getattr(window, "remote_dialog", None)
        if dialog is None:
            finish_once()
            return
        dialog.url.setText(args.remote_url)
        dialog.test_button.click()
        shoot_when(lambda: not dialog.status.text().startswith("Testing"))

    def arm(_ok: bool = True) -> None:
        send_next()
        if args.screenshot_target == "settings":
            window.open_settings()
        elif args.screenshot_target == "serve":  # the panel shows the worker's answer (URL and key, or why not)
            window.serve_dock.raise_()
            window.serve_panel.toggle.setChecked(True)
            shoot_when(lambda: bool(window.serve_panel.status.text()))
        elif args.screenshot_target == "remote":  # open_remote runs the dialog modally: script it from a timer
            QTimer.singleShot(0, window.open_remote)
            QTimer.singleShot(300, fill_remote if args.remote_url else finish_once)
        waits = args.quit_when_done or args.screenshot_at_token or args.screenshot_target in ("serve", "remote")
        if args.quit_after is not None:
            QTimer.singleShot(args.quit_after, finish_once)
        elif args.screenshot and not waits:
            QTimer.singleShot(500, finish_once)
        if args.quit_when_done and not window.controller.busy and not prompts:
            finish_once()  # nothing to wait for (no prompt, or the model did not load)

    window.controller.busy_changed.connect(send_next)
    window.controller.message_changed.connect(at_token)
    if model:
        window.model_ready.connect(arm, type=Qt.ConnectionType.SingleShotConnection)
        window.load_model(model)
    else:
        QTimer.singleShot(0, arm)


def save_screenshot(window, target: str, path: str) -> None:
    window.chat.flush()
    for _ in range(5):  # settle the layout (message heights follow their text) without taking in more tokens
        QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
    if target == "settings" and window.settings_dialog is not None:
        widget = window.settings_dialog
    elif target == "remote" and getattr(window, "remote_dialog", None) is not None:
        widget = window.remote_dialog
    elif target == "graphs":
        window.resizeDocks([window.graphs_dock], [max(250, window.height() // 2)], Qt.Orientation.Vertical)
        QApplication.processEvents()
        widget = window.graphs_dock
    else:
        widget = window
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if not widget.grab().save(path):
        print(f"error: {path}: could not write the screenshot", file=sys.stderr)
