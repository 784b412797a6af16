"""ConvertWizard under pytest-qt on generated models: checks the source, the free-space rule, converts with
verification, and leaves nothing behind when cancelled."""

from __future__ import annotations

import shutil
from collections import namedtuple

import gguf
import pytest
from PySide6.QtCore import Qt

from tessera.app.wizards import convert_wizard as cw
from tessera.app.wizards.convert_wizard import ConvertWizard


@pytest.fixture(scope="module")
def bf16_hf_model(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("bf16-hf") / "Tiny-MoE", fmt="hf", dtype="bf16", seed=1)


def _open(qtbot, folder) -> ConvertWizard:
    w = ConvertWizard(folder=str(folder))
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.source.isComplete() or "c62828" in w.source.info.styleSheet(), timeout=60_000)
    assert w.source.isComplete(), w.source.info.text()
    return w


def test_bad_sources_are_named(qtbot, tmp_path, bf16_hf_model):
    w = ConvertWizard()
    qtbot.addWidget(w)
    w.source.path.setText(str(tmp_path))
    qtbot.waitUntil(lambda: "config.json: is missing" in w.source.info.text(), timeout=60_000)
    assert not w.source.isComplete()
    pickle_dir = tmp_path / "pickled"
    pickle_dir.mkdir()
    for f in bf16_hf_model.glob("*.json"):
        shutil.copy(f, pickle_dir / f.name)
    (pickle_dir / "pytorch_model.bin").write_bytes(b"\x80\x02")
    w.source.path.setText(str(pickle_dir))
    qtbot.waitUntil(lambda: "pickle checkpoints are not loaded" in w.source.info.text(), timeout=60_000)
    assert str(pickle_dir / "pytorch_model.bin") in w.source.info.text() and not w.source.isComplete()
    w.source.wait_for_job()


def test_convert_bf16_with_verification(qtbot, bf16_hf_model, tmp_path):
    w = _open(qtbot, bf16_hf_model)
    assert "Qwen3-MoE" in w.source.info.text() and "BF16" in w.source.info.text()
    w.next()
    opts = w.options_page
    assert opts.out.text().endswith("Tiny-MoE-BF16.gguf")
    opts.dtype_buttons["q8_0"].setChecked(True)
    assert opts.out.text().endswith("Tiny-MoE-Q8_0.gguf")
    opts.dtype_buttons["bf16"].setChecked(True)
    out = tmp_path / "tiny-bf16.gguf"
    opts.out.setText(str(out))
    assert opts.isComplete() and opts.options()["verify"]
    assert opts.prepack.itemData(0) is None  # "No pre-packing" first; unavailable backends are listed disabled
    ended = []
    w.converted.connect(ended.append)
    w.run_page.finished_bad.connect(ended.append)
    w.next()
    qtbot.waitUntil(lambda: bool(ended), timeout=300_000)
    assert w.run_page.result is not None, w.run_page.error.text()
    assert ended == [str(out)]
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.architecture"].contents() == "qwen3moe"
    assert {t.tensor_type for t in reader.tensors if t.name.endswith("_exps.weight")} == {
        gguf.GGMLQuantizationType.BF16}
    v = w.run_page.result["verify"]
    assert v["passed"] and v["top1_agreement"] == 1.0
    w.next()
    assert "Verification passed" in w.done_page.text.text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-bf16.gguf"]


def test_free_space_check_blocks_next(qtbot, bf16_hf_model, tmp_path, monkeypatch):
    w = _open(qtbot, bf16_hf_model)
    w.next()
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(cw.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 1000, 1000))
    w.options_page.out.setText(str(tmp_path / "x.gguf"))
    assert not w.options_page.isComplete()
    assert "Not enough free space" in w.options_page.space.text()
    monkeypatch.undo()
    w.options_page.out.setText(str(tmp_path / "y.gguf"))
    assert w.options_page.isComplete()
    w.options_page.out.setText(str(tmp_path / "no-such-dir" / "y.gguf"))
    assert not w.options_page.isComplete() and "does not exist" in w.options_page.space.text()


def test_cancel_leaves_no_file(qtbot, bf16_hf_model, tmp_path):
    w = _open(qtbot, bf16_hf_model)
    w.next()
    out = tmp_path / "cancelled.gguf"
    w.options_page.out.setText(str(out))
    w.options_page.verify.setChecked(False)
    page = w.run_page
    cancelled_at = []

    def cancel_on_first_tensor(done, total, stage, detail):  # runs in the job's thread, inside the progress call
        if stage == "write" and not cancelled_at:
            cancelled_at.append(done)
            page.job.cancel()

    page.job_started.connect(
        lambda job: job.progressed.connect(cancel_on_first_tensor, Qt.ConnectionType.DirectConnection))
    with qtbot.waitSignal(page.finished_bad, timeout=120_000) as blocker:
        w.next()
    page.wait_for_job()
    assert blocker.args[0].startswith("Cancelled") and cancelled_at == [0]
    assert list(tmp_path.iterdir()) == []  # neither the output nor a partial temporary file
    assert not page.isComplete()


def test_prepack_fills_the_packed_weight_cache(qtbot, bf16_hf_model, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))  # platformdirs' user cache dir, where the packed weights go
    w = _open(qtbot, bf16_hf_model)
    w.next()
    opts = w.options_page
    opts.out.setText(str(tmp_path / "out" / "m.gguf"))
    (tmp_path / "out").mkdir()
    opts.verify.setChecked(False)
    model = opts.prepack.model()
    usable = [i for i in range(1, opts.prepack.count()) if model.item(i).isEnabled()]
    disabled = [opts.prepack.itemText(i) for i in range(1, opts.prepack.count()) if not model.item(i).isEnabled()]
    assert all("unavailable:" in text for text in disabled)  # shown with the reason, not dropped
    if not usable:
        pytest.skip("no native backend available to pre-pack for")
    opts.prepack.setCurrentIndex(usable[0])
    backend = opts.prepack.currentData()
    ended = []
    w.converted.connect(ended.append)
    w.run_page.finished_bad.connect(ended.append)
    w.next()
    qtbot.waitUntil(lambda: bool(ended), timeout=300_000)
    assert w.run_page.result is not None, w.run_page.error.text()
    w.next()
    assert "packed" in w.done_page.text.text()
    if backend != "Torch":
        assert any(p.is_file() for p in cache.rglob("*")), "nothing was written to the packed-weight cache"


def test_an_existing_output_needs_replace_ticked_and_a_source_file_never(qtbot, bf16_hf_model, tmp_path):
    """Issue 13 item 3: the wizard asks before replacing a file, and never offers to write over the source."""
    w = _open(qtbot, bf16_hf_model)
    w.next()
    opts = w.options_page
    existing = tmp_path / "older.gguf"
    existing.write_bytes(b"an older conversion")
    opts.out.setText(str(existing))
    assert not opts.isComplete() and "Replace the existing file" in opts.space.text()
    assert opts.replace.isVisibleTo(opts)
    opts.replace.setChecked(True)
    assert opts.isComplete() and opts.options()["force"] is True
    opts.out.setText(str(bf16_hf_model / "model.safetensors"))
    assert not opts.isComplete() and "file of the model being converted" in opts.space.text()
    opts.out.setText(str(tmp_path / "new.gguf"))
    assert opts.isComplete() and opts.options()["force"] is False and not opts.replace.isVisibleTo(opts)
