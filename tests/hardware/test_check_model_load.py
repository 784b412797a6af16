"""`tessera-cli check --model FILE` and the hardware wizard show a file's type mix and the RAM of its load with the
same numbers and words as the app's model panel: one estimate (engine.model_info.estimate_ram) through
engine.model_summary, sized for the same backend and context."""

from __future__ import annotations

import json

import pytest

from tessera.app.worker import EngineApi
from tessera.engine.cli import main


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("check") / "q4_k_m.gguf", preset="tiny-kquant", fmt="gguf",
                      dtype="q4_k_m", seed=5)


def _packing_backend() -> str:
    from tessera.engine import backends

    return next((b.name for b in backends.table() if b.available and b.weights in ("int8", "bf16")), "Reference")


def test_check_shows_the_panels_numbers(q4_k_m, capsys):
    backend = _packing_backend()
    panel = EngineApi().inspect(str(q4_k_m), context_length=1024, backend=backend)
    argv = ["check", "--quick", "--no-gpu", "--seconds", "0.1", "--model", str(q4_k_m), "--context-length", "1024",
            "--backend", backend]
    assert main(argv) == 0
    md = capsys.readouterr().out
    model = md[md.index("## Model:"):md.index("## Remedies")]
    assert f"- Types (share of the file): {panel['type_mix']}\n" in model and panel["type_mix"].startswith("Q4_K ")
    assert f"- RAM: this load needs {panel['ram_text']}; " in model
    assert "KV cache for 1,024 tokens" in model and "{" not in model and "GiB" not in model
    assert main([*argv, "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["model"]
    assert m["ram"] == panel["ram"] and m["ram_needed_bytes"] == panel["ram"]["total_bytes"]
    assert m["backend"] == panel["ram"]["backend"] == backend


def test_check_default_context_is_the_apps(q4_k_m, capsys):
    from tessera.app.settings import TABLE
    from tessera.engine.hardware import MODEL_CONTEXT

    assert MODEL_CONTEXT == next(s.default for s in TABLE if s.key == "model/context_length")
    assert main(["check", "--json", "--quick", "--no-gpu", "--seconds", "0.1", "--model", str(q4_k_m)]) == 0
    ram = json.loads(capsys.readouterr().out)["model"]["ram"]
    panel = EngineApi().inspect(str(q4_k_m), context_length=MODEL_CONTEXT, backend="Auto")
    assert ram == panel["ram"]


def test_bad_load_options_are_named(capsys, q4_k_m):
    assert main(["check", "--quick", "--model", str(q4_k_m), "--context-length", "1"]) == 1
    assert "error: --context-length: must be 2 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: the choices are the backend list
        main(["check", "--quick", "--model", str(q4_k_m), "--backend", "Nope"])
    assert "invalid choice: 'Nope'" in capsys.readouterr().err


def test_the_wizard_shows_the_panels_numbers(qtbot, q4_k_m):
    from tessera.app.wizards.hardware_wizard import HardwareWizard

    backend = _packing_backend()
    panel = EngineApi().inspect(str(q4_k_m), context_length=2048, backend=backend)
    w = HardwareWizard(seconds=0.1, model_path=str(q4_k_m), context_length=2048, backend=backend)
    qtbot.addWidget(w)
    w.show()
    w.intro.gpu.setChecked(False)
    with qtbot.waitSignal(w.report_ready, timeout=120_000) as blocker:
        w.next()
    assert blocker.args[0]["model"]["ram"] == panel["ram"]
    qtbot.waitUntil(w.probe_page.isComplete)
    w.next()
    text = w.result_page.view.toPlainText()
    assert f"this load needs {panel['ram_text']}" in text and panel["type_mix"] in text
    w.probe_page.wait_for_job()


def test_a_preset_on_paper_is_sized_as_the_file_would_be(tmp_path):
    """paper_info (check --preset --dtype) gives what inspecting the written file gives: the same mix, bytes and RAM."""
    from tessera.engine.make_model import make_model
    from tessera.engine.model_info import inspect_model
    from tessera.engine.model_summary import paper_info
    from tessera.engine.weights import open_model

    for dtype in ("bf16", "q4_k_m", "q8_0"):
        path = make_model(tmp_path / f"{dtype}.gguf", preset="tiny-kquant", fmt="gguf", dtype=dtype, seed=1)
        real = inspect_model(path, context_length=512, backend=_packing_backend())
        paper = paper_info(open_model(path).config, "x", dtype, context_length=512, backend=_packing_backend())
        assert paper.type_bytes == real.type_bytes and paper.tensor_types == real.tensor_types, dtype
        assert (paper.total_bytes, paper.loaded_bytes, paper.ram) == (real.total_bytes, real.loaded_bytes, real.ram)


def test_check_preset_counts_the_packed_copy(capsys):
    """The issue's case: Qwen3-30B-A3B in BF16 on a backend that packs the experts holds the file's 61 GB and the packed
    copy (about 31 GB in int8); the check used to leave the packed copy out."""
    backend = _packing_backend()
    argv = ["check", "--json", "--quick", "--no-gpu", "--seconds", "0.1", "--preset", "qwen3-30b-a3b",
            "--backend", backend]
    assert main(argv) == 0
    m = json.loads(capsys.readouterr().out)["model"]
    ram = m["ram"]
    assert ram["backend"] == backend and ram["weights_bytes"] == pytest.approx(61.1e9, rel=0.01)
    if backend != "Reference":
        assert ram["packed_bytes"] > 25e9
    assert m["ram_needed_bytes"] == ram["total_bytes"] >= ram["weights_bytes"] + ram["packed_bytes"]
    assert m["type_mix"] == "BF16 100 %, F32 <1 %"
    assert main([*argv[:-2], "--dtype", "q4_k_m", "--backend", backend]) == 0
    q = json.loads(capsys.readouterr().out)["model"]
    assert q["ram"]["weights_bytes"] == pytest.approx(18.6e9, rel=0.01) and q["type_mix"].startswith("Q4_K ")
