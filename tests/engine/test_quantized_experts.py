"""Quantized GGUF routed experts stay as their memory-mapped blocks (engine.quantized): exact per-expert dequantization,
the pure-torch experts and the native backends reading them in place, the NaN/Inf block-scale check, and the load-size
figures inspect_model reports with the loader's own rules."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from tessera.engine import backends
from tessera.engine.errors import ModelFormatError
from tessera.engine.experts import TorchExperts
from tessera.engine.model import layer_experts
from tessera.engine.model_info import estimate_ram, inspect_model
from tessera.engine.quantized import QuantizedMatrix, QuantizedTensor, held_bytes, widened
from tessera.engine.weights import load_weights

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def q4km(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("q4km") / "m.gguf", preset="tiny-kquant", fmt="gguf", dtype="q4_k_m")


def test_experts_stay_blocks_and_dequantize_exactly(q4km):
    w = load_weights(q4km)
    reader = gguf.GGUFReader(q4km)
    stored = {t.name: t for t in reader.tensors}
    for layer in range(w.config.num_hidden_layers):
        for proj, gguf_name in (("gate_proj", "ffn_gate_exps"), ("down_proj", "ffn_down_exps")):
            t = w.tensors[f"model.layers.{layer}.mlp.experts.{proj}"]
            src = stored[f"blk.{layer}.{gguf_name}.weight"]
            assert isinstance(t, QuantizedTensor) and t.qtype == Q(src.tensor_type) and t.dtype == torch.float32
            assert not t.raw.flags.owndata and t.nbytes == src.n_bytes  # a view of the map, not a copy
            want = dequantize(np.asarray(src.data), t.qtype).reshape(tuple(t.shape))  # [E, R, C]
            assert torch.equal(t[3], torch.from_numpy(want[3]))
            assert torch.equal(t[torch.tensor([4, 1])], torch.from_numpy(want[[4, 1]]))
    # Q4_K and Q6_K both appear among the experts (q4_k_m: ffn_down of layers 2, 3 is Q6_K).
    assert {w.tensors[f"model.layers.{i}.mlp.experts.down_proj"].qtype for i in range(4)} == {Q.Q4_K, Q.Q6_K}
    # The 2-D weights stay blocks too (engine.quantized.QuantizedMatrix; tests/engine/test_quant_dense.py).
    assert isinstance(w.tensors["model.layers.0.self_attn.q_proj.weight"], QuantizedMatrix)
    assert w.nbytes == inspect_model(q4km).loaded_bytes


def test_torch_experts_on_blocks_equal_torch_experts_on_the_widened_layer(q4km):
    w = load_weights(q4km)
    layers = layer_experts(w.config, w.tensors)
    wide = {i: widened(le) for i, le in layers.items()}
    assert all(isinstance(le.gate_proj, torch.Tensor) for le in wide.values())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, w.config.hidden_size, generator=g)  # [T, H]
    ids = torch.randint(0, w.config.num_experts, (7, 2), generator=g)  # [T, k]
    weights = torch.rand(7, 2, generator=g)  # [T, k]
    for i in layers:
        assert torch.equal(
            TorchExperts(layers).forward(i, x, ids, weights), TorchExperts(wide).forward(i, x, ids, weights)
        )


def test_native_backend_reads_quantized_experts_in_place_and_matches_torch(q4km, tmp_path, monkeypatch):
    """Reference reads the blocks in place (int8 activations per 32 values: NMSE bound 1e-3, see
    test_quant_experts_native.py); the rest of the model is the same code in both sessions."""
    from tessera import engine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ids = torch.arange(5, 30)
    torch_session = engine.load(q4km, backend="Torch", threads=1)
    try:
        want = torch_session.model.forward(ids, torch_session.model.new_cache(32, torch.float32), last_only=False)
    finally:
        torch_session.close()
    session = engine.load(q4km, backend="Reference", threads=1)
    try:
        got = session.model.forward(ids, session.model.new_cache(32, torch.float32), last_only=False)
        estimate = estimate_ram(session.info, 32, "Reference")
        stats = session.model.experts.load_stats
        assert set(stats.per_layer.values()) == {"in place"}
        assert estimate.packed_bytes == stats.packed_bytes == 0 == estimate.transient_bytes  # the loader's own figure
    finally:
        session.close()
    assert float(((got - want) ** 2).sum() / (want**2).sum()) <= 1e-3


def _patch_scale(path, tensor, block, offset, value):
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == tensor)
    size = gguf.GGML_QUANT_SIZES[Q(t.tensor_type)][1]
    data = bytearray(path.read_bytes())
    at = int(t.data_offset) + block * size + offset
    data[at : at + 2] = np.array([value], np.float16).tobytes()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("tensor", "offset", "value"),
    [
        ("blk.1.ffn_up_exps.weight", 0, np.float16(np.nan)),  # Q4_K d
        ("blk.1.ffn_up_exps.weight", 2, np.float16(np.inf)),  # Q4_K dmin
        ("blk.3.ffn_down_exps.weight", 208, np.float16(-np.inf)),  # Q6_K d
        ("blk.0.attn_q.weight", 0, np.float16(np.nan)),  # a dense Q4_K matrix is checked too
    ],
)
def test_a_nan_or_inf_block_scale_is_refused_by_name(q4km, tmp_path, tensor, offset, value):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(q4km.read_bytes())
    _patch_scale(bad, tensor, 37, offset, value)
    with pytest.raises(ModelFormatError, match=rf"tensor {tensor}: block 37 has a NaN or Inf scale"):
        load_weights(bad)


def test_inspect_reports_the_type_mix_and_a_ram_estimate(q4km):
    info = inspect_model(q4km, context_length=300, backend="Torch")
    reader = gguf.GGUFReader(q4km)
    by_type: dict[str, int] = {}
    for t in reader.tensors:
        by_type[Q(t.tensor_type).name] = by_type.get(Q(t.tensor_type).name, 0) + int(t.n_bytes)
    assert info.type_bytes == dict(sorted(by_type.items())) and sum(info.type_bytes.values()) == info.total_bytes
    assert set(info.tensor_types) == {"F32", "Q4_K", "Q6_K"}
    # Held as the loader holds them: every quantized tensor as its blocks (Q4_K/Q6_K all have kernels), so as stored.
    held = sum(
        held_bytes(Q(t.tensor_type), int(np.prod(t.shape)), int(t.n_bytes), "_exps" in t.name) for t in reader.tensors
    )
    assert info.loaded_bytes == held == info.total_bytes
    ram = info.ram
    assert ram is not None and ram.backend == "Torch" and ram.packed_bytes == ram.transient_bytes == 0
    cfg = (info.num_hidden_layers, info.num_key_value_heads, info.head_dim)
    assert ram.kv_bytes == 2 * cfg[0] * cfg[1] * cfg[2] * 300 * 2 + 2 * cfg[1] * cfg[2] * 300 * 4  # bf16 + f32 scratch
    assert ram.prefill_bytes == 300 * info.num_experts_per_tok * (info.moe_intermediate_size + info.hidden_size) * 4
    assert ram.total_bytes == ram.weights_bytes + ram.kv_bytes + ram.prefill_bytes  # a 300-token step at most
    native = [n for n in backends.available_names() if n not in ("Auto", "Torch")]
    if native:
        est = estimate_ram(info, 300, native[0])  # reads the blocks in place
        assert est.packed_bytes == est.transient_bytes == 0
    widening = [n for n in native if n in ("AVX512", "AMXBF16")]  # bf16 backends named explicitly widen
    if widening:
        est = estimate_ram(info, 300, widening[0])
        assert est.packed_bytes > 0 and est.transient_bytes == 3 * 6 * 256 * 256 * 4  # one layer widened
