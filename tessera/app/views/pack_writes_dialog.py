"""What closing the app waits for: a first load's packed experts still on their way into the packed-weight cache.

A BF16 model's first load packs its experts and writes them to the cache behind the load (~16 s for an 8-layer file
on a 0.32 GB/s disk), and the writes pause while the model generates, so the user may well close the window with
gigabytes left. Waiting without a word left a process with no window; dropping them would make the next start pack
again. This dialog says what is left, counts it down, and offers to skip it (the next load then packs the missing
layers again). It knows the worker only through callables: `left()` (bytes of work left), `describe()` (the same in
words: packs to write, model bytes to hash first) and `skip()`.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QProgressDialog, QWidget

POLL_MS = 250
MB = 1 << 20


def _text(work: str) -> str:
    return (f"Saving the model's packed weights, so that it loads in seconds next time: {work}.\n"
            "Skip, and the next load packs them again.")


class PackWritesDialog(QProgressDialog):
    """Counts down `left()` until it reaches 0, then emits `written` and closes; Skip calls `skip()` and waits for the
    write in progress to give up (a fraction of a second)."""

    written = Signal()

    def __init__(self, left: Callable[[], int], skip: Callable[[], None], describe: Callable[[], str],
                 parent: QWidget | None = None):
        start = max(int(left()), 1)
        super().__init__(_text(describe()), "Skip", 0, max(start // MB, 1), parent)
        self.setWindowTitle("Closing Tessera")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setAutoClose(False)
        self.setAutoReset(False)
        self.setMinimumDuration(0)
        self._left, self._describe, self._skip, self._start = left, describe, skip, start
        self.skipped = False
        self.canceled.connect(self._on_skip)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._poll)
        self._timer.start(POLL_MS)

    def _on_skip(self) -> None:
        self.skipped = True
        self._skip()
        self.setLabelText("Skipping: the write in progress stops at its next piece…")
        self.show()  # QProgressDialog hides itself on Cancel; it stays up until the writer has let go

    def _poll(self) -> None:
        left = int(self._left())
        if left <= 0:
            self._timer.stop()
            self.hide()
            self.written.emit()
            return
        self.setValue(max(self._start - left, 0) // MB)
        if not self.skipped:
            self.setLabelText(_text(self._describe()))
