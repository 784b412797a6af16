"""ConvertWizard: a Hugging Face Qwen3-MoE folder -> one GGUF file (BF16 or Q8_0), checked against the source.

Pages: the source folder (checked and summarised on a QThread) -> output file, type, verification, pre-packing and the
free-space check -> the conversion with per-tensor progress and Cancel -> the result with the verification figures.
The same conversion is `tessera-cli convert SRC OUT --dtype bf16|q8_0 --verify`.
"""

from __future__ import annotations

import shutil
from html import escape
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
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
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from tessera.app.wizards import jobs
from tessera.app.wizards.job_page import JobPage, keep_until_finished

# Output bytes per weight: matrices take the requested type; norms and routers stay F32 (a rounding error in size).
BYTES_PER_WEIGHT = {"bf16": 2.0, "q8_0": 34 / 32}
DTYPES = (("bf16", "BF16"), ("q8_0", "Q8_0 — 8-bit blocks, about half the size of BF16, a small rounding error"))


def bf16_label(source_dtypes: list[str]) -> str:
    """What BF16 output does to this source: an exact copy only when every tensor already is BF16; otherwise name
    the rounding (F32's 24-bit and F16's 11-bit significands become BF16's 8 bits)."""
    wider = [d for d in source_dtypes if d in ("F32", "F16")]
    if not wider:
        return "BF16 — an exact copy of the BF16 checkpoint"
    size = "half the size, " if "F32" in wider else ""
    return (f"BF16 — {size}rounds the {' and '.join(wider)} weights to 8 significant bits (about 3 decimal digits): "
            "a small loss, checked by Verify")
FREE_MARGIN = 64 * 1024 * 1024  # as the converter keeps


def _gb(n: float) -> str:
    """Bytes, readably: GB for models, MB/kB for the small ones tests and demos make."""
    for unit, size in (("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n / 1e3:.0f} kB"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


class SourcePage(QWizardPage):
    """Pick a folder; a job checks it (config, shards, headers) without blocking the UI."""

    def __init__(self, parent=None, *, folder: str | None = None):
        super().__init__(parent)
        self.setTitle("Source model")
        self.setSubTitle("A Hugging Face Qwen3-MoE folder: config.json, *.safetensors shards and tokenizer files. "
                         "Pickle checkpoints (.bin/.pt) are refused.")
        self.summary: dict | None = None
        self._job: jobs.Job | None = None
        self.path = QLineEdit(folder or "")
        self.path.setPlaceholderText("/path/to/Qwen3-30B-A3B")
        self.path.setAccessibleName("Source folder")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.info = QLabel("Choose a folder.")
        self.info.setWordWrap(True)
        self.info.setTextFormat(Qt.TextFormat.RichText)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.info)
        layout.addStretch(1)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(300)
        self._debounce.timeout.connect(self.check)
        self.path.textChanged.connect(lambda _: (self._invalidate(), self._debounce.start()))
        if folder:
            self._debounce.start()

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder", self.path.text() or str(
            Path.home()))
        if path:
            self.path.setText(path)

    def _invalidate(self) -> None:
        self.summary = None
        self.completeChanged.emit()

    def check(self) -> None:
        """Start checking the folder in the path box (a newer check replaces an older one)."""
        folder = self.path.text().strip()
        if not folder:
            self.info.setText("Choose a folder.")
            return
        if self._job is not None:  # an older check still running: ignore its answer, let it end on its own
            self._job.cancel()
            self._job.succeeded.disconnect()
            self._job.failed.disconnect()
            if self._job.isRunning():
                keep_until_finished(self._job)
        self.info.setText("Checking…")
        self._job = jobs.Job(jobs.inspect_source(folder), self)
        self._job.succeeded.connect(self._on_summary)
        self._job.failed.connect(self._on_error)
        self._job.start()

    def _on_summary(self, s: dict) -> None:
        self.summary = s
        self.info.setText(
            f"<b>Qwen3-MoE</b> {escape(Path(s['folder']).name)}: {s['layers']} layers, {s['experts']} experts "
            f"({s['experts_per_token']} per token), "
            f"hidden size {s['hidden_size']}, vocabulary {s['vocab_size']}<br>"
            f"{s['tensors']} tensors in {s['shards']} shard(s), {_gb(s['bytes'])} ({', '.join(s['dtypes'])}), "
            f"about {_count(s['params'])} parameters")
        self.info.setStyleSheet("")
        self.completeChanged.emit()

    def _on_error(self, subject: str, message: str) -> None:
        self.summary = None
        self.info.setText(escape(f"{subject}: {message}"))
        self.info.setStyleSheet("color: #c62828;")
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self.summary is not None and self.summary["folder"] == str(Path(self.path.text().strip()))

    def wait_for_job(self, ms: int = 10000) -> None:
        if self._job is not None and not self._job.wait(ms):
            keep_until_finished(self._job)


class OptionsPage(QWizardPage):
    """Output file, tensor type, verification, pre-packing; Next stays off when the disk is too full."""

    def __init__(self, source: SourcePage, parent=None):
        super().__init__(parent)
        self.setTitle("Output")
        self.setSubTitle("The file is written under a temporary name and renamed when complete, so an interrupted "
                         "conversion never leaves a file that looks finished.")
        self._source = source
        self.out = QLineEdit()
        self.out.setAccessibleName("Output file")
        browse = QPushButton("Save as…")
        browse.clicked.connect(self._browse)
        self.dtype_group = QButtonGroup(self)
        dtype_box = QVBoxLayout()
        self.dtype_buttons: dict[str, QRadioButton] = {}
        for i, (key, text) in enumerate(DTYPES):
            b = QRadioButton(text)
            self.dtype_group.addButton(b, i)
            self.dtype_buttons[key] = b
            dtype_box.addWidget(b)
        self.dtype_buttons["bf16"].setChecked(True)
        self.verify = QCheckBox("Verify: run the same text through the source and the output and compare the logits")
        self.verify.setChecked(True)
        self.prepack = QComboBox()
        self.prepack.setAccessibleName("Pre-pack for backend")
        self.replace = QCheckBox("Replace the existing file")  # shown only when the output exists
        self.replace.setVisible(False)
        self.replace.toggled.connect(self._update_space)
        self.space = QLabel()
        self.space.setWordWrap(True)
        out_row = QHBoxLayout()
        out_row.addWidget(self.out, 1)
        out_row.addWidget(browse)
        holder = QWidget()
        holder.setLayout(dtype_box)
        form = QFormLayout(self)
        form.addRow("Output file:", out_row)
        form.addRow("", self.replace)
        form.addRow("Tensor type:", holder)
        form.addRow("", self.verify)
        form.addRow("Pre-pack for:", self.prepack)
        form.addRow("Disk space:", self.space)
        self.out.textChanged.connect(self._update_space)
        self.dtype_group.idToggled.connect(self._on_dtype)

    def initializePage(self) -> None:
        s = self._source.summary
        src = Path(s["folder"])
        self.dtype_buttons["bf16"].setText(bf16_label(list(s.get("dtypes", []))))
        self.out.setText(str(src.parent / f"{src.name}-{self.dtype().upper()}.gguf"))
        self.prepack.clear()
        self.prepack.addItem("No pre-packing", None)
        for name, (ok, reason) in s.get("backends", {}).items():
            self.prepack.addItem(name if ok else f"{name} (unavailable: {reason})", name)
            if not ok:  # shown, disabled, with the reason (never silently dropped)
                self.prepack.model().item(self.prepack.count() - 1).setEnabled(False)
        self._update_space()

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Write the GGUF file", self.out.text(), "GGUF models (*.gguf)")
        if path:
            self.out.setText(path if path.endswith(".gguf") else path + ".gguf")

    def _on_dtype(self, *_) -> None:
        text = self.out.text()
        for key, _ in DTYPES:  # keep the suggested name in step with the type
            text = text.replace(f"-{key.upper()}.gguf", f"-{self.dtype().upper()}.gguf")
        self.out.setText(text)
        self._update_space()

    def dtype(self) -> str:
        return DTYPES[max(0, self.dtype_group.checkedId())][0]

    def needed_bytes(self) -> int:
        return int(self._source.summary["params"] * BYTES_PER_WEIGHT[self.dtype()])

    def free_bytes(self) -> int | None:
        folder = Path(self.out.text().strip() or ".").parent
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            return None

    def problem(self) -> str | None:
        """Why Next is off, or None."""
        out = self.out.text().strip()
        if not out:
            return "Choose an output file."
        path = Path(out)
        if path.is_dir():
            return f"{path} is a folder; give a file name ending in .gguf."
        if not path.parent.is_dir():
            return f"The folder {path.parent} does not exist."
        if path.exists():
            refused = jobs.output_refusal(self._source.summary["folder"], str(path))
            if refused:
                return refused
            if not self.replace.isChecked():
                return f"{path.name} already exists: tick “Replace the existing file” to overwrite it."
        free = self.free_bytes()
        if free is not None and free < self.needed_bytes() + FREE_MARGIN:
            return (f"Not enough free space in {path.parent}: about {_gb(self.needed_bytes())} needed, {_gb(free)} "
                    "free.")
        return None

    def _update_space(self, *_) -> None:
        if self._source.summary is None:
            return
        problem = self.problem()
        free = self.free_bytes()
        line = f"about {_gb(self.needed_bytes())} needed" + (f", {_gb(free)} free" if free is not None else "")
        exists = Path(self.out.text().strip()).is_file()
        self.replace.setVisible(exists)
        if exists and self.replace.isChecked():
            line += " — the existing file will be replaced when the conversion completes"
        self.space.setText(problem or line)
        self.space.setStyleSheet("color: #c62828;" if problem else "")
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self._source.summary is not None and self.problem() is None

    def options(self) -> dict:
        return {"src": self._source.summary["folder"], "out": self.out.text().strip(), "dtype": self.dtype(),
                "verify": self.verify.isChecked(), "prepack": self.prepack.currentData(),
                "force": self.replace.isChecked() and Path(self.out.text().strip()).exists()}


class RunPage(JobPage):
    def __init__(self, options: OptionsPage, parent=None, *, backend: str = "Auto"):
        super().__init__("Converting",
                         "One tensor at a time, streamed from the shards; Cancel removes the partial file.", parent)
        self._options = options
        self._backend = backend  # the expert backend verification runs the models with: the app's setting

    def make_job(self) -> jobs.Job:
        return jobs.Job(jobs.convert_model(**self._options.options(), backend=self._backend), self)


class DonePage(QWizardPage):
    def __init__(self, run: RunPage, parent=None):
        super().__init__(parent)
        self.setTitle("Done")
        self._run = run
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.open_button = QPushButton("Open it now")
        self.open_button.setAccessibleName("Load the converted model and close the wizard")
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(self.open_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addStretch(1)

    def initializePage(self) -> None:
        r = self._run.result
        lines = [f"Wrote <b>{escape(r['path'])}</b> ({_gb(r['bytes'])}, {r['dtype'].upper()}) in {r['seconds']:.1f} s."]
        v = r.get("verify")
        if v:
            colour = "#2e7d32" if v["passed"] else "#c62828"
            lines.append(
                f"<p style='color:{colour}'><b>Verification {'passed' if v['passed'] else 'FAILED'}</b> with "
                f"{escape(v['backend'])} over "
                f"{v['tokens']} tokens: max |Δlogit| {v['max_abs_diff']:.3g} ({v['rel_max_diff']:.2e} of the logit "
                f"range), top-1 agreement {v['top1_agreement'] * 100:.1f} %, mean KL {v['mean_kl']:.2e} nats.</p>"
                f"<p>Tolerance — {escape(v['rule'])}.</p>")
        else:
            lines.append("<p>Not verified. <code>tessera-cli compare SOURCE OUTPUT</code> does it later.</p>")
        if r.get("prepack"):
            lines.append(f"<p>{escape(r['prepack'])}</p>")
        lines.append("<p>“Open it now” loads it in the app (or open the file later from the model panel).</p>")
        self.text.setText("".join(lines))


class ConvertWizard(QWizard):
    """Emits `converted(path)` when a conversion completes (the app can offer to open it)."""

    converted = Signal(str)
    open_requested = Signal(str)  # "Open it now" on the Done page: load this file

    def __init__(self, parent=None, *, folder: str | None = None, backend: str = "Auto"):
        """`backend`: the expert backend verification runs source and output with (the app's setting)."""
        super().__init__(parent)
        self.setWindowTitle("Tessera — convert a model to GGUF")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.resize(820, 600)
        self.source = SourcePage(folder=folder)
        self.options_page = OptionsPage(self.source)
        self.run_page = RunPage(self.options_page, backend=backend)
        self.done_page = DonePage(self.run_page)
        for page in (self.source, self.options_page, self.run_page, self.done_page):
            self.addPage(page)
        self.run_page.finished_ok.connect(lambda r: self.converted.emit(r["path"]))
        self.done_page.open_button.clicked.connect(self._open_now)

    def _open_now(self) -> None:
        self.open_requested.emit(self.run_page.result["path"])
        self.accept()

    def done(self, result: int) -> None:  # closing cancels a running conversion (its temporary file is removed)
        self.run_page.wait_for_job()
        self.source.wait_for_job()
        super().done(result)
