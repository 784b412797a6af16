"""The validating GGUF reader: equal to gguf.GGUFReader on valid files, a named ModelFormatError on every bad one."""

from __future__ import annotations

import random
import struct

import gguf
import numpy as np
import pytest
import torch
from gguf_factory import Q, random_tensors, tiny_config, write_gguf

from tessera.engine.errors import ModelFormatError
from tessera.engine.gguf_reader import open_gguf


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    md = {"tokenizer.ggml.tokens": ["a", "é", "日本", "🙂", ""], "tokenizer.ggml.token_type": [1, 1, 1, 3, 1],
          "general.name": "tiny", "tokenizer.ggml.add_bos_token": False}  # fmt: skip
    return write_gguf(path, metadata=md, qtype={"blk.0.ffn_up_exps.weight": Q.BF16, "token_embd.weight": Q.F16})


def test_parse_equals_gguf_reader(good):
    f = open_gguf(good)
    ref = gguf.GGUFReader(good)
    assert f.version == 3 and f.data_offset == ref.data_offset
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert f.metadata[key] == field.contents(), key
    assert list(f.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = f.info(t.name)
        assert info.shape == tuple(reversed(t.shape.tolist())) and info.offset == t.data_offset
        assert info.nbytes == t.n_bytes and info.ggml_type == t.tensor_type
        assert np.array_equal(f.raw(t.name).view(np.uint8).reshape(-1), t.data.view(np.uint8).reshape(-1)), t.name


def test_tensor_dtypes_kept(good):
    f = open_gguf(good)
    src = random_tensors(tiny_config())
    emb = f.tensor("token_embd.weight")
    assert emb.dtype == torch.float16 and torch.equal(emb, torch.from_numpy(src["token_embd.weight"]).half())
    up = f.tensor("blk.0.ffn_up_exps.weight")
    assert up.dtype == torch.bfloat16 and up.shape == (4, 32, 64)
    # gguf's BF16 rounds to nearest even like torch
    assert torch.equal(up, torch.from_numpy(src["blk.0.ffn_up_exps.weight"]).bfloat16())
    q = f.tensor("blk.1.attn_q.weight")
    assert q.dtype == torch.float32 and torch.equal(q, torch.from_numpy(src["blk.1.attn_q.weight"]))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_dequant_equals_gguf_quants(tmp_path, qtype):
    cfg = tiny_config(hidden_size=256, moe_intermediate_size=256, head_dim=64, intermediate_size=256)
    path = write_gguf(tmp_path / "q.gguf", cfg, qtype=qtype)
    f = open_gguf(path)
    ref = {t.name: t for t in gguf.GGUFReader(path).tensors}
    src = random_tensors(cfg)
    name = "blk.0.ffn_down_exps.weight"
    t = f.tensor(name)
    assert f.info(name).ggml_type == qtype and t.dtype == torch.float32 and t.shape == (4, 256, 256)
    expect = gguf.quants.dequantize(ref[name].data, qtype)
    assert np.array_equal(t.numpy(), expect) and torch.isfinite(t).all()  # bit-exact
    assert t.abs().max() > 0
    if qtype == Q.Q8_0:  # the only one gguf can quantize: also close to the source values
        err = (t - torch.from_numpy(src[name])).abs().mean() / torch.from_numpy(src[name]).abs().mean()
        assert err < 0.01


def test_dequant_in_small_chunks_is_the_same(tmp_path):
    from tessera.engine import quants

    cfg = tiny_config(hidden_size=256, moe_intermediate_size=256, head_dim=64)
    f = open_gguf(write_gguf(tmp_path / "q.gguf", cfg, qtype=Q.Q4_K))
    name = "blk.1.ffn_gate_exps.weight"
    info = f.info(name)
    a = quants.dequantize(f.raw(name), info.ggml_type, info.shape)
    b = quants.dequantize(f.raw(name), info.ggml_type, info.shape, chunk_bytes=3000)
    assert np.array_equal(a, b)


def _offsets(path):
    ref = gguf.GGUFReader(path)
    first_kv = 24
    table = ref.tensors[0].field.offset
    return first_kv, table, ref.data_offset


@pytest.mark.parametrize("where", ["header", "metadata", "tensor table", "tensor data"])
def test_truncated(good, tmp_path, where):
    data = good.read_bytes()
    kv, table, dstart = _offsets(good)
    cut = {"header": 13, "metadata": kv + 40, "tensor table": table + 30, "tensor data": len(data) - 100}[where]
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])
    with pytest.raises(ModelFormatError, match="truncated in (the )?" + where) as e:
        open_gguf(bad)
    assert e.value.subject == str(bad)


def test_truncated_at_every_header_byte(good, tmp_path):
    data = good.read_bytes()
    _, _, dstart = _offsets(good)
    bad = tmp_path / "cut.gguf"
    for cut in list(range(0, 200)) + list(range(200, dstart + 64, 7)):
        bad.write_bytes(data[:cut])
        if cut == 0:
            with pytest.raises(ModelFormatError, match="empty"):
                open_gguf(bad)
            continue
        with pytest.raises(ModelFormatError):
            open_gguf(bad)


def _patched(good, tmp_path, offset, fmt, value):
    data = bytearray(good.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    p = tmp_path / "patched.gguf"
    p.write_bytes(bytes(data))
    return p


def test_wrong_magic(good, tmp_path):
    with pytest.raises(ModelFormatError) as e:
        open_gguf(_patched(good, tmp_path, 0, "<I", 0x12345678))
    assert e.value.message == "starts with the bytes 78 56 34 12, not 'GGUF': this is not a GGUF file"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"# Tessera rules\nlayers 0-3: gpu\n", "starts with '# Te', not 'GGUF': this is not a GGUF file"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 12\n",
         "starts with 'vers', not 'GGUF': this is not a GGUF file; it looks like a Git LFS pointer: the model itself "
         "was never downloaded (run `git lfs pull`)"),
        (b"<!DOCTYPE html><html><body>Sign in</body></html>",
         "starts with '<!DO', not 'GGUF': this is not a GGUF file; it looks like a web page: the download saved an "
         "error or sign-in page instead of the model"),
        (struct.pack("<Q", 30) + b'{"w": {"dtype": "F32"}}' + b" " * 7,
         "starts with the bytes 1e 00 00 00, not 'GGUF': this is not a GGUF file; it looks like a safetensors file: "
         "open the model's folder instead"),
    ],
)
def test_not_gguf_is_said_in_words(tmp_path, content, message):
    p = tmp_path / "model.gguf"
    p.write_bytes(content)
    with pytest.raises(ModelFormatError) as e:
        open_gguf(p)
    assert e.value.subject == str(p) and e.value.message == message
    assert "b'" not in str(e.value)  # no Python bytes repr


def test_bad_version(good, tmp_path):
    with pytest.raises(ModelFormatError, match="GGUF version 7 is not supported"):
        open_gguf(_patched(good, tmp_path, 4, "<I", 7))
    with pytest.raises(ModelFormatError, match="big-endian"):
        open_gguf(_patched(good, tmp_path, 4, ">I", 3))


@pytest.mark.parametrize("offset,field", [(8, "tensor_count"), (16, "kv_count")])
def test_absurd_counts(good, tmp_path, offset, field):
    with pytest.raises(ModelFormatError, match=f"the file is corrupt at byte {offset}: the header's {field} says "
                                               f"{1 << 60} entries, more than its .* bytes could hold"):
        open_gguf(_patched(good, tmp_path, offset, "<Q", 1 << 60))


def test_absurd_string_and_array_lengths(good, tmp_path):
    with pytest.raises(ModelFormatError, match="a string of .* runs past the end"):
        open_gguf(_patched(good, tmp_path, 24, "<Q", 1 << 62))
    f = open_gguf(good)
    ref = gguf.GGUFReader(good)
    field = ref.fields["tokenizer.ggml.tokens"]
    length_offset = field.offset + 8 + len("tokenizer.ggml.tokens") + 4 + 4
    with pytest.raises(ModelFormatError, match=rf"the file is truncated or corrupt at byte {length_offset + 8}, in the "
                       rf"metadata \(key tokenizer.ggml.tokens\): an array of {1 << 50} items needs at least "
                       rf"{8 << 50} bytes, and only \d+ are left in the file \(\d+ bytes\)"):
        open_gguf(_patched(good, tmp_path, length_offset, "<Q", 1 << 50))
    assert f.metadata["tokenizer.ggml.tokens"][3] == "🙂"


def _tensor_field_offset(good, name, what):
    ref = gguf.GGUFReader(good)
    t = next(t for t in ref.tensors if t.name == name)
    n_dims = len(t.shape)
    base = t.field.offset + 8 + len(name.encode())
    return {"n_dims": base, "dim0": base + 4, "type": base + 4 + 8 * n_dims, "offset": base + 8 + 8 * n_dims}[what]


def test_unknown_and_unsupported_tensor_types(good, tmp_path):
    name = "blk.0.attn_q.weight"
    with pytest.raises(ModelFormatError, match=f"tensor {name}: unsupported tensor type #999"):
        open_gguf(_patched(good, tmp_path, _tensor_field_offset(good, name, "type"), "<I", 999))
    cfg = tiny_config()
    p = write_gguf(tmp_path / "q41.gguf", cfg, qtype={"blk.1.ffn_up_exps.weight": Q.Q4_1})
    with pytest.raises(ModelFormatError, match="tensor blk.1.ffn_up_exps.weight: unsupported tensor type Q4_1"):
        open_gguf(p)


def test_bad_tensor_entries(good, tmp_path):
    name = "blk.1.attn_k.weight"
    with pytest.raises(ModelFormatError, match=f"tensor {name}: 9 dimensions"):
        open_gguf(_patched(good, tmp_path, _tensor_field_offset(good, name, "n_dims"), "<I", 9))
    with pytest.raises(ModelFormatError, match=f"tensor {name}: dimension 0"):
        open_gguf(_patched(good, tmp_path, _tensor_field_offset(good, name, "dim0"), "<Q", 0))
    with pytest.raises(ModelFormatError, match=f"{name}"):
        open_gguf(_patched(good, tmp_path, _tensor_field_offset(good, name, "dim0"), "<Q", 1 << 40))
    with pytest.raises(ModelFormatError, match=f"tensor {name}: data offset 3 is not aligned"):
        open_gguf(_patched(good, tmp_path, _tensor_field_offset(good, name, "offset"), "<Q", 3))
    with pytest.raises(ModelFormatError, match=f"{name}.*overlaps|overlaps.*{name}"):
        open_gguf(_patched(good, tmp_path, _tensor_field_offset(good, name, "offset"), "<Q", 0))
    with pytest.raises(ModelFormatError, match=f"tensor {name} needs bytes"):
        open_gguf(_patched(good, tmp_path, _tensor_field_offset(good, name, "offset"), "<Q", 1 << 40))


def test_random_corruption_never_raw_errors(good, tmp_path):
    """Flip bytes all over the header: the reader either succeeds or raises ModelFormatError, nothing else."""
    data = good.read_bytes()
    _, _, dstart = _offsets(good)
    rng = random.Random(0)
    p = tmp_path / "fuzz.gguf"
    for _ in range(300):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(dstart)] = rng.randrange(256)
        p.write_bytes(bytes(b))
        try:
            f = open_gguf(p)
            for name in f.tensors:
                f.tensor(name)
        except ModelFormatError:
            pass


def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="cannot open"):
        open_gguf(tmp_path / "nope.gguf")


def test_a_rewritten_file_is_read_afresh(good, tmp_path):
    """Each open parses the header it finds: same path, same size, different bytes."""
    p = tmp_path / "same.gguf"
    p.write_bytes(good.read_bytes())
    assert open_gguf(p).metadata["general.name"] == "tiny"
    data = bytearray(p.read_bytes())
    i = data.index(b"tiny")
    data[i : i + 4] = b"tinz"
    p.write_bytes(bytes(data))
    assert open_gguf(p).metadata["general.name"] == "tinz"
    assert open_gguf(p).metadata["general.name"] == "tinz"
