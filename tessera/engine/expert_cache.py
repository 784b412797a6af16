"""The hot-expert cache: the most-used experts of each MoE layer live on the accelerator and are computed there; the
rest go to the CPU backend, which runs at the same time.

It is itself an `ExpertBackend`, wrapped around the CPU one, so tessera/engine/model.py does not know it exists. With
device "cuda" the accelerator is the GPU; with device "cpu" it is the CPU twin: the same selection, transfers through
reused host buffers, concurrent CPU submission and summation, with torch on the CPU standing in for the GPU. Tests run
every branch through the twin.

Letters: T tokens, H hidden, I moe_intermediate, E experts in a layer, k experts per token, N experts resident.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from tessera.engine.experts import ExpertBackend, LayerExperts


@dataclass
class CacheStats:
    """Routed (token, expert) pairs seen since the last `take_step_stats`, and how many were served on the
    accelerator."""

    pairs: int = 0
    pairs_on_device: int = 0
    total_pairs: int = 0
    total_on_device: int = 0


class _Pending:
    """A submitted native computation, with the `result()` of a Future."""

    def __init__(self, sync):
        self._sync = sync

    def result(self) -> torch.Tensor:
        return self._sync()


@dataclass
class _Resident:
    """The experts of one layer held on the accelerator."""

    slot_of: torch.Tensor  # [E] int64 on device: slot index of each expert, -1 when not resident
    gate_up: torch.Tensor  # [N, 2I, H] on device
    down: torch.Tensor  # [N, H, I] on device
    experts: list[int] = field(default_factory=list)


class HotExpertCache(ExpertBackend):
    """ExpertBackend that serves resident experts on `device` and sends the other (token, expert) pairs to
    `cpu_backend`.

    experts_per_layer: the VRAM budget, as experts per MoE layer (0 disables the cache; all pairs go to the CPU).
    rebalance_every: re-pick the resident experts from routing statistics every this many forward steps (0 = never).
    decay: weight of past routing counts at each rebalance (recent use matters more).
    prefill_threshold: batches of at least this many tokens run every routed expert of the layer on the accelerator,
        streaming the non-resident experts' weights there (layerwise prefill); None keeps them on the CPU backend.
    """

    def __init__(
        self,
        cpu_backend: ExpertBackend,
        layers: dict[int, LayerExperts],
        *,
        device: str | torch.device = "cpu",
        experts_per_layer: int = 0,
        rebalance_every: int = 64,
        decay: float = 0.5,
        dtype: torch.dtype | None = None,
        prefill_threshold: int | None = None,
    ):
        self.cpu_backend = cpu_backend
        self.layers = layers
        self.device = torch.device(device)
        self.twin = self.device.type == "cpu"
        self.name = f"{cpu_backend.name}+{'twin' if self.twin else self.device.type}-cache"
        self.reason = cpu_backend.reason
        # The twin computes in f32 so that its logits equal the all-CPU engine's; on a GPU, experts keep their stored
        # dtype to save VRAM.
        self.dtype = dtype or (torch.float32 if self.twin else next(iter(layers.values())).gate_proj.dtype)
        self.experts_per_layer = experts_per_layer
        self.rebalance_every = rebalance_every
        self.decay = decay
        self.prefill_threshold = prefill_threshold
        self.stats = CacheStats()
        self.counts = {i: torch.zeros(le.num_experts, dtype=torch.float64) for i, le in layers.items()}  # [E] per layer
        self.resident: dict[int, _Resident] = {}
        self._steps = 0
        self._first_layer = min(layers) if layers else 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-cpu-experts")
        self._host_buffers: dict[str, torch.Tensor] = {}
        for i in layers:
            self._set_resident(i, list(range(min(experts_per_layer, layers[i].num_experts))))

    # ----------------------------------------------------------------------------------------------------- selection
    def _set_resident(self, layer: int, experts: list[int]) -> None:
        self.resident[layer] = self._upload(layer, experts)

    def _upload(self, layer: int, experts: list[int]) -> _Resident:
        """Copy the given experts of a layer to the accelerator, fused gate|up."""
        le = self.layers[layer]
        experts = sorted(experts)
        slot_of = torch.full((le.num_experts,), -1, dtype=torch.int64)
        slot_of[experts] = torch.arange(len(experts))
        idx = torch.tensor(experts, dtype=torch.int64)
        gate_up = torch.cat([le.gate_proj[idx], le.up_proj[idx]], dim=1)  # [N, 2I, H]
        down = le.down_proj[idx]  # [N, H, I]
        return _Resident(
            slot_of=slot_of.to(self.device),
            gate_up=gate_up.to(self.device, self.dtype),
            down=down.to(self.device, self.dtype),
            experts=experts,
        )

    def rebalance(self) -> dict[int, list[int]]:
        """Make the most-used experts of each layer resident (ties keep the currently resident ones). Returns the
        sets."""
        for layer, counts in self.counts.items():
            n = min(self.experts_per_layer, counts.numel())
            current = set(self.resident[layer].experts)
            bonus = torch.tensor([1e-9 if e in current else 0.0 for e in range(counts.numel())], dtype=torch.float64)
            top = torch.topk(counts + bonus, n).indices.tolist() if n else []
            if set(top) != current:
                self._set_resident(layer, top)
            counts.mul_(self.decay)
        return {layer: list(r.experts) for layer, r in self.resident.items()}

    def observe(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Add routing decisions to the statistics (also used by warm-up on the user's recent prompts)."""
        ids = topk_ids.reshape(-1).to("cpu")
        ids = ids[ids >= 0]
        self.counts[layer] += torch.bincount(ids, minlength=self.counts[layer].numel()).to(torch.float64)

    def take_step_stats(self) -> tuple[int, int]:
        """(pairs, pairs served on the accelerator) since the previous call; for StepMetrics and the hit-rate graph."""
        with self._lock:
            out = (self.stats.pairs, self.stats.pairs_on_device)
            self.stats.pairs = self.stats.pairs_on_device = 0
        return out

    def resident_experts(self, layer: int) -> list[int]:
        return list(self.resident[layer].experts)

    # ------------------------------------------------------------------------------------------------------- forward
    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        # x: [T, H] on the model's device; topk_ids: [T, k]; topk_weights: [T, k]
        if layer == self._first_layer:
            self._steps += 1
            if self.rebalance_every and self.experts_per_layer and self._steps % self.rebalance_every == 0:
                self.rebalance()
        res = self.resident[layer]
        self.observe(layer, topk_ids)
        if self.prefill_threshold is not None and x.shape[0] >= self.prefill_threshold:
            # Layerwise prefill: this batch's experts all go to the accelerator for this layer only.
            res = self._upload(layer, torch.unique(topk_ids[topk_ids >= 0]).tolist())
        slots = res.slot_of[topk_ids.to(res.slot_of.device)]  # [T, k] slot or -1
        on_device = slots >= 0  # [T, k]
        n_pairs, n_dev = topk_ids.numel(), int(on_device.sum())
        with self._lock:
            self.stats.pairs += n_pairs
            self.stats.pairs_on_device += n_dev
            self.stats.total_pairs += n_pairs
            self.stats.total_on_device += n_dev

        cpu_future = None
        if n_dev < n_pairs:
            cpu_future = self._submit_cpu(layer, x, topk_ids, topk_weights, on_device)
        out = torch.zeros(x.shape, dtype=torch.float32, device=self.device)  # [T, H]
        if n_dev:
            out += self._device_forward(res, x.to(self.device), slots, topk_weights.to(self.device), on_device)
        if cpu_future is not None:
            out += self._receive(cpu_future.result())
        return out.to(x.device)

    def _device_forward(self, res: _Resident, x, slots, weights, on_device) -> torch.Tensor:
        """Resident experts on the accelerator, grouped by slot."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
        I = res.down.shape[-1]
        for s in torch.unique(slots[on_device]).tolist():
            token_idx, slot = torch.nonzero(slots == s, as_tuple=True)  # [n], [n]
            xs = x[token_idx].to(self.dtype)  # [n, H]
            gu = xs @ res.gate_up[s].T  # [n, 2I]
            h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]  # [n, I]
            y = (h @ res.down[s].T).float()  # [n, H]
            out.index_add_(0, token_idx, y * weights[token_idx, slot].unsqueeze(-1).float())
        return out

    # ------------------------------------------------------------------------------------------------ CPU transfers
    def _host(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A reused host buffer (pinned when a GPU is present) at least as large as `like`, viewed to its shape."""
        buf = self._host_buffers.get(name)
        n = like.numel()
        if buf is None or buf.numel() < n or buf.dtype != like.dtype:
            buf = torch.empty(max(n, 1), dtype=like.dtype, pin_memory=not self.twin and torch.cuda.is_available())
            self._host_buffers[name] = buf
        return buf[:n].view(like.shape)

    def _submit_cpu(self, layer, x, topk_ids, topk_weights, on_device):
        """Copy the non-resident pairs to host buffers and start the CPU backend on them; returns at once."""
        ids_cpu, w_cpu = self._cpu_routing(topk_ids, topk_weights, on_device)  # [T, k'] each
        x_host = self._host("x", x)
        x_host.copy_(x, non_blocking=not self.twin)
        ids_host = self._host("ids", ids_cpu)
        ids_host.copy_(ids_cpu, non_blocking=not self.twin)
        w_host = self._host("w", w_cpu)
        w_host.copy_(w_cpu, non_blocking=not self.twin)
        if not self.twin:
            torch.cuda.current_stream().synchronize()  # the host copies above have landed (a few KB per token)
        if self.cpu_backend.pool is not None:
            # A native backend runs on its own thread pool: submit returns at once, sync() waits for the result.
            self.cpu_backend.submit(layer, x_host, ids_host, w_host)
            return _Pending(self.cpu_backend.sync)
        return self._pool.submit(self.cpu_backend.forward, layer, x_host, ids_host, w_host)  # [T, H] when done

    def _receive(self, y_cpu: torch.Tensor) -> torch.Tensor:
        if self.twin:
            return y_cpu
        return y_cpu.to(self.device, non_blocking=False)

    def _cpu_routing(self, topk_ids, topk_weights, on_device) -> tuple[torch.Tensor, torch.Tensor]:
        """The pairs the CPU must compute, in a form its backend accepts.

        Backends that accept -1 ids skip them. Otherwise rows are compacted when every row keeps the same number of CPU
        pairs (always true in decode, T = 1); else a resident pair is replaced by one of the row's CPU experts with
        weight 0, which costs a little work and changes nothing.
        """
        ids = topk_ids.to("cpu")  # [T, k]
        w = topk_weights.to("cpu", torch.float32)  # [T, k]
        keep = ~on_device.to("cpu")  # [T, k]
        if self.cpu_backend.supports_skip:
            return torch.where(keep, ids, torch.full_like(ids, -1)), torch.where(keep, w, torch.zeros_like(w))
        per_row = keep.sum(dim=1)  # [T]
        if bool((per_row == per_row[0]).all()) and int(per_row[0]) > 0:
            kk = int(per_row[0])
            return ids[keep].view(-1, kk), w[keep].view(-1, kk)
        first_kept = torch.argmax(keep.to(torch.int8), dim=1, keepdim=True)  # [T, 1]
        filler = torch.gather(ids, 1, first_kept).expand_as(ids)  # [T, k]
        return torch.where(keep, ids, filler), torch.where(keep, w, torch.zeros_like(w))

    def close(self, finish_writes: bool = True) -> None:
        self._pool.shutdown(wait=True)
        self.cpu_backend.close(finish_writes)
