"""The model panel shows a real quantized file's type mix and the RAM of its load in words, never raw dicts."""

from __future__ import annotations

import collections

import gguf
import pytest

from tessera.app.fit import estimate
from tessera.app.payloads import ModelSummary
from tessera.app.views.model_panel import ModelPanel
from tessera.app.worker import EngineApi


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("panel") / "q4_k_m.gguf", preset="tiny-kquant", fmt="gguf",
                      dtype="q4_k_m", seed=3)


def _rows(panel: ModelPanel) -> dict[str, str]:
    items = [panel.meta.topLevelItem(i) for i in range(panel.meta.topLevelItemCount())]
    return {it.text(0): it.text(1) for it in items}


def test_type_mix_and_ram_in_words(qtbot, q4_k_m):
    info = EngineApi().inspect(str(q4_k_m), context_length=1024, backend="Auto")
    panel = ModelPanel()
    qtbot.addWidget(panel)
    panel.choose(str(q4_k_m))
    fit = estimate(info, ram_available=64 * 10**9)
    panel.show_summary(ModelSummary(str(q4_k_m), info), fit.text)
    rows = _rows(panel)

    # The shares, from the file's own tensor table (gguf's reader), largest first.
    stored = collections.Counter()
    for t in gguf.GGUFReader(q4_k_m).tensors:
        stored[t.tensor_type.name] += int(t.n_bytes)
    total = sum(stored.values())
    want = ", ".join(f"{name} {round(100 * b / total)} %" for name, b in stored.most_common())
    assert rows["Types (share of the file)"] == want and want.startswith("Q4_K ") and "Q6_K" in want

    for label, value in rows.items():  # no dict or list repr anywhere: {'F32': 35840} or F32: 35840
        assert "{" not in value and "': " not in value and not any(f"{k}: " in value for k in stored), (label, value)
    assert not any("type bytes" in label or "ram" == label or "tensor types" in label for label in rows)

    ram = info["ram"]
    text = panel.fit_label.text()
    assert text.startswith("Fits: this load needs about ") and text == fit.text
    assert f"KV cache for {ram['context_length']:,} tokens" in text and "64.0 GB RAM free" in text
    assert " MB" in text and " GB:" not in text and "GiB" not in text  # a 4 MB model: every part in one unit


def test_summary_of_a_loaded_model_without_the_estimate_shows_no_raw_dict(qtbot):
    """ModelState.info of a loaded session is the plain ModelInfo dict: its dicts stay out of the table."""
    panel = ModelPanel()
    qtbot.addWidget(panel)
    panel.choose("/m/x.gguf")
    info = {"name": "x", "num_experts": 8, "type_bytes": {"Q4_K": 10}, "tensor_types": {"Q4_K": 1},
            "ram": {"total_bytes": 5}, "dense_layers": [], "total_bytes": 2_500_000}
    panel.show_summary(ModelSummary("/m/x.gguf", info), "")
    rows = _rows(panel)
    assert rows == {"Name": "x", "Experts": "8", "Size on disk": "2.5 MB"}
