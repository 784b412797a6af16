"""Quantized GGUF routed experts through the native backends, read in place (engine.native.make_backend: BlockLayer).

Every backend this machine runs (emulated AMX included) on tiny random-weight files of every quantized type make-model
writes (q4_k_m, q5_k_m, q6_k, q8_0, q4_0, iq4_xs: Tessera's quantizer with llama-quantize's per-tensor mixes).

Oracles, never written by the code under test:
- One MoE layer: TorchExperts on the same layers, which multiply in float32 by the exact values of the blocks
  (engine.quantized.QuantizedTensor dequantizes like gguf.quants.dequantize; test_quantized_experts.py checks that).
  The block kernels quantize activations to int8 per 256 values (llama.cpp's Q8_K; step max|x|/127, a relative
  rounding error of ~2.4e-3 rms of the block's max), twice in a layer (x, then silu(gate x) * up x, whose heavy
  tails make its per-256 step larger): tests/native/test_quant_moe.py measures NMSE 1.2e-4 to 4.7e-4 against float64
  over every mix and T. Bound here NMSE <= 1e-3 (relative L2 error ~3e-2); a wrong type, a swapped projection, a dropped
  weight or a wrong expert gives NMSE of order 0.1 to 1. The bf16 backends chosen by name widen the blocks and keep bf16
  weights (relative rounding 2^-9): far inside the same bound.
- The whole model: the dequantized-F32 twin of the same file (every tensor replaced by gguf.quants.dequantize of its
  blocks, written as F32) run by the pure-torch experts. Teacher-forced over 64 random tokens: top-1 agreement >= 0.90
  and mean KL(twin || quantized) <= 0.01 nats. Random-weight logits are nearly flat (a vocabulary of 437 and small
  margins between the top two), so the per-layer errors above can flip a few near-ties of top-1 even when the
  distributions agree closely: 0.90 leaves room for those, and KL, which near-ties do not move, is the tight check
  (a broken layer gives KL of order 0.1 to 1 and top-1 near chance). Measured on this file's models (AVX512Int8, AVX512,
  AVX2, Reference): layer NMSE 1.2e-4 to 1.3e-4 in place (1.8e-5 for the widened bf16 path), top-1 0.95 to 1.0, KL 6e-6
  to 4e-5.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

import tessera.engine.native as N
from tessera import engine
from tessera.engine import backends
from tessera.engine.compare import compare_logits
from tessera.engine.errors import TesseraError
from tessera.engine.experts import TorchExperts
from tessera.engine.make_model import make_model
from tessera.engine.model import layer_experts
from tessera.engine.model_info import estimate_ram, inspect_model
from tessera.engine.quantized import QuantizedTensor
from tessera.engine.weights import load_weights

Q = gguf.GGMLQuantizationType
DTYPES = ("q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0", "iq4_xs")
BACKENDS = [n for n in backends.available_names(include_emulated=True)]
IN_PLACE = [n for n in BACKENDS if n not in N.WIDENING_BACKENDS]
INT8 = [b["name"] for b in backends.compiled() if b["available"] and b["weights"] == "int8"]  # real ones first
NMSE_LAYER = 1e-3
TOP1_MIN, KL_MAX = 0.90, 0.01


def nmse(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got.double() - want.double()) ** 2).sum() / (want.double() ** 2).sum())


def f32_twin(src, dst):
    """The same GGUF with every tensor dequantized (gguf.quants.dequantize) and stored as F32: same metadata, same
    names, so the same model in float32."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        value = int(gguf.LlamaFileType.ALL_F32) if name == "general.file_type" else field.contents()
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        values = dequantize(np.asarray(t.data), Q(t.tensor_type)).astype(np.float32)  # numpy order [..., ne0]
        writer.add_tensor(t.name, np.ascontiguousarray(values), raw_dtype=Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """dtype -> (quantized file, its F32 twin), made once for the module."""
    folder = tmp_path_factory.mktemp("quant-native")
    out = {}
    for dtype in DTYPES:
        q = make_model(folder / f"{dtype}.gguf", preset="tiny-kquant", fmt="gguf", dtype=dtype)
        out[dtype] = (q, f32_twin(q, folder / f"{dtype}-f32.gguf"))
    return out


@pytest.fixture(autouse=True)
def _private_pack_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(tmp_path / "pack-cache"))


def _routing(cfg, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, cfg.hidden_size, generator=g)  # [T, H]
    ids = torch.stack([torch.randperm(cfg.num_experts, generator=g)[: cfg.num_experts_per_tok] for _ in range(T)])
    w = torch.rand(T, cfg.num_experts_per_tok, generator=g)  # [T, k]
    return x, ids, w / w.sum(-1, keepdim=True)


def test_the_twin_holds_the_dequantized_values(models):
    q, twin = models["q4_k_m"]
    stored = {t.name: t for t in gguf.GGUFReader(q).tensors}
    for t in gguf.GGUFReader(twin).tensors:
        assert Q(t.tensor_type) == Q.F32
        src = stored[t.name]
        want = dequantize(np.asarray(src.data), Q(src.tensor_type)).reshape(np.asarray(t.data).shape)
        assert np.array_equal(np.asarray(t.data), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", BACKENDS)
def test_layer_output_matches_torch_experts_on_the_exact_values(models, dtype, name):
    w = load_weights(models[dtype][0])
    layers = layer_experts(w.config, w.tensors)
    b = N.make_backend(name, layers, threads=2)
    stats = b.load_stats
    if name in IN_PLACE:
        assert set(stats.per_layer.values()) == {"in place"} and stats.in_place_layers == len(layers)
        assert stats.packed_bytes == 0 and stats.quant_isa == N.quant_isa_for_backend(name)
    else:  # a bf16 backend named explicitly widens, after saying what it costs
        assert set(stats.per_layer.values()) == {"packed"} and stats.packed_bytes > 0
        assert any("widens this file's" in n for n in stats.notices)
    torch_experts = TorchExperts(layers)
    for T in (1, 37):
        x, ids, weights = _routing(w.config, T, seed=T)
        for layer in layers:
            got = b.forward(layer, x, ids, weights)
            want = torch_experts.forward(layer, x, ids, weights)
            assert got.shape == want.shape and torch.isfinite(got).all()
            assert nmse(got, want) <= NMSE_LAYER, (layer, T, nmse(got, want))
    b.close()


@pytest.mark.parametrize("name", IN_PLACE)
def test_submit_and_sync_give_forward_s_output(models, name):
    w = load_weights(models["q4_k_m"][0])
    layers = layer_experts(w.config, w.tensors)
    b = N.make_backend(name, layers, threads=2)
    x, ids, weights = _routing(w.config, 9, seed=3)
    for layer in layers:
        b.submit(layer, x, ids, weights)
        with pytest.raises(RuntimeError, match="call sync"):
            b.submit(layer, x, ids, weights)
        assert torch.equal(b.sync(), b.forward(layer, x, ids, weights))


def test_in_place_layers_are_never_widened(models, monkeypatch):
    """No expert is dequantized while loading or running: the block kernels read the file's bytes."""
    w = load_weights(models["q4_k_m"][0])
    layers = layer_experts(w.config, w.tensors)

    def refuse(self, *args):
        raise AssertionError(f"{self.name} was widened")

    monkeypatch.setattr(QuantizedTensor, "dequantize", refuse)
    monkeypatch.setattr(QuantizedTensor, "expert", refuse)
    b = N.make_backend("Auto", layers, threads=2)
    x, ids, weights = _routing(w.config, 5, seed=1)
    assert all(torch.isfinite(b.forward(layer, x, ids, weights)).all() for layer in layers)
    assert b.load_stats.packed_bytes == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [*BACKENDS, "Auto"])
def test_model_agrees_with_its_dequantized_f32_twin(models, dtype, name):
    q, twin = models[dtype]
    ids = torch.randint(0, 437, (64,), generator=torch.Generator().manual_seed(7))
    ref = engine.load(twin, backend="Torch", threads=2)
    try:
        want = ref.model.forward(ids, ref.model.new_cache(64, torch.float32), last_only=False)  # [T, V]
    finally:
        ref.close()
    s = engine.load(q, backend=name, threads=2)
    try:
        got = s.model.forward(ids, s.model.new_cache(64, torch.float32), last_only=False)  # [T, V]
    finally:
        s.close()
    r = compare_logits(want, got)  # KL(twin || quantized), as convert --verify judges it
    assert r.top1_agreement >= TOP1_MIN and r.mean_kl <= KL_MAX, r


def test_a_native_int8_load_of_a_quantized_file_writes_no_packed_copy(models, tmp_path):
    root = tmp_path / "pack-cache"
    events = []
    s = engine.load(models["q4_k_m"][0], backend=INT8[0], threads=2, progress=events.append)
    try:
        stats = s.model.experts.load_stats
        assert stats.packed_bytes == 0 and stats.packed_layers == stats.cached_layers == 0
        assert stats.in_place_layers == s.config.num_hidden_layers
        assert not root.exists() or not any(p.is_file() for p in root.rglob("*"))
        packs = [e for e in events if e.stage == "pack"]
        assert [e.done for e in packs] == list(range(1, s.config.num_hidden_layers + 1))
        assert all(e.detail.endswith("in place") for e in packs)
    finally:
        s.close()


@pytest.mark.parametrize("dtype", ("q4_k_m", "q8_0", "iq4_xs"))
@pytest.mark.parametrize("name", [*BACKENDS, "Auto"])
def test_ram_estimate_is_what_the_loader_takes(models, dtype, name):
    info = inspect_model(models[dtype][0])
    est = estimate_ram(info, 64, name)
    w = load_weights(models[dtype][0])
    b = N.make_backend(name, layer_experts(w.config, w.tensors), threads=1)
    stats = b.load_stats
    assert est.backend == b.name
    assert est.packed_bytes == stats.packed_bytes
    widened = stats.packed_layers + stats.cached_layers > 0
    assert est.transient_bytes == (3 * info.num_experts * info.moe_intermediate_size * info.hidden_size * 4
                                   if widened else 0)
    assert widened == (name in N.WIDENING_BACKENDS)


@pytest.mark.parametrize("name", [n for n in BACKENDS if n in N.WIDENING_BACKENDS])
def test_a_bf16_backend_refuses_to_widen_past_free_ram(models, name, monkeypatch):
    w = load_weights(models["q4_k_m"][0])
    layers = layer_experts(w.config, w.tensors)
    monkeypatch.setattr(N, "free_ram", lambda: 1 << 20)  # 1 MiB free
    twin = N.WIDENING_BACKENDS[name]
    with pytest.raises(TesseraError, match=rf"backend {name}: widens this file's Q4_K/Q6_K experts \(4 layers\) to "
                                           rf".* GB of packed bf16 .* 0.00 GB are free: choose {twin} or Auto"):
        N.make_backend(name, layers, threads=1)
    monkeypatch.setattr(N, "free_ram", lambda: 1 << 40)
    events = []
    b = N.make_backend(name, layers, threads=1, progress=events.append)
    assert events[0].done == 0 and "widens this file's Q4_K/Q6_K experts" in events[0].detail  # said before packing
    assert b.load_stats.notices[0] == events[0].detail


def test_a_type_without_a_block_kernel_is_widened_and_says_so(tmp_path):
    """The tiny preset's rows (96, 160) do not split into 256: llama-quantize's mix falls back to Q5_0 (no block kernel)
    for gate/up, so those layers are packed from float32, with the notice naming the type."""
    path = make_model(tmp_path / "tiny.gguf", preset="tiny", fmt="gguf", dtype="q4_k_m")
    w = load_weights(path)
    layers = layer_experts(w.config, w.tensors)
    types = {t.qtype.name for le in layers.values() for t in (le.gate_proj, le.up_proj, le.down_proj)}
    assert "Q5_0" in types and not N.has_block_kernel("Q5_0")
    b = N.make_backend(IN_PLACE[0], layers, threads=1)
    assert set(b.load_stats.per_layer.values()) == {"packed"}
    assert any("no block kernel reads Q5_0" in n for n in b.load_stats.notices)
    est = estimate_ram(inspect_model(path), 64, IN_PLACE[0])
    assert est.packed_bytes == b.load_stats.packed_bytes


@pytest.mark.parametrize("name", [n for n in ("AVX512", "AMXBF16") if n in BACKENDS])
def test_the_cli_says_what_widening_costs_first_and_refuses_by_name(models, name, monkeypatch, capsys):
    from tessera.engine.cli import main

    args = ["generate", str(models["q4_k_m"][0]), "--backend", name, "--threads", "1", "--prompt", "Hi",
            "--max-tokens", "2", "--temperature", "0"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"note: backend {name} widens this file's Q4_K/Q6_K experts (4 layers) to " in err
    assert f"choose {N.WIDENING_BACKENDS[name]} or Auto, which read the blocks in place" in err
    monkeypatch.setattr(N, "free_ram", lambda: 0)
    assert main(args) == 1
    assert f"error: backend {name}: widens this file's Q4_K/Q6_K experts" in capsys.readouterr().err


@pytest.mark.parametrize("name", IN_PLACE)
def test_a_block_layer_overwrites_a_nan_filled_output_and_skips_empty_slots(models, name):
    w = load_weights(models["q6_k"][0])
    layers = layer_experts(w.config, w.tensors)
    b = N.make_backend(name, layers, threads=2)
    x, ids, weights = _routing(w.config, 6, seed=5)
    ids[2] = -1  # token 2: every slot skipped
    out = torch.full_like(x, float("nan"))  # [T, H]
    layer = min(layers)
    b.layers[layer].forward(ids, weights, x, out, b.pool)
    assert torch.isfinite(out).all() and torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.equal(out, b.forward(layer, x, ids, weights))


def test_the_hot_expert_cache_twin_over_blocks_read_in_place(models):
    """The CPU twin of the GPU expert cache submits the cold experts to the in-place backend asynchronously
    (quant_moe_forward_submit) while it computes the hot ones on float copies: same model, same bounds as above."""
    from tessera.engine.hybrid import PlacementSettings

    q, twin = models["q4_k_m"]
    ids = torch.randint(0, 437, (48,), generator=torch.Generator().manual_seed(11))
    ref = engine.load(twin, backend="Torch", threads=2)
    try:
        want = ref.model.forward(ids, ref.model.new_cache(48, torch.float32), last_only=False)  # [T, V]
    finally:
        ref.close()
    s = engine.load(q, backend=INT8[0], threads=2, twin=True,
                    placement=PlacementSettings(device="cuda", gpu_experts_per_layer=2))
    try:
        assert type(s.model.experts).__name__ == "HotExpertCache"
        got = s.model.forward(ids, s.model.new_cache(48, torch.float32), last_only=False)  # [T, V]
    finally:
        s.close()
    r = compare_logits(want, got)  # KL(twin || quantized), as convert --verify judges it
    assert r.top1_agreement >= TOP1_MIN and r.mean_kl <= KL_MAX, r
