"""Tessera's demo model: the procedural skills it is trained on, the held-out split, and its evaluation.

- `skills.py`: problem generators (addition, subtraction, count_letters, reverse_list, sort_list, tessera).
- `split.py`: the hash-based held-out split and the fixed evaluation problems.
- `dataset.py`: training conversations rendered with Qwen3's chat template, tokenized with an assistant-only loss mask.
- `evaluate.py`: exact-match accuracy through `Session.chat` (used by `tessera-cli eval-demo` and the tests).
Training itself is `scripts/train_demo.py` (it needs transformers, which the engine never imports).
"""

from __future__ import annotations

from pathlib import Path

# The shipped model, written by scripts/train_demo.py (the app's welcome page and the README's run command use it).
DEMO_GGUF = Path(__file__).resolve().parent.parent.parent / "resources" / "demo" / "tessera-demo-moe.gguf"
