"""Memory section: a positive measured bandwidth with progress, cancellation, and hugepage/THP parsing."""

from __future__ import annotations

import threading

import pytest

from tessera.engine.errors import Cancelled
from tessera.engine.hardware import memory


@pytest.fixture(params=["native", "numpy-fallback"])
def probe_source(request, monkeypatch):
    if request.param == "numpy-fallback":
        monkeypatch.setattr(memory, "_native_probe", lambda: None)
    return request.param


def test_bandwidth_is_positive_and_reports_progress(probe_source):
    events = []
    gbs, source = memory.measure_read_bandwidth(2, 0.2, progress=events.append)
    assert gbs > 0.5  # any real machine reads more than half a GB/s
    assert source == probe_source
    assert [e.done for e in events] == list(range(1, memory.SLICES_PER_RUN + 1))
    assert all(e.total == memory.SLICES_PER_RUN for e in events)


def test_bandwidth_cancel_raises(probe_source):
    cancel = threading.Event()
    seen = []

    def progress(ev):
        seen.append(ev)
        cancel.set()

    with pytest.raises(Cancelled):
        memory.measure_read_bandwidth(1, 0.2, progress=progress, cancel=cancel)
    assert len(seen) == 1 if probe_source == "numpy-fallback" else len(seen) >= 1  # native runs to its end first
    with pytest.raises(Cancelled):  # already cancelled: nothing is measured
        memory.measure_read_bandwidth(1, 0.2, cancel=cancel)


def test_hugepages_parses_thp_mode_and_pool(tmp_path):
    (tmp_path / "enabled").write_text("always madvise [never]\n")
    (tmp_path / "defrag").write_text("[always] defer defer+madvise madvise never\n")
    meminfo = "MemTotal:       32768 kB\nHugePages_Total:      16\nHugePages_Free:        8\nHugepagesize:    2048 kB\n"
    hp = memory.hugepages(meminfo, thp_root=str(tmp_path))
    assert hp == {"thp_enabled": "never", "thp_defrag": "always", "hugepages_total": 16, "hugepages_free": 8,
                  "hugepage_size_kb": 2048}


def test_hugepages_without_thp_support(tmp_path):
    hp = memory.hugepages("", thp_root=str(tmp_path / "absent"))
    assert hp["thp_enabled"] is None and hp["hugepages_total"] == 0
