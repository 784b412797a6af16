"""The empty chat on the demo model: what the model is, what it can do, example prompts that it answers right (one click
sends one), and "Open a model…" for a real one. The text and prompts come with the model
(tessera/resources/demo/examples.json, checked against the model by tests/app/test_demo_intro.py)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget


class DemoIntro(QWidget):
    example_chosen = Signal(str)  # the prompt of the example clicked
    open_requested = Signal()

    def __init__(self, intro: dict, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("About the demo model")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 24, 24, 12)
        layout.setSpacing(10)
        title = QLabel(f"<h3>{html.escape(intro.get('title', 'The demo model'))}</h3>")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(title)
        self.summary = QLabel(intro.get("summary", ""))
        self.summary.setWordWrap(True)
        self.summary.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.summary.setMaximumWidth(720)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.summary)
        row.addStretch(1)
        layout.addLayout(row)
        hint = QLabel("Try one of these (a click sends it):")
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        hint.setStyleSheet("color: gray;")
        layout.addWidget(hint)
        grid = QGridLayout()
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(6)
        self.example_buttons: list[QPushButton] = []
        for i, example in enumerate(intro.get("examples", [])):
            prompt = str(example["prompt"])
            button = QPushButton(prompt)
            button.setAccessibleName(f"Send the example: {prompt}")
            button.setToolTip("Send this message")
            button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            button.clicked.connect(lambda _=False, p=prompt: self.example_chosen.emit(p))
            grid.addWidget(button, i // 2, i % 2)
            self.example_buttons.append(button)
        box = QWidget()
        box.setLayout(grid)
        box.setMaximumWidth(620)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(box, 4)
        row.addStretch(1)
        layout.addLayout(row)
        self.open_button = QPushButton("Open a model…")
        self.open_button.setAccessibleName("Open a model file")
        self.open_button.setToolTip("Open a Qwen3-MoE GGUF file (Ctrl+O)")
        self.open_button.clicked.connect(self.open_requested)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.open_button)
        row.addStretch(1)
        layout.addLayout(row)
