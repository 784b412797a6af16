"""Live graphs (pyqtgraph): decode tok/s over generation time, and per reply prefill tok/s, time to first token and
cache-hit rates, plus a bandwidth readout. Only measured numbers are drawn: a series with no data says why instead of
showing a made-up line.

Each phase has its own axis (prefill runs at thousands of tok/s, decode at tens to hundreds). The decode line's x axis
is generation time: the seconds spent computing, with the idle time between replies left out (a gap marks each new
reply). Time to first token is in milliseconds here and in each reply's footer."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from tessera.app.payloads import GenerationResult, TokenChunk

NO_EXPERT_CACHE = "no GPU expert cache"
DECODE_WINDOW = 8  # decode tok/s is measured over the last 8 decode steps (one point per streamed chunk)


class GraphsPanel(QWidget):
    def __init__(self, dark: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.busy_s = 0.0  # seconds spent generating so far (the decode line's x axis)
        self.decode_x: list[float] = []
        self.decode_y: list[float] = []
        self.prefill_x: list[int] = []  # reply numbers
        self.prefill_y: list[float] = []  # prefill tok/s of that reply
        self.ttft: list[float] = []
        self.prefix_hit: list[float] = []  # percent, one per request
        self.expert_hit: list[float] = []  # percent, one per request that had an expert cache
        self.expert_x: list[int] = []  # request numbers of those
        self.requests = 0
        self.measured_gbs = 0.0
        self.twin = False  # the GPU half runs on the CPU (GPU use = twin): say so instead of "on the GPU"
        self._req_bytes = 0
        self._req_seconds = 0.0
        self._recent: list[tuple[int, float]] = []  # (tokens, seconds) of the last decode steps
        self._prefill = [0, 0.0]  # tokens and seconds of this reply's prefill steps

        pg.setConfigOptions(antialias=True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        grid = QGridLayout()
        layout.addLayout(grid, 1)
        self._titles: dict[pg.PlotWidget, tuple[str, str, str]] = {}

        def plot(title: str, left: str, bottom: str) -> pg.PlotWidget:
            w = pg.PlotWidget()
            self._titles[w] = (title, left, bottom)
            w.showGrid(x=True, y=True, alpha=0.2)
            w.setMinimumHeight(120)
            w.setAccessibleName(title)
            return w

        self.speed_plot = plot("Decode tokens per second", "tok/s", "generation time (s, idle time left out)")
        self.decode_curve = self.speed_plot.plot([], [], pen=pg.mkPen("#2b7bd6", width=2), name="decode",
                                                 connect="finite")
        self.prefill_plot = plot("Prefill tokens per second", "tok/s", "reply")
        self.prefill_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush="#e07b00")
        self.prefill_plot.addItem(self.prefill_bars)
        self.ttft_plot = plot("Time to first token", "ms", "reply")
        self.ttft_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush="#7a5cc7")
        self.ttft_plot.addItem(self.ttft_bars)
        # the legend is in the title (coloured names), where it cannot cover a point
        self.hit_plot = plot("Hits: <span style='color:#2a9d55'>■ prefix KV</span> "
                             "<span style='color:#c0392b'>▲ experts</span>", "%", "reply")
        self.hit_plot.setYRange(0, 100)
        self.prefix_curve = self.hit_plot.plot([], [], pen=pg.mkPen("#2a9d55", width=2), symbol="s", symbolSize=6,
                                               symbolBrush="#2a9d55", name="prefix KV")
        self.expert_curve = self.hit_plot.plot([], [], pen=pg.mkPen("#c0392b", width=2), symbol="t", symbolSize=6,
                                               symbolBrush="#c0392b", name="expert cache")
        for w in (self.ttft_plot, self.hit_plot, self.speed_plot, self.prefill_plot):
            w.getAxis("left").enableAutoSIPrefix(False)
            w.getAxis("bottom").enableAutoSIPrefix(False)  # seconds stay seconds (no "x0.001")
        for w in (self.prefill_plot, self.ttft_plot, self.hit_plot):
            w.getAxis("bottom").setTickSpacing(1, 1)
            w.setXRange(0.5, 5.5, padding=0)
        for column, (w, stretch) in enumerate(((self.speed_plot, 2), (self.prefill_plot, 1), (self.ttft_plot, 1),
                                               (self.hit_plot, 1))):
            grid.addWidget(w, 0, column)
            grid.setColumnStretch(column, stretch)

        self.set_dark(dark)
        self.expert_label = QLabel(f"Expert cache: {NO_EXPERT_CACHE}")
        self.expert_label.setAccessibleName("Expert cache status")
        self.bandwidth_label = QLabel()
        self.bandwidth_label.setAccessibleName("Memory bandwidth used")
        for lab in (self.expert_label, self.bandwidth_label):
            lab.setStyleSheet("color: gray;")
            layout.addWidget(lab)
        self._show_bandwidth(None)

    def set_dark(self, dark: bool) -> None:
        bg, fg = ("#1e1e1e", "#dddddd") if dark else ("#ffffff", "#333333")
        for w, (title, left, bottom) in self._titles.items():
            w.setBackground(bg)
            w.setTitle(title, color=fg, size="9pt")
            w.setLabel("left", left, color=fg)
            w.setLabel("bottom", bottom, color=fg)
            for axis in ("left", "bottom"):
                w.getAxis(axis).setTextPen(fg)

    def set_measured_bandwidth(self, gbs: float) -> None:
        self.measured_gbs = float(gbs)
        self._show_bandwidth(None)

    def add_chunk(self, chunk: TokenChunk) -> None:
        """Fold the steps of one streamed chunk into the tok/s series (prefill: one bar per reply; decode: one point
        per chunk, at the generation time reached)."""
        prefill = [st for st in chunk.steps if st.phase == "prefill"]
        self._prefill[0] += sum(st.tokens for st in prefill)
        self._prefill[1] += sum(st.seconds for st in prefill)
        if prefill and self._prefill[1] > 0:
            if not self.prefill_x or self.prefill_x[-1] != self.requests + 1:
                self.prefill_x.append(self.requests + 1)
                self.prefill_y.append(0.0)
            self.prefill_y[-1] = self._prefill[0] / self._prefill[1]  # all of this reply's prefill steps so far
            self.prefill_bars.setOpts(x=self.prefill_x, height=self.prefill_y, width=0.6)
            self.prefill_plot.setXRange(0.5, max(5, self.requests + 1) + 0.5, padding=0)
        self.busy_s += sum(st.seconds for st in chunk.steps)
        now = self.busy_s
        decode = [st for st in chunk.steps if st.phase == "decode"]
        self._recent = (self._recent + [(st.tokens, st.seconds) for st in decode])[-DECODE_WINDOW:]
        secs = sum(sec for _t, sec in self._recent)
        if decode and secs > 0:
            self.decode_x.append(now)
            self.decode_y.append(sum(t for t, _sec in self._recent) / secs)
        for st in decode:
            self._req_bytes += st.expert_bytes
            self._req_seconds += st.seconds
        self.decode_curve.setData(self.decode_x, self.decode_y)

    def add_result(self, result: GenerationResult) -> None:
        m = result.metrics
        self._recent = []
        self._prefill = [0, 0.0]
        if self.decode_x and self.decode_y[-1] == self.decode_y[-1]:  # a gap (NaN) between requests in the line
            self.decode_x.append(self.decode_x[-1])
            self.decode_y.append(float("nan"))
            self.decode_curve.setData(self.decode_x, self.decode_y)
        if result.error or not m.get("prompt_tokens"):
            self._req_bytes, self._req_seconds = 0, 0.0
            return
        self.requests += 1
        self.ttft.append(1000.0 * float(m.get("ttft_s", 0.0)))
        self.prefix_hit.append(100.0 * float(m.get("prefix_hit_rate", 0.0)))
        xs = list(range(1, self.requests + 1))
        self.ttft_bars.setOpts(x=xs, height=self.ttft, width=0.6)
        self.prefix_curve.setData(xs, self.prefix_hit)
        for w in (self.ttft_plot, self.hit_plot):
            w.setXRange(0.5, max(5, self.requests) + 0.5, padding=0)
        hit = m.get("expert_cache_hit_rate")
        if hit is not None:
            self.expert_hit.append(100.0 * float(hit))
            self.expert_x.append(self.requests)
            self.expert_curve.setData(self.expert_x, self.expert_hit)
            where = "by the GPU half (CPU twin)" if self.twin else "on the GPU"
            self.expert_label.setText(f"Expert cache: {100.0 * float(hit):.0f}% of routed experts served {where}")
        elif not self.expert_hit:
            self.expert_label.setText(f"Expert cache: {NO_EXPERT_CACHE}")
        achieved = self._req_bytes / self._req_seconds / 1e9 if self._req_seconds > 0 and self._req_bytes else None
        self._show_bandwidth(achieved)
        self._req_bytes, self._req_seconds = 0, 0.0

    def _show_bandwidth(self, achieved_gbs: float | None) -> None:
        if achieved_gbs is None:
            text = "Bandwidth used: no expert-weight byte counts yet"
            if self.measured_gbs > 0:
                text += f" (machine measured at {self.measured_gbs:.1f} GB/s)"
            else:
                text += " (run the hardware wizard to measure the machine's bandwidth)"
        elif self.measured_gbs > 0:
            text = (f"Bandwidth used: {achieved_gbs:.2f} GB/s of expert weights, "
                    f"{100 * achieved_gbs / self.measured_gbs:.0f}% of the measured {self.measured_gbs:.1f} GB/s")
        else:
            text = (f"Bandwidth used: {achieved_gbs:.2f} GB/s of expert weights "
                    "(run the hardware wizard to compare with the machine's bandwidth)")
        self.bandwidth_label.setText(text)
