"""Wrong dtype, shape, contiguity or alignment at the Python boundary raise a Python exception naming the argument."""

import numpy as np
import pytest
import torch
from native_cases import random_layer

import tessera.engine.backends as B
import tessera.engine.native as N
from tessera.engine import _native

E, H, I = 4, 32, 16


@pytest.fixture(scope="module")
def blob(pool):
    return N.pack_layer("Reference", random_layer(E, H, I), pool)


def args(T=3, k=2):
    return dict(x=torch.randn(T, H), ids=torch.randint(0, E, (T, k)), w=torch.rand(T, k), out=torch.empty(T, H))


def call(blob, pool, x, ids, w, out, packed=None, backend="Reference"):
    _native.backend(backend).forward(blob if packed is None else packed, ids, w, x, out, pool)


@pytest.mark.parametrize(
    "arg, bad, exc, words",
    [
        ("x", lambda a: a["x"].double(), TypeError, "x: expected float32"),
        ("x", lambda a: a["x"].bfloat16(), TypeError, "x: expected float32, got bfloat16"),
        ("ids", lambda a: a["ids"].int(), TypeError, "expert_ids: expected int64"),
        ("w", lambda a: a["w"].half(), TypeError, "weights: expected float32"),
        ("out", lambda a: a["out"].double(), TypeError, "out: expected float32"),
        ("x", lambda a: torch.randn(3, H + 1), ValueError, "x: expected shape [*, 32], got [3, 33]"),
        ("ids", lambda a: a["ids"][:2], ValueError, "expert_ids: expected shape [3, *]"),
        ("w", lambda a: torch.rand(3, 3), ValueError, "weights: expected shape [3, 2]"),
        ("out", lambda a: torch.empty(3, H, 1), ValueError, "out: expected shape [3, 32]"),
        ("x", lambda a: torch.randn(H, 3).T, ValueError, "x: must be C-contiguous"),
        ("w", lambda a: torch.rand(2, 3).T, ValueError, "weights: must be C-contiguous"),
        ("out", lambda a: torch.empty(H, 3).T, ValueError, "out: must be C-contiguous"),
        ("ids", lambda a: torch.full((3, 2), E), ValueError, "expert_ids: id 4 out of range for 4 experts"),
    ],
)
def test_forward_rejects_bad_arguments(blob, pool, arg, bad, exc, words):
    a = args()
    a[arg] = bad(a)
    with pytest.raises(exc) as e:
        call(blob, pool, **a)
    assert words in str(e.value)


def test_misaligned_or_foreign_packed_blob(blob, pool):
    buf = _native.aligned_empty(blob.nbytes + 64)
    shifted = buf[1 : 1 + blob.nbytes]
    shifted[:] = blob
    with pytest.raises(ValueError, match="packed: must be 64-byte aligned"):
        call(blob, pool, **args(), packed=shifted)
    with pytest.raises(ValueError, match="packed: not a Tessera packed-weight blob"):
        call(blob, pool, **args(), packed=_native.aligned_empty(blob.nbytes))
    others = [n for n in B.available_names(include_emulated=True) if n != "Reference"]
    if others:
        with pytest.raises(ValueError, match=f"packed: packed for backend Reference, not {others[0]}"):
            call(blob, pool, **args(), packed=blob, backend=others[0])
    with pytest.raises(ValueError, match="packed: shorter than its header says"):
        call(blob, pool, **args(), packed=blob[: blob.nbytes // 2])
    with pytest.raises(TypeError, match="packed: expected uint8"):
        call(blob, pool, **args(), packed=np.zeros(blob.nbytes // 4, dtype=np.float32))


def test_pack_rejects_bad_weights(pool):
    layer = random_layer(E, H, I, dtype=torch.float32)
    out = _native.aligned_empty(_native.backend("Reference").packed_bytes(E, H, I, "float32"))
    with pytest.raises(TypeError, match="gate: expected float32, float16 or bfloat16, got int32"):
        _native.backend("Reference").pack(layer.gate_proj.int(), layer.up_proj, layer.down_proj, out, pool)
    with pytest.raises(TypeError, match="up: dtype differs from gate"):
        _native.backend("Reference").pack(layer.gate_proj, layer.up_proj.half(), layer.down_proj, out, pool)
    with pytest.raises(ValueError, match=r"down: expected shape \[4, 32, 16\]"):
        _native.backend("Reference").pack(layer.gate_proj, layer.up_proj, layer.down_proj.transpose(1, 2).contiguous(),
                                          out, pool)
    with pytest.raises(ValueError, match="up: must be C-contiguous"):
        _native.backend("Reference").pack(layer.gate_proj, layer.up_proj.transpose(0, 1).contiguous().transpose(0, 1),
                                          layer.down_proj, out, pool)
    with pytest.raises(ValueError, match="out: needs"):
        _native.backend("Reference").pack(layer.gate_proj, layer.up_proj, layer.down_proj, out[:64], pool)
    with pytest.raises(ValueError, match="backend: no backend named Nope"):
        _native.backend("Nope").pack(layer.gate_proj, layer.up_proj, layer.down_proj, out, pool)
