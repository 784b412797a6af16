"""engine.scale_record: a quantized file whose block scales passed the NaN/Inf check is not scanned again while it is
unchanged (issue 12 item 3, load time); a new, edited, replaced or just-written file always is (item 6)."""

from __future__ import annotations

import os
import time

import gguf
import numpy as np
import pytest

import tessera.engine.quantized as quantized
import tessera.engine.weights as weights
from tessera.engine import scale_record
from tessera.engine.errors import ModelFormatError
from tessera.engine.weights import load_weights

TENSOR = "blk.1.ffn_up_exps.weight"  # Q4_K in the tiny-kquant q4_k_m mix: f16 d at offset 0 of each 144-byte block


@pytest.fixture(scope="module")
def q4km(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("q4km") / "m.gguf", preset="tiny-kquant", fmt="gguf", dtype="q4_k_m")


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """Records in a folder of this test; returns the list check_scales appends each checked tensor to. The racy
    margin is shortened so the tests wait 0.4 s for a file to age, not 2 s."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(scale_record, "RACY_SECONDS", 0.3)
    calls: list[str] = []
    real = quantized.check_scales

    def check(raw, qtype, subject, tensor):
        calls.append(tensor)
        real(raw, qtype, subject, tensor)

    monkeypatch.setattr(weights, "check_scales", check)
    return calls


def _copy_aged(src, dst):
    """A copy of `src` whose last change is older than RACY_SECONDS (as a file downloaded a while ago)."""
    dst.write_bytes(src.read_bytes())
    time.sleep(scale_record.RACY_SECONDS + 0.1)
    return dst


def _set_scale(path, block, value):
    """Writes one f16 scale of TENSOR in place (same size), then puts the mtime back as it was."""
    st = os.stat(path)
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == TENSOR)
    with open(path, "r+b") as f:
        f.seek(int(t.data_offset) + block * 144)
        f.write(np.array([value], np.float16).tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_checked_unchanged_file_is_not_scanned_again(q4km, tmp_path, counted):
    model = _copy_aged(q4km, tmp_path / "m.gguf")
    load_weights(model)
    first = len(counted)
    assert first > 0 and TENSOR in counted
    assert len(list(scale_record.default_folder().glob("*.json"))) == 1
    counted.clear()
    load_weights(model)
    assert counted == []


def test_an_edit_in_place_with_the_mtime_put_back_is_checked_again(q4km, tmp_path, counted):
    model = _copy_aged(q4km, tmp_path / "m.gguf")
    load_weights(model)
    time.sleep(0.05)  # past the coarse clock's tick, so ctime moves
    _set_scale(model, 37, np.float16(np.nan))
    counted.clear()
    with pytest.raises(ModelFormatError, match=rf"tensor {TENSOR}: block 37 has a NaN or Inf scale"):
        load_weights(model)
    assert TENSOR in counted


def test_a_replaced_file_under_the_same_name_is_checked_again(q4km, tmp_path, counted):
    model = _copy_aged(q4km, tmp_path / "m.gguf")
    load_weights(model)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(q4km.read_bytes())
    _set_scale(bad, 5, np.float16(np.inf))
    os.replace(bad, model)  # another inode, same size
    with pytest.raises(ModelFormatError, match="block 5 has a NaN or Inf scale"):
        load_weights(model)


def test_a_file_changed_just_before_the_load_is_not_recorded(q4km, tmp_path, counted):
    model = tmp_path / "fresh.gguf"
    model.write_bytes(q4km.read_bytes())
    load_weights(model)
    assert not list(scale_record.default_folder().glob("*.json"))  # racy: checked again next time
    counted.clear()
    load_weights(model)
    assert TENSOR in counted


def test_a_refused_file_gets_no_record(q4km, tmp_path, counted):
    model = _copy_aged(q4km, tmp_path / "bad.gguf")
    _set_scale(model, 3, np.float16(np.nan))
    time.sleep(scale_record.RACY_SECONDS + 0.1)
    for _ in range(2):
        with pytest.raises(ModelFormatError, match="block 3 has a NaN or Inf scale"):
            load_weights(model)
    assert not list(scale_record.default_folder().glob("*.json"))


def test_records_of_gone_or_changed_files_are_pruned(tmp_path):
    folder = tmp_path / "records"
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    for p in (a, b):
        p.write_bytes(b"x" * 10)
    old = time.time() + 10  # as if opened well after the last change
    parts_a = [scale_record.identity(a, os.stat(a))]
    parts_b = [scale_record.identity(b, os.stat(b))]
    assert scale_record.mark_checked(parts_a, old, folder) and scale_record.mark_checked(parts_b, old, folder)
    assert scale_record.is_checked(parts_a, folder) and scale_record.is_checked(parts_b, folder)
    (folder / "junk.json").write_text("not json")
    a.unlink()
    assert scale_record.prune(folder) == 2  # a's record and the junk
    assert not scale_record.is_checked(parts_a, folder) and scale_record.is_checked(parts_b, folder)
    assert scale_record.clear(folder) == 1 and not scale_record.is_checked(parts_b, folder)


def test_an_unwritable_folder_only_costs_the_speed_up(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    p = tmp_path / "m.bin"
    p.write_bytes(b"abc")
    parts = [scale_record.identity(p, os.stat(p))]
    assert not scale_record.mark_checked(parts, time.time() + 10, blocker / "records")
    assert not scale_record.is_checked(parts, blocker / "records")
