"""`python -m tessera.app.wizards hardware|convert [--screenshots DIR]`: open one wizard on its own (no main window).

With --screenshots, the wizard is driven through its pages automatically and each interesting page is saved as a PNG
(the images in docs/screenshots/ come from here). The conversion wizard then works on a small random model it makes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def _wait(app, predicate, seconds: float = 300.0) -> None:
    import time

    t0 = time.monotonic()
    while not predicate():
        app.processEvents()
        time.sleep(0.01)
        if time.monotonic() - t0 > seconds:
            raise SystemExit("error: timed out waiting for the wizard")


def _shot(app, widget, path: Path) -> None:
    for _ in range(20):
        app.processEvents()
    if not widget.grab().save(str(path)):
        raise SystemExit(f"error: {path}: could not write")
    print(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.app.wizards")
    p.add_argument("wizard", choices=["hardware", "convert"])
    p.add_argument("--screenshots", metavar="DIR", help="drive the wizard through its pages and save PNGs there")
    args = p.parse_args(argv)
    from PySide6.QtWidgets import QApplication

    from tessera.app.theme import apply_theme

    app = QApplication.instance() or QApplication(sys.argv[:1])
    apply_theme(app, "light")
    if args.wizard == "hardware":
        from tessera.app.wizards.hardware_wizard import HardwareWizard

        w = HardwareWizard()
    else:
        from tessera.app.wizards.convert_wizard import ConvertWizard

        w = ConvertWizard()
    w.show()
    if not args.screenshots:
        return app.exec()
    out = Path(args.screenshots)
    out.mkdir(parents=True, exist_ok=True)
    if args.wizard == "hardware":
        _shot(app, w, out / "hardware-wizard-start.png")
        w.next()
        bar = w.probe_page.bar
        _wait(app, lambda: bar.maximum() > 0 and bar.value() >= bar.maximum() // 3 or w.probe_page.result is not None)
        _shot(app, w, out / "hardware-wizard-probe.png")
        _wait(app, lambda: w.probe_page.result is not None or w.probe_page.error.isVisible())
        w.next()
        _shot(app, w, out / "hardware-wizard-report.png")
    else:
        from tessera.engine.make_model import make_model  # the screenshot needs a real model folder

        tmp = Path(tempfile.mkdtemp(prefix="tessera-shot-"))
        src = make_model(tmp / "Qwen3-MoE-tiny", fmt="hf", dtype="bf16", seed=0)
        w.source.path.setText(str(src))
        _wait(app, lambda: w.source.isComplete() or "c62828" in w.source.info.styleSheet())
        _shot(app, w, out / "convert-wizard-source.png")
        w.next()
        w.options_page.dtype_buttons["q8_0"].setChecked(True)
        _shot(app, w, out / "convert-wizard-options.png")
        w.next()
        _wait(app, lambda: w.run_page.result is not None or w.run_page.error.isVisible())
        w.next()
        _shot(app, w, out / "convert-wizard-done.png")
    w.done(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
