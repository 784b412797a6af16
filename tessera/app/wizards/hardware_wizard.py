"""HardwareWizard: validate this computer for Tessera: CPU flags and AMX, memory bandwidth, GPUs, backends, speed.

Pages: what will be measured (and for which model) -> the probe, with a progress bar, on a QThread -> the report, with
Markdown/JSON export and copy to the clipboard. The same probe is `tessera-cli check`.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from tessera.app.wizards import jobs
from tessera.app.wizards.job_page import JobPage
from tessera.app.wizards.report_html import report_html

DURATIONS = (("Quick (about 1 s)", 0.4), ("Standard (about 5 s)", 3.0), ("Thorough (about 15 s)", 10.0))


class IntroPage(QWizardPage):
    """What will be measured, for how long, and which model to estimate fit and speed for."""

    def __init__(self, parent=None, *, model_path: str | None = None):
        super().__init__(parent)
        self.setTitle("Check this computer")
        self.setSubTitle("Tessera reads the CPU's features, asks Linux for AMX, measures how fast memory can be read "
                         "and probes CUDA GPUs. Nothing is changed on the system.")
        self.duration = QComboBox()
        self.duration.setAccessibleName("Measurement length")
        for text, seconds in DURATIONS:
            self.duration.addItem(text, seconds)
        self.duration.setCurrentIndex(1)
        self.gpu = QCheckBox("Probe CUDA GPUs (copy bandwidth between RAM and VRAM)")
        self.gpu.setChecked(True)
        self.choice = QButtonGroup(self)
        self.none_radio = QRadioButton("No model")
        self.preset_radio = QRadioButton("A published model:")
        self.file_radio = QRadioButton("A model on disk:")
        for i, b in enumerate((self.none_radio, self.preset_radio, self.file_radio)):
            self.choice.addButton(b, i)
        self.preset = QComboBox()
        self.preset.setAccessibleName("Published model")
        for text, key in jobs.hardware_presets():  # the engine's one list of published models
            self.preset.addItem(text, key)
        self.path = QLineEdit(model_path or "")
        self.path.setPlaceholderText("a .gguf file or a Hugging Face folder")
        self.path.setAccessibleName("Model path")
        browse_file = QPushButton("File…")
        browse_file.clicked.connect(self._browse_file)
        browse_dir = QPushButton("Folder…")
        browse_dir.clicked.connect(self._browse_dir)
        (self.file_radio if model_path else self.preset_radio).setChecked(True)
        self.path.textChanged.connect(lambda _: self.file_radio.setChecked(True))
        self.preset.activated.connect(lambda _: self.preset_radio.setChecked(True))
        self.choice.idToggled.connect(lambda *_: self.completeChanged.emit())
        self.path.textChanged.connect(lambda *_: self.completeChanged.emit())

        file_row = QHBoxLayout()
        file_row.addWidget(self.path, 1)
        file_row.addWidget(browse_file)
        file_row.addWidget(browse_dir)
        model_box = QVBoxLayout()
        model_box.addWidget(self.none_radio)
        preset_row = QHBoxLayout()
        preset_row.addWidget(self.preset_radio)
        preset_row.addWidget(self.preset, 1)
        model_box.addLayout(preset_row)
        model_box.addWidget(self.file_radio)
        model_box.addLayout(file_row)
        holder = QWidget()
        holder.setLayout(model_box)
        form = QFormLayout(self)
        form.addRow("Bandwidth measurement:", self.duration)
        form.addRow("", self.gpu)
        form.addRow("Estimate fit and speed for:", holder)

    def _browse_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", str(Path.home()), "GGUF models (*.gguf)")
        if path:
            self.path.setText(path)

    def _browse_dir(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder", str(Path.home()))
        if path:
            self.path.setText(path)

    def isComplete(self) -> bool:
        return not self.file_radio.isChecked() or bool(self.path.text().strip())

    def options(self) -> dict:
        which = self.choice.checkedId()
        return {
            "seconds": float(self.duration.currentData()),
            "gpu": self.gpu.isChecked(),
            "preset": self.preset.currentData() if which == 1 else None,
            "model": self.path.text().strip() if which == 2 else None,
        }


class ProbePage(JobPage):
    def __init__(self, intro: IntroPage, parent=None, *, seconds_override: float | None = None,
                 load_settings: dict | None = None):
        super().__init__("Measuring",
                         "CPU features first, then memory bandwidth with all cores and with one, then GPUs.", parent)
        self._intro = intro
        self._seconds_override = seconds_override
        self._load_settings = load_settings or {}  # context_length, backend: a model file's RAM is sized for them

    def make_job(self) -> jobs.Job:
        o = self._intro.options()
        seconds = self._seconds_override or o["seconds"]
        return jobs.Job(jobs.hardware_probe(seconds=seconds, model=o["model"], preset=o["preset"], gpu=o["gpu"],
                                            **self._load_settings), self)


class ResultPage(QWizardPage):
    def __init__(self, probe: ProbePage, parent=None):
        super().__init__(parent)
        self.setTitle("Report")
        self.setSubTitle("What this computer can do for Tessera, and what to fix. "
                         "Export it or copy it for a bug report.")
        self._probe = probe
        self.view = QTextBrowser()
        self.view.setAccessibleName("Hardware report")
        self.view.setOpenExternalLinks(False)
        self.status = QLabel()
        self.status.setStyleSheet("color: gray;")
        self.save_md = QPushButton("Save as Markdown…")
        self.save_json = QPushButton("Save as JSON…")
        self.copy = QPushButton("Copy to clipboard")
        self.save_md.clicked.connect(lambda: self._save_dialog("Markdown (*.md)", ".md"))
        self.save_json.clicked.connect(lambda: self._save_dialog("JSON (*.json)", ".json"))
        self.copy.clicked.connect(self.copy_to_clipboard)
        row = QHBoxLayout()
        for b in (self.save_md, self.save_json, self.copy):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(self.status)
        layout = QVBoxLayout(self)
        layout.addWidget(self.view, 1)
        layout.addLayout(row)

    def initializePage(self) -> None:
        self.view.setHtml(report_html(self._probe.result["report"]))
        self.status.clear()

    def save(self, path: str | Path) -> Path:
        """Write the report; a .json suffix gives JSON, anything else Markdown."""
        path = Path(path)
        r = self._probe.result
        path.write_text(r["json"] + "\n" if path.suffix.lower() == ".json" else r["markdown"])
        self.status.setText(f"Saved {path.name}")
        return path

    def copy_to_clipboard(self) -> None:
        QGuiApplication.clipboard().setText(self._probe.result["markdown"])
        self.status.setText("Copied as Markdown")

    def _save_dialog(self, filt: str, suffix: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the hardware report",
                                              str(Path.home() / f"tessera-hardware{suffix}"), filt)
        if path:
            try:
                self.save(path)
            except OSError as e:
                self.status.setText(f"Could not save: {e.strerror}")


class HardwareWizard(QWizard):
    """Emits `report_ready(report_dict)` when a probe finishes (the app stores the measured bandwidth)."""

    report_ready = Signal(dict)

    def __init__(self, parent=None, *, model_path: str | None = None, seconds: float | None = None,
                 context_length: int | None = None, backend: str = "Auto"):
        """`context_length` and `backend`: the app's settings, so a model's RAM reads as in the model panel."""
        super().__init__(parent)
        self.setWindowTitle("Tessera — hardware check")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnLastPage, False)
        self.resize(820, 640)
        self.intro = IntroPage(model_path=model_path)
        self.probe_page = ProbePage(self.intro, seconds_override=seconds,
                                    load_settings={"context_length": context_length, "backend": backend})
        self.result_page = ResultPage(self.probe_page)
        for page in (self.intro, self.probe_page, self.result_page):
            self.addPage(page)
        self.probe_page.finished_ok.connect(lambda r: self.report_ready.emit(r["report"]))

    @property
    def report(self) -> dict | None:
        return self.probe_page.result["report"] if self.probe_page.result else None

    def done(self, result: int) -> None:  # closing (Finish, Cancel, Esc) stops a running probe first
        self.probe_page.wait_for_job()
        super().done(result)
