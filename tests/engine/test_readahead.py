"""engine.readahead: a model file is asked into the page cache on a thread, only when it fits in available memory, and
a closed session stops it (issue 12 item 3, cold loads)."""

from __future__ import annotations

import os

import pytest

from tessera.engine import readahead


def test_reads_every_file_and_ends(tmp_path, monkeypatch):
    asked: list[tuple[int, int]] = []
    real = os.posix_fadvise
    monkeypatch.setattr(readahead, "CHUNK", 1000)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: (asked.append((off, n)), real(fd, off, n,
                                                                                                      advice)))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 2500)
    b.write_bytes(b"y" * 10)
    ahead = readahead.start([a, b])
    assert ahead is not None and ahead.join(10)
    assert asked == [(0, 1000), (1000, 1000), (2000, 500), (0, 10)]  # in order, each byte once


def test_not_when_the_files_do_not_fit_in_available_memory(tmp_path, monkeypatch):
    f = tmp_path / "big"
    f.write_bytes(b"x" * 4096)
    monkeypatch.setattr(readahead, "_available_memory", lambda: 4095)
    assert readahead.start([f]) is None
    monkeypatch.setattr(readahead, "_available_memory", lambda: 4096)
    ahead = readahead.start([f])
    assert ahead is not None and ahead.join(10)


def test_a_missing_file_is_no_error(tmp_path):
    assert readahead.start([tmp_path / "gone"]) is None


def test_stop_ends_it_within_a_chunk(tmp_path, monkeypatch):
    import threading

    gate, asked = threading.Event(), []

    def slow(fd, off, n, advice):
        asked.append(off)
        gate.wait(5)

    monkeypatch.setattr(readahead, "CHUNK", 10)
    monkeypatch.setattr(os, "posix_fadvise", slow)
    f = tmp_path / "m"
    f.write_bytes(b"x" * 1000)
    ahead = readahead.start([f])
    ahead.stop()
    gate.set()
    assert ahead.join(10) and len(asked) <= 1


@pytest.mark.parametrize("fails", [True, False])
def test_a_session_stops_its_read_ahead_when_closed(tiny_gguf_model, monkeypatch, fails):
    from tessera import engine

    started = []
    real = readahead.start

    def spy(paths):
        ahead = real(paths)
        started.append(ahead)
        return ahead

    monkeypatch.setattr(readahead, "start", spy)
    if fails:  # a load that fails after the read-ahead began stops it too
        from tessera.engine import weights

        def boom(*a, **k):
            raise RuntimeError("load failed")

        monkeypatch.setattr(weights, "load_weights", boom)
        with pytest.raises(RuntimeError, match="load failed"):
            engine.load(tiny_gguf_model, backend="Torch")
    else:
        s = engine.load(tiny_gguf_model, backend="Torch")
        assert s.readahead is started[0]
        s.close()
    assert started and started[0] is not None and started[0]._stop.is_set() and started[0].join(10)
