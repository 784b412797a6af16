"""A wizard page that runs one Job with a progress bar, a live log and a Cancel button; Next unlocks when it
succeeds."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QPushButton, QVBoxLayout, QWizardPage

from tessera.app.wizards.jobs import Job


class _Keeper(QObject):
    """Jobs still running when their wizard closed (a step that cannot stop mid-way, such as verification), kept alive
    until their thread ends: destroying a running QThread aborts the process. Lives in the UI thread, so `_release`
    runs there (queued) after the job's thread has finished."""

    def __init__(self):
        super().__init__()
        self.jobs: set[Job] = set()

    @Slot()
    def _release(self) -> None:
        self.jobs.discard(self.sender())


_KEEPER: _Keeper | None = None


def keep_until_finished(job: Job) -> None:
    global _KEEPER
    if _KEEPER is None:
        _KEEPER = _Keeper()
    job.setParent(None)
    _KEEPER.jobs.add(job)
    job.finished.connect(_KEEPER._release)
    if job.isFinished():
        _KEEPER.jobs.discard(job)


def kept_jobs() -> set[Job]:
    return set(_KEEPER.jobs) if _KEEPER is not None else set()


class JobPage(QWizardPage):
    """Subclasses implement `make_job()`; the result is in `self.result` once `finished_ok` fires."""

    finished_ok = Signal(object)
    finished_bad = Signal(str)  # the error or "cancelled" line shown on the page
    job_started = Signal(object)  # the Job, just before its thread starts (connect to its signals here)

    def __init__(self, title: str, subtitle: str, parent=None):
        super().__init__(parent)
        self.setTitle(title)
        self.setSubTitle(subtitle)
        self.job: Job | None = None
        self.result = None
        self._last_line = ""
        self.stage = QLabel("Waiting…")
        self.stage.setWordWrap(True)
        self.stage.setTextFormat(Qt.TextFormat.PlainText)
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Progress")
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setAccessibleName("Progress log")
        self.log.setMaximumBlockCount(500)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setTextFormat(Qt.TextFormat.PlainText)
        self.error.setStyleSheet("color: #c62828;")
        self.error.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel this step")
        self.cancel_button.clicked.connect(self.cancel)
        row = QHBoxLayout()
        row.addWidget(self.bar, 1)
        row.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.stage)
        layout.addLayout(row)
        layout.addWidget(self.log, 1)
        layout.addWidget(self.error)

    # --- Subclass API
    def make_job(self) -> Job:
        raise NotImplementedError

    # --- QWizardPage
    def initializePage(self) -> None:
        self.start()

    def cleanupPage(self) -> None:  # Back pressed: stop the work, forget the result
        self.cancel()
        self.result = None

    def isComplete(self) -> bool:
        return self.result is not None

    # --- Public API
    def start(self) -> None:
        self.cancel()
        self.result = None
        self.error.hide()
        self.log.clear()
        self._last_line = ""
        self.bar.setRange(0, 0)  # busy until the first progress event gives a total
        self.stage.setText("Starting…")
        self.cancel_button.setEnabled(True)
        self.job = self.make_job()
        self.job.progressed.connect(self._on_progress)
        self.job.succeeded.connect(self._on_success)
        self.job.failed.connect(self._on_failure)
        self.job.cancelled.connect(self._on_cancelled)
        self.job_started.emit(self.job)
        self.job.start()
        self.completeChanged.emit()

    def cancel(self) -> None:
        if self.job is not None and self.job.isRunning():
            self.stage.setText("Cancelling…")
            self.job.cancel()

    def wait_for_job(self, ms: int = 10000) -> None:
        """Cancel the job and wait up to `ms` for its thread; one that is still busy then is kept alive on its own."""
        if self.job is not None:
            self.job.cancel()
            if not self.job.wait(ms):
                keep_until_finished(self.job)

    # --- Job signals (queued into the UI thread)
    def _on_progress(self, done: int, total: int, stage: str, detail: str) -> None:
        if total > 0:
            self.bar.setRange(0, total)
            self.bar.setValue(min(done, total))
        self.stage.setText(f"{stage}: {detail}" if detail else stage)
        line = f"[{stage}] {detail}"
        if detail and line != self._last_line:  # ticks that repeat the same words are not news
            self.log.appendPlainText(line)
            self._last_line = line

    def _on_success(self, result) -> None:
        self.result = result
        self.bar.setRange(0, 1)
        self.bar.setValue(1)
        self.stage.setText("Done.")
        self.cancel_button.setEnabled(False)
        self.completeChanged.emit()
        self.finished_ok.emit(result)

    def _finish_bad(self, text: str) -> None:
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.cancel_button.setEnabled(False)
        self.error.setText(text)
        self.error.show()
        self.stage.setText("Stopped.")
        self.completeChanged.emit()
        self.finished_bad.emit(text)

    def _on_failure(self, subject: str, message: str) -> None:
        self._finish_bad(f"{subject}: {message}\n\nGo Back to change the settings and try again.")

    def _on_cancelled(self) -> None:
        self._finish_bad("Cancelled. Go Back to start again.")
