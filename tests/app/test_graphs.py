"""The graphs panel draws only what the metrics say: tok/s per phase, TTFT and hit rates per request, expert-cache hit
rate only when there is a cache, achieved bandwidth against the measured one."""

from __future__ import annotations

import math

import pytest

from tessera.app.payloads import GenerationResult, StepSample, TokenChunk
from tessera.app.views.graphs import NO_EXPERT_CACHE, GraphsPanel


def chunk(steps, rid=1):
    return TokenChunk(rid, "x", len(steps), len(steps), 0.1, tuple(steps))


def result(rid=1, **m):
    base = {"prompt_tokens": 10, "ttft_s": 0.25, "prefix_hit_rate": 0.0, "expert_cache_hit_rate": None}
    return GenerationResult(rid, "x", {**base, **m})


def test_series_from_steps_and_results(qtbot):
    g = GraphsPanel()
    qtbot.addWidget(g)
    g.add_chunk(chunk([StepSample("prefill", 100, 0.5)]))
    g.add_chunk(chunk([StepSample("decode", 1, 0.1, expert_bytes=2_000_000_000)] * 2))
    g.add_chunk(chunk([StepSample("decode", 1, 0.3, expert_bytes=2_000_000_000)]))
    assert g.prefill_y == [pytest.approx(200.0)]
    assert g.decode_y == [pytest.approx(10.0), pytest.approx(3 / 0.5)]  # window over the last decode steps
    g.set_measured_bandwidth(50.0)
    g.add_result(result(prefix_hit_rate=0.0))
    assert g.ttft == [pytest.approx(250.0)] and g.prefix_hit == [0.0]
    assert g.expert_label.text() == f"Expert cache: {NO_EXPERT_CACHE}" and g.expert_hit == []
    assert "12.00 GB/s" in g.bandwidth_label.text() and "24% of the measured 50.0 GB/s" in g.bandwidth_label.text()
    assert math.isnan(g.decode_y[-1])  # a gap between requests
    g.add_chunk(chunk([StepSample("decode", 1, 0.1)], rid=2))
    g.add_result(result(2, prefix_hit_rate=0.75, expert_cache_hit_rate=0.4))
    assert g.prefix_hit == [0.0, 75.0] and g.expert_hit == [40.0]
    assert "40%" in g.expert_label.text()
    xs, ys = g.expert_curve.getData()
    assert list(xs) == [2] and list(ys) == [40.0]
    assert "no expert-weight byte counts" in g.bandwidth_label.text()  # request 2 reported no bytes


def test_failed_request_adds_no_points(qtbot):
    g = GraphsPanel()
    qtbot.addWidget(g)
    g.add_result(GenerationResult(1, "", {"stop_reason": "error"}, "boom"))
    assert g.requests == 0 and g.ttft == []
    assert "hardware wizard" in g.bandwidth_label.text()


def test_each_phase_has_its_own_scale_and_idle_time_is_left_out(qtbot):
    import time

    g = GraphsPanel()
    qtbot.addWidget(g)
    for rid in (1, 2):
        g.add_chunk(chunk([StepSample("prefill", 2000, 0.5), StepSample("prefill", 1000, 0.25)], rid))
        g.add_chunk(chunk([StepSample("decode", 1, 0.02)] * 4, rid))
        g.add_result(result(rid, ttft_s=0.0034))
        time.sleep(0.2)  # idle between replies: not on the x axis
    assert g.prefill_x == [1, 2] and g.prefill_y == [pytest.approx(4000.0)] * 2  # one bar per reply, its own plot
    assert g.prefill_plot is not g.speed_plot and g.prefill_plot.getPlotItem().vb is not g.speed_plot.getPlotItem().vb
    finite = [x for x, y in zip(g.decode_x, g.decode_y) if y == y]
    assert finite == [pytest.approx(0.75 + 0.08), pytest.approx(2 * 0.75 + 2 * 0.08)]  # generation seconds only
    assert [y for y in g.decode_y if y == y] == [pytest.approx(50.0)] * 2
    assert g.ttft == [pytest.approx(3.4)] * 2  # ms, as the footer says
    assert g.hit_plot.getPlotItem().legend is None and "prefix KV" in g.hit_plot.getPlotItem().titleLabel.text
