"""AMX backends (AMXInt8, AMXBF16) through the native module: the emulated twins on every CPU, the real tiles where the
CPU has AMX (skipped with CpuFeatures' reason otherwise). Against a float64 torch MoE: NMSE <= 1e-3 for int8 (group-64
weights, two-digit group-64 activations), <= 1e-4 for bf16. Int8 is bit-identical between the tile and the vector path,
across thread counts, and between real and emulated tiles; bf16 decode keeps f32 activations. The int8 layer error
meets the issue's goal (<= 1.5 % relative L2 on a Qwen3-MoE-like layer) and is no worse than AVX512Int8's."""


import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tessera.engine.native as N

_native = N._native  # the kernels' own entry points (pack / forward / unpack) are what is under test here

EMULATED = ["AMXInt8-emulated", "AMXBF16-emulated"]
HARDWARE = ["AMXInt8", "AMXBF16"]
NMSE_TOL = {"Int8": 1e-3, "BF16": 1e-4}
E, H, I = 10, 80, 48  # H, I: not multiples of the 64-byte tile row, the 16-lane block or the bf16 pair tile
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _status(name):
    return {b["name"]: b for b in _native.backends()}[name]


def _backend_param(name):
    b = _status(name)
    marks = [] if b["available"] else [pytest.mark.skip(reason=f"{name}: {b['reason']}")]
    return pytest.param(name, marks=marks, id=name)


BACKENDS = [_backend_param(n) for n in EMULATED + HARDWARE]


def _fmt(name):
    return "Int8" if "Int8" in name else "BF16"


@pytest.fixture(scope="module")
def pool():
    return _native.Pool(2)


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator().manual_seed(0)
    gate = torch.randn(E, I, H, generator=g) * 0.1  # [E, I, H]
    up = torch.randn(E, I, H, generator=g) * 0.1  # [E, I, H]
    down = torch.randn(E, H, I, generator=g) * 0.1  # [E, H, I]
    return gate, up, down


def _pack(name, layer, pool, dtype=torch.float32):
    gate, up, down = (t.to(dtype).contiguous() for t in layer)
    blob = _native.aligned_empty(_native.backend(name).packed_bytes(E, H, I, DTYPE_NAMES[dtype]))
    _native.backend(name).pack(gate, up, down, blob, pool)
    return blob


def _forward(name, blob, ids, w, x, pool):
    out = torch.full_like(x, float("nan"))  # [T, H]; every element must be written
    _native.backend(name).forward(blob, ids, w, x, out, pool)
    assert not torch.isnan(out).any()
    return out


def _reference(layer, ids, w, x):
    gate, up, down = (t.double() for t in layer)
    out = torch.zeros(x.shape, dtype=torch.float64)  # [T, H]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            xt = x[t].double()  # [H]
            h = torch.nn.functional.silu(gate[e] @ xt) * (up[e] @ xt)  # [I]
            out[t] += float(w[t, j]) * (down[e] @ h)
    return out


def _routing(T, k, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int64)  # [T, k]
    w = torch.rand(T, k, generator=g)  # [T, k]
    x = torch.randn(T, H, generator=g)  # [T, H]
    return ids, w, x


def _nmse(a, ref):
    return float(((a.double() - ref) ** 2).sum() / (ref**2).sum())


@pytest.fixture
def int8_bf16_rows():
    """Int8 pieces with at least this many rows on bf16 tiles over their dequantized weights (1: every piece, 0: none,
    -1: the kernel's default); the knob is restored afterwards."""
    before = _native.set_amx_int8_bf16_min_rows(-1)
    _native.set_amx_int8_bf16_min_rows(before)
    yield _native.set_amx_int8_bf16_min_rows
    _native.set_amx_int8_bf16_min_rows(before)


@pytest.fixture
def tile_rows():
    """Forces the tile path (1) or the vector path (huge) for every expert; the knob is restored afterwards."""
    before = _native.tuning()["amx_tile_min_rows"]
    yield _native.set_amx_tile_min_rows
    _native.set_amx_tile_min_rows(before)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("T,k", [(1, 1), (1, 8), (3, 2), (64, 8), (513, 2)])
def test_matches_reference(name, T, k, layer, pool):
    blob = _pack(name, layer, pool)
    ids, w, x = _routing(T, k, seed=T * 10 + k)
    out = _forward(name, blob, ids, w, x, pool)
    assert _nmse(out, _reference(layer, ids, w, x)) <= NMSE_TOL[_fmt(name)]


@pytest.mark.parametrize("name", BACKENDS)
def test_tile_and_vector_paths_agree(name, layer, pool, tile_rows):
    blob = _pack(name, layer, pool)
    ids, w, x = _routing(37, 8, seed=7)
    tile_rows(1)
    tiles = _forward(name, blob, ids, w, x, pool)
    tile_rows(10**9)
    vec = _forward(name, blob, ids, w, x, pool)
    if _fmt(name) == "Int8":
        assert torch.equal(tiles, vec)  # same int32 sums, same fp32 epilogue
    else:  # tiles round the activations to bf16, vectors keep them f32
        assert _nmse(tiles, vec.double()) <= NMSE_TOL["BF16"]


@pytest.mark.parametrize("name", [p for p in BACKENDS if "BF16" in p.values[0]])
def test_bf16_vector_path_keeps_f32_activations(name, layer, pool, tile_rows):
    """With bf16 weights (exact in the packing) the decode path differs from float64 only by fp32 summation."""
    exact = tuple(t.to(torch.bfloat16).float() for t in layer)
    blob = _pack(name, exact, pool, torch.bfloat16)
    ids, w, x = _routing(5, 8, seed=13)
    tile_rows(10**9)
    assert _nmse(_forward(name, blob, ids, w, x, pool), _reference(exact, ids, w, x)) <= 1e-10


@pytest.mark.parametrize("name", BACKENDS)
def test_thread_count_does_not_change_results(name, layer, pool):
    blob = _pack(name, layer, pool)
    ids, w, x = _routing(70, 4, seed=3)
    one = _native.Pool(1)
    assert torch.equal(_forward(name, blob, ids, w, x, pool), _forward(name, blob, ids, w, x, one))


@pytest.mark.parametrize("name", BACKENDS)
def test_idle_experts_one_busy_expert_and_skipped_slots(name, layer, pool):
    blob = _pack(name, layer, pool)
    T = 40
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, H, generator=g)  # [T, H]
    w = torch.rand(T, 2, generator=g)  # [T, 2]
    ids = torch.full((T, 2), 3, dtype=torch.int64)  # expert 3 gets every token, the other 9 none
    ids[:, 1] = -1  # slot served elsewhere (e.g. the GPU): skipped
    ids[::5, 1] = 7
    out = _forward(name, blob, ids, w, x, pool)
    assert _nmse(out, _reference(layer, ids, w, x)) <= NMSE_TOL[_fmt(name)]
    none = torch.full((T, 2), -1, dtype=torch.int64)
    assert torch.equal(_forward(name, blob, none, w, x, pool), torch.zeros(T, H))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pack_unpack_round_trip(name, dtype, layer, pool):
    blob = _pack(name, layer, pool, dtype)
    gate, up, down = (t.to(dtype).float() for t in layer)
    for e in (0, E - 1):
        got = [torch.from_numpy(np.asarray(a)) for a in _native.backend(name).unpack(blob, e)]
        for src, back in zip((gate[e], up[e], down[e]), got):
            if _fmt(name) == "BF16":
                assert torch.equal(back, src.to(torch.bfloat16).float())
            else:  # within half a quantization step of its (row, 64-column group)
                K = src.shape[1]
                pad = torch.nn.functional.pad(src, (0, -K % 64))  # [N, Kp]
                step = pad.abs().reshape(src.shape[0], -1, 64).amax(-1) / 127  # [N, groups]
                bound = step.repeat_interleave(64, dim=1)[:, :K] * 0.5001
                assert ((back - src).abs() <= bound).all()


def test_hardware_and_emulated_tiles_agree(layer, pool, tile_rows):
    if not _status("AMXInt8")["available"]:
        pytest.skip(f"AMXInt8: {_status('AMXInt8')['reason']}")
    ids, w, x = _routing(100, 8, seed=11)
    tile_rows(1)
    for hw, emu in zip(HARDWARE, EMULATED):
        a = _forward(hw, _pack(hw, layer, pool), ids, w, x, pool)
        b = _forward(emu, _pack(emu, layer, pool), ids, w, x, pool)
        if _fmt(hw) == "Int8":
            assert torch.equal(a, b)
        else:  # the hardware may sum the pairs of a tile in another order than the SDM pseudocode
            assert _nmse(a, b.double()) <= 1e-10


def test_registration_and_reasons():
    f = _native.cpu_features()
    by_name = {b["name"]: b for b in _native.backends()}
    for n in EMULATED:
        assert by_name[n]["emulated"] and by_name[n]["available"]
    for n, flag in zip(HARDWARE, ("amx_int8", "amx_bf16")):
        assert not by_name[n]["emulated"]
        if not f["flags"][flag]:  # under TESSERA_MAX_ISA below amx (e.g. the suite run capped) the cap is the reason
            capped = os.environ.get("TESSERA_MAX_ISA", "amx") not in ("amx", "")
            reason = by_name[n]["reason"]
            assert not by_name[n]["available"]
            assert reason == f"CPU lacks {flag}" or capped and "TESSERA_MAX_ISA" in reason, reason
        elif not f["amx_permitted"]:
            assert not by_name[n]["available"] and by_name[n]["reason"]
    auto = _native.auto_backend()
    assert auto is None or auto[0] not in EMULATED


def test_packed_blob_of_another_backend_is_refused(layer, pool):
    blob = _pack("AMXInt8-emulated", layer, pool)
    ids, w, x = _routing(2, 1, seed=1)
    with pytest.raises(ValueError, match="AMXBF16-emulated"):
        _native.backend("AMXBF16-emulated").forward(blob, ids, w, x, torch.empty_like(x), pool)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("rows", [1, 10**9], ids=["tiles", "vectors"])
def test_nan_in_a_token_stays_in_that_token(name, rows, layer, pool, tile_rows):
    blob = _pack(name, layer, pool)
    ids, w, x = _routing(20, 3, seed=17)
    x[4, 7] = float("nan")
    tile_rows(rows)
    out = torch.full_like(x, 0.0)
    _native.backend(name).forward(blob, ids, w, x, out, pool)
    bad = torch.isnan(out).any(dim=1)  # [T]
    assert bad[4] and not bad[torch.arange(20) != 4].any()


def _rel_l2(a, ref):
    return float((a.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("name", [p for p in BACKENDS if "Int8" in p.values[0]])
@pytest.mark.parametrize("rows", [1, 10**9, "bf16"], ids=["tiles", "vectors", "bf16-tiles"])
def test_int8_layer_error_meets_goal_and_matches_avx512int8(name, rows, pool, tile_rows, int8_bf16_rows):
    """Relative L2 vs float64 on unit-variance bf16-like weights (bench-moe's recipe) with Gaussian inputs: two-digit
    activations leave only the weights' group-64 error (~1.0 %); one digit gave ~1.7 %. AVX512Int8 (group 128, two
    digits, ~1.1 %) is the bar where this CPU has it. On bf16 tiles (the dequantized int8 weights and the activations
    rounded to bf16, 2^-9 each) the error may grow a little over the int8 tiles' (measured 1.12 % vs 1.04 % on a 30B-A3B
    layer), never past the goal."""
    Eb, Hb, Ib, k, T = 4, 512, 256, 2, 24
    g = torch.Generator().manual_seed(21)
    big = (torch.randn(Eb, Ib, Hb, generator=g) * Hb**-0.5, torch.randn(Eb, Ib, Hb, generator=g) * Hb**-0.5,
           torch.randn(Eb, Hb, Ib, generator=g) * Ib**-0.5)  # [E, I, H] x2, [E, H, I]
    ids = torch.stack([torch.randperm(Eb, generator=g)[:k] for _ in range(T)])  # [T, k]
    w = torch.softmax(torch.randn(T, k, generator=g), -1)  # [T, k]
    x = torch.randn(T, Hb, generator=g)  # [T, H]
    ref = _reference(big, ids, w, x)
    int8_bf16_rows(1 if rows == "bf16" else 0)
    tile_rows(1 if rows == "bf16" else rows)

    def err(backend):
        gate, up, down = (t.contiguous() for t in big)
        blob = _native.aligned_empty(_native.backend(backend).packed_bytes(Eb, Hb, Ib, "float32"))
        _native.backend(backend).pack(gate, up, down, blob, pool)
        out = torch.full_like(x, float("nan"))  # [T, H]
        _native.backend(backend).forward(blob, ids, w, x, out, pool)
        return _rel_l2(out, ref)

    mine = err(name)
    assert mine <= 0.015
    if rows == "bf16":
        int8_bf16_rows(0)
        assert mine <= err(name) * 1.15  # the same backend on its int8 tiles
    elif _status("AVX512Int8")["available"]:
        assert mine <= err("AVX512Int8") * 1.02


def _long_routing(seed):
    """T * k = 4200 rows (more than one group of amx_moe.h kGroupRows = 2048) and expert 3 in every token's first slot
    (2100 rows: more than one piece): the grouped forward of long prompts."""
    T, k = 2100, 2
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int64)  # [T, k]
    ids[:, 0] = 3
    ids[:, 1] = torch.where(ids[:, 1] == 3, torch.full_like(ids[:, 1], 4), ids[:, 1])
    ids[::7, 1] = -1  # skipped slots
    return ids, torch.rand(T, k, generator=g), torch.randn(T, H, generator=g)


@pytest.mark.parametrize("name", BACKENDS)
def test_long_prompt_groups_and_pieces(name, layer, pool, tile_rows, int8_bf16_rows):
    """Every expert streamed once per group of rows: the result still matches the reference, does not depend on the
    thread count, and (int8) the tile and vector paths still agree bit for bit."""
    blob = _pack(name, layer, pool)
    ids, w, x = _long_routing(seed=23)
    out = _forward(name, blob, ids, w, x, pool)
    assert _nmse(out, _reference(layer, ids, w, x)) <= NMSE_TOL[_fmt(name)]
    assert torch.equal(out, _forward(name, blob, ids, w, x, _native.Pool(1)))
    if _fmt(name) == "Int8":
        int8_bf16_rows(0)  # the int8 tiles on every piece, even the 2100-row expert's
        tile_rows(1)
        tiles = _forward(name, blob, ids, w, x, pool)
        tile_rows(10**9)
        assert torch.equal(tiles, _forward(name, blob, ids, w, x, pool))


INT8 = [p for p in BACKENDS if "Int8" in p.values[0]]


@pytest.mark.parametrize("name", INT8)
def test_int8_on_bf16_tiles_matches_reference_and_threads(name, layer, pool, int8_bf16_rows):
    """Int8 pieces on bf16 tiles (their weights dequantized per slab, activations rounded to bf16): against the
    reference, independent of the thread count, over several groups and pieces; every piece forced (1), and the
    default threshold, which sends the 2100-row expert's pieces there, differs from the int8 tiles on its tokens."""
    blob = _pack(name, layer, pool)
    ids, w, x = _long_routing(seed=29)
    ref = _reference(layer, ids, w, x)
    int8_bf16_rows(1)
    forced = _forward(name, blob, ids, w, x, pool)
    assert _nmse(forced, ref) <= NMSE_TOL["Int8"]
    assert torch.equal(forced, _forward(name, blob, ids, w, x, _native.Pool(1)))
    int8_bf16_rows(0)
    int8 = _forward(name, blob, ids, w, x, pool)
    assert not torch.equal(forced, int8)  # the path really changed (bf16 activations round differently)
    int8_bf16_rows(-1)
    default = _forward(name, blob, ids, w, x, pool)
    big = (ids == 3).any(dim=1)  # [T]: the tokens with a row in the 2100-row expert (every token here)
    assert not torch.equal(default[big], int8[big])
    assert _nmse(default, ref) <= NMSE_TOL["Int8"]


def test_int8_bf16_tiles_hardware_equals_emulator(layer, pool, int8_bf16_rows):
    if not _status("AMXInt8")["available"]:
        pytest.skip(f"AMXInt8: {_status('AMXInt8')['reason']}")
    ids, w, x = _long_routing(seed=31)
    int8_bf16_rows(1)
    a = _forward("AMXInt8", _pack("AMXInt8", layer, pool), ids, w, x, pool)
    b = _forward("AMXInt8-emulated", _pack("AMXInt8-emulated", layer, pool), ids, w, x, pool)
    assert _nmse(a, b.double()) <= 1e-10  # the hardware may sum a tile's pairs in another order than the SDM's


# The child of the test below: argv = [tests folder, case file, output file].
_DEQUANT_CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import test_amx_backends as t
from tessera.engine import _native
c = torch.load(sys.argv[2])
_native.set_amx_int8_bf16_min_rows(1)
pool = _native.Pool(2)
blob = t._pack("AMXInt8-emulated", c["layer"], pool)
torch.save(t._forward("AMXInt8-emulated", blob, c["ids"], c["w"], c["x"], pool), sys.argv[3])
"""


def test_int8_bf16_dequant_scalar_equals_avx512(tmp_path, layer, pool):
    """vec.dequant_bf16's two variants give the same bits: AMXInt8-emulated on bf16 tiles here (AVX-512 vector kernels
    where this CPU has them) and in a fresh interpreter under TESSERA_MAX_ISA=avx2 (the scalar twin)."""
    if not _status("AMXInt8-emulated")["available"]:
        pytest.skip(f"AMXInt8-emulated: {_status('AMXInt8-emulated')['reason']}")
    ids, w, x = _long_routing(seed=37)
    torch.save({"layer": layer, "ids": ids, "w": w, "x": x}, tmp_path / "case.pt")
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_MAX_ISA"}
    env["TESSERA_MAX_ISA"] = "avx2"
    subprocess.run([sys.executable, "-c", _DEQUANT_CHILD, str(Path(__file__).parent), str(tmp_path / "case.pt"),
                    str(tmp_path / "out.pt")], env=env, check=True, capture_output=True, text=True, timeout=300)
    before = _native.set_amx_int8_bf16_min_rows(1)
    try:
        here = _forward("AMXInt8-emulated", _pack("AMXInt8-emulated", layer, pool), ids, w, x, pool)
    finally:
        _native.set_amx_int8_bf16_min_rows(before)
    assert torch.equal(here, torch.load(tmp_path / "out.pt"))
