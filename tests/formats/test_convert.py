"""HF -> GGUF conversion: llama.cpp qwen3moe names, keys and types; exact values; safe writing; named errors; CLI."""

from __future__ import annotations

import errno
import json
import shutil
import threading

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tessera.engine.cli import main
from tessera.engine.convert import convert
from tessera.engine.errors import Cancelled, ModelFormatError, TesseraError
from tessera.engine.make_model import make_model
from tessera.engine.safetensors_reader import HFCheckpoint

Q = gguf.GGMLQuantizationType
T = gguf.MODEL_TENSOR
ARCH = gguf.MODEL_ARCH.QWEN3MOE
CONFIGS = {
    "moe": {},
    "dense-tied-headdim": {"mlp_only_layers": [1], "tie_word_embeddings": True, "head_dim": 24},
    "wide-kv": {"num_key_value_heads": 3, "num_hidden_layers": 2, "num_experts": 5, "num_experts_per_tok": 3},
    "no-head-dim": {"head_dim": None, "hidden_size": 120, "num_attention_heads": 5, "num_key_value_heads": 1},
}


def expected_names(cfg: dict) -> set[str]:
    """What gguf.MODEL_TENSORS[QWEN3MOE] formats for these blocks (dense blocks: llama.cpp's dense FFN names)."""
    moe_only = {T.FFN_GATE_INP, T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP}
    names = set()
    for t in gguf.MODEL_TENSORS[ARCH]:
        fmt = gguf.TENSOR_NAMES[t]
        if "{bid}" not in fmt:
            if not (t == T.OUTPUT and cfg.get("tie_word_embeddings")):
                names.add(fmt + ".weight")
            continue
        for i in range(cfg["num_hidden_layers"]):
            dense = i in cfg.get("mlp_only_layers", [])
            if t in moe_only and dense:
                continue
            names.add(fmt.format(bid=i) + ".weight")
    for i in cfg.get("mlp_only_layers", []):
        names |= {gguf.TENSOR_NAMES[t].format(bid=i) + ".weight" for t in (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN)}
    return names


def hf_tensors(folder) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def field(reader, key):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert-src")
    return {name: make_model(root / name, config_overrides=over, seed=11) for name, over in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", ["bf16", "q8_0", "f16", "f32"])
def test_conversion_follows_llama_cpp_qwen3moe(tmp_path, sources, name, dtype):
    src = sources[name]
    cfg = json.loads((src / "config.json").read_text())
    out = convert(src, tmp_path / "m.gguf", dtype=dtype)
    reader = gguf.GGUFReader(out)
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == expected_names(cfg)

    requested = {"bf16": Q.BF16, "q8_0": Q.Q8_0, "f16": Q.F16, "f32": Q.F32}[dtype]
    for t in reader.tensors:
        want = Q.F32 if len(t.shape) == 1 or t.name.endswith("ffn_gate_inp.weight") else requested
        if want == Q.Q8_0 and t.shape[0] % 32:  # llama.cpp falls back to F16 when rows do not split into blocks
            want = Q.F16
        assert t.tensor_type == want, t.name

    arch = gguf.MODEL_ARCH_NAMES[ARCH]
    K = gguf.Keys
    dims = {
        K.General.ARCHITECTURE: arch,
        K.LLM.BLOCK_COUNT.format(arch=arch): cfg["num_hidden_layers"],
        K.LLM.CONTEXT_LENGTH.format(arch=arch): cfg["max_position_embeddings"],
        K.LLM.EMBEDDING_LENGTH.format(arch=arch): cfg["hidden_size"],
        K.LLM.FEED_FORWARD_LENGTH.format(arch=arch): cfg["intermediate_size"],
        K.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch): cfg["moe_intermediate_size"],
        K.LLM.EXPERT_COUNT.format(arch=arch): cfg["num_experts"],
        K.LLM.EXPERT_USED_COUNT.format(arch=arch): cfg["num_experts_per_tok"],
        K.Attention.HEAD_COUNT.format(arch=arch): cfg["num_attention_heads"],
        K.Attention.HEAD_COUNT_KV.format(arch=arch): cfg["num_key_value_heads"],
        K.Attention.KEY_LENGTH.format(arch=arch): cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]),
        K.Attention.VALUE_LENGTH.format(arch=arch): cfg.get(
            "head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]
        ),
        K.Rope.FREQ_BASE.format(arch=arch): cfg["rope_theta"],
        K.General.FILE_TYPE: int({"bf16": 32, "q8_0": 7, "f16": 1, "f32": 0}[dtype]),
        K.General.QUANTIZATION_VERSION: gguf.GGML_QUANT_VERSION,
        K.Tokenizer.MODEL: "gpt2",
        K.Tokenizer.PRE: "qwen2",
        K.Tokenizer.ADD_BOS: False,
        K.Tokenizer.BOS_ID: cfg["bos_token_id"],
        K.Tokenizer.EOS_ID: cfg["eos_token_id"],
        K.Tokenizer.PAD_ID: cfg["bos_token_id"],
    }
    for key, value in dims.items():
        got = field(reader, key)
        assert (got == pytest.approx(value)) if isinstance(value, float) else got == value, key
    eps = field(reader, K.Attention.LAYERNORM_RMS_EPS.format(arch=arch))
    assert eps == pytest.approx(cfg["rms_norm_eps"], rel=1e-6)

    tok = json.loads((src / "tokenizer.json").read_text())
    tokens, types = field(reader, K.Tokenizer.LIST), field(reader, K.Tokenizer.TOKEN_TYPE)
    assert len(tokens) == len(types) == cfg["vocab_size"]
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert tokens[ids["<|im_end|>"]] == "<|im_end|>" and types[ids["<|im_end|>"]] == gguf.TokenType.CONTROL
    assert types[ids["<think>"]] == gguf.TokenType.USER_DEFINED
    assert tokens[-1] == f"[PAD{cfg['vocab_size'] - 1}]" and types[-1] == gguf.TokenType.UNUSED
    assert all(tokens[i] == t for t, i in tok["model"]["vocab"].items())
    assert field(reader, K.Tokenizer.MERGES) == [" ".join(m) for m in tok["model"]["merges"]]
    template = json.loads((src / "tokenizer_config.json").read_text())["chat_template"]
    assert field(reader, K.Tokenizer.CHAT_TEMPLATE) == template
    norm_key = K.LLM.EXPERT_WEIGHTS_NORM.format(arch=arch)
    assert norm_key not in reader.fields  # norm_topk_prob true: llama.cpp's default, not written


def _dequant(t) -> np.ndarray:
    data = np.asarray(t.data)
    if t.tensor_type == Q.BF16:  # the reader hands BF16 out as raw bytes
        return (data.reshape(-1).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return gguf.quants.dequantize(data, t.tensor_type)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "q8_0"])
def test_values_and_expert_stacking(tmp_path, sources, dtype):
    src = sources["dense-tied-headdim"]
    hf = hf_tensors(src)
    reader = gguf.GGUFReader(convert(src, tmp_path / "m.gguf", dtype=dtype))
    tensors = {t.name: t for t in reader.tensors}
    cast = (lambda x: x.to(torch.bfloat16).float()) if dtype == "bf16" else (lambda x: x)
    pairs = {
        "token_embd.weight": hf["model.embed_tokens.weight"],
        "blk.0.attn_k.weight": hf["model.layers.0.self_attn.k_proj.weight"],
        "blk.1.ffn_down.weight": hf["model.layers.1.mlp.down_proj.weight"],
        "blk.2.ffn_down_exps.weight": torch.stack(
            [hf[f"model.layers.2.mlp.experts.{e}.down_proj.weight"] for e in range(6)]
        ),
        "blk.0.ffn_gate_exps.weight": torch.stack(
            [hf[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] for e in range(6)]
        ),
    }
    for name, want in pairs.items():
        got = torch.from_numpy(_dequant(tensors[name]).copy()).reshape(want.shape)
        if dtype == "q8_0":  # per 32-block absmax / 127 scale, f16: error below half a step
            assert (got - want).abs().max() <= want.abs().max() / 127 * 0.51 + 1e-6, name
        else:
            assert torch.equal(got, cast(want)), name
    for name in ("blk.2.ffn_gate_inp.weight", "blk.0.attn_q_norm.weight", "output_norm.weight"):
        hf_name = {
            "blk.2.ffn_gate_inp.weight": "model.layers.2.mlp.gate.weight",
            "blk.0.attn_q_norm.weight": "model.layers.0.self_attn.q_norm.weight",
            "output_norm.weight": "model.norm.weight",
        }[name]
        assert torch.equal(
            torch.from_numpy(np.asarray(tensors[name].data).copy()).reshape(hf[hf_name].shape), hf[hf_name]
        )


def test_bf16_source_copies_bits(tmp_path):
    src = make_model(tmp_path / "bf", dtype="bf16", seed=4)
    hf = hf_tensors(src)
    reader = gguf.GGUFReader(convert(src, tmp_path / "m.gguf", dtype="bf16"))
    t = {t.name: t for t in reader.tensors}["blk.1.ffn_up_exps.weight"]
    want = torch.stack([hf[f"model.layers.1.mlp.experts.{e}.up_proj.weight"] for e in range(6)])
    assert np.array_equal(
        np.asarray(t.data).reshape(-1).view(np.uint16), want.view(torch.int16).numpy().view(np.uint16).reshape(-1)
    )


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def test_cancel_leaves_no_output(tmp_path, sources):
    cancel = threading.Event()
    seen = []

    def progress(e):
        seen.append(e)
        if e.done == 5:
            cancel.set()

    out = tmp_path / "m.gguf"
    with pytest.raises(Cancelled):
        convert(sources["moe"], out, progress=progress, cancel=cancel)
    assert not out.exists() and _leftovers(tmp_path) == []
    assert seen[0].total == len(expected_names(json.loads((sources["moe"] / "config.json").read_text())))
    assert max(e.done for e in seen) == 5


def test_interruption_and_errors_leave_existing_output_untouched(tmp_path, sources, monkeypatch):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"previous file")
    calls = {"n": 0}
    real_get = HFCheckpoint.get

    def flaky(self, name):
        calls["n"] += 1
        if calls["n"] == 20:
            raise KeyboardInterrupt
        return real_get(self, name)

    monkeypatch.setattr(HFCheckpoint, "get", flaky)
    with pytest.raises(KeyboardInterrupt):
        convert(sources["moe"], out, force=True)
    assert out.read_bytes() == b"previous file" and _leftovers(tmp_path) == []


def test_disk_full_is_named_and_cleaned_up(tmp_path, sources, monkeypatch):
    real = gguf.GGUFWriter.write_tensor_data
    count = {"n": 0}

    def full(self, tensor, *a, **k):
        count["n"] += 1
        if count["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, tensor, *a, **k)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", full)
    with pytest.raises(TesseraError, match="disk full") as e:
        convert(sources["moe"], tmp_path / "m.gguf")
    assert e.value.subject == str(tmp_path)
    assert not (tmp_path / "m.gguf").exists() and _leftovers(tmp_path) == []


def test_free_space_checked_first(tmp_path, sources, monkeypatch):
    from tessera.engine import gguf_writer

    monkeypatch.setattr(gguf_writer.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(TesseraError, match="not enough free space"):
        convert(sources["moe"], tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_bad_sources_are_named(tmp_path, sources):
    src = sources["moe"]
    out = tmp_path / "o.gguf"

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelFormatError, match="is missing") as e:
        convert(empty, out)
    assert e.value.subject == str(empty / "config.json")

    other = _copy(src, tmp_path / "llama")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(
        json.dumps({**cfg, "architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    with pytest.raises(ModelFormatError, match="unsupported architecture 'llama'"):
        convert(other, out)

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(src / "config.json", pickled / "config.json")
    shutil.copy(src / "tokenizer.json", pickled / "tokenizer.json")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelFormatError, match="pickle checkpoints are not loaded") as e:
        convert(pickled, out)
    assert e.value.subject.endswith("pytorch_model.bin")

    sharded = make_model(tmp_path / "sharded", max_shard_bytes=1_000_000)
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ModelFormatError, match="shard is missing") as e:
        convert(sharded, out)
    assert e.value.subject == str(shard)

    mismatch = _copy(src, tmp_path / "mismatch")
    (mismatch / "config.json").write_text(json.dumps({**cfg, "moe_intermediate_size": 128}))
    with pytest.raises(ModelFormatError, match=r"tensor model\.layers\.0\.mlp\.experts\.0\.\S+ has shape .* config.json"
                       r" needs") as e:
        convert(mismatch, out)
    assert e.value.subject == str(mismatch)

    missing = _copy(src, tmp_path / "missing")
    (missing / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 4}))
    with pytest.raises(ModelFormatError, match=r"tensor model\.layers\.3\.\S+ is missing"):
        convert(missing, out)

    extra = _copy(src, tmp_path / "extra")
    from safetensors.torch import save_file

    stored = load_file(str(extra / "model.safetensors"))
    stored["model.layers.0.mlp.shared_expert.up_proj.weight"] = torch.zeros(4, 96)
    save_file(stored, str(extra / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="tensor model.layers.0.mlp.shared_expert.up_proj.weight: unknown"):
        convert(extra, out)

    truncated = _copy(src, tmp_path / "truncated")
    shard = truncated / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(ModelFormatError, match="invalid safetensors file") as e:
        convert(truncated, out)
    assert e.value.subject == str(shard)

    no_tok = _copy(src, tmp_path / "notok")
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(ModelFormatError, match="tokenizer"):
        convert(no_tok, out)
    assert not out.exists()


def test_transformers_rope_parameters_form_is_accepted(tmp_path, sources):
    src = _copy(sources["moe"], tmp_path / "v5")
    cfg = json.loads((src / "config.json").read_text())
    theta = cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    (src / "config.json").write_text(json.dumps(cfg))
    reader = gguf.GGUFReader(convert(src, tmp_path / "m.gguf"))
    assert field(reader, "qwen3moe.rope.freq_base") == theta


def test_config_without_rope_theta_means_what_transformers_reads(tmp_path, sources):
    """No rope_theta anywhere: transformers' Qwen3MoeConfig default, written as freq_base so llama.cpp agrees."""
    from transformers import Qwen3MoeConfig

    src = _copy(sources["moe"], tmp_path / "no-theta")
    cfg = json.loads((src / "config.json").read_text())
    del cfg["rope_theta"]
    (src / "config.json").write_text(json.dumps(cfg))
    hf = Qwen3MoeConfig.from_pretrained(src)
    theirs = hf.rope_parameters["rope_theta"] if getattr(hf, "rope_parameters", None) else hf.rope_theta
    reader = gguf.GGUFReader(convert(src, tmp_path / "m.gguf"))
    assert field(reader, "qwen3moe.rope.freq_base") == theirs == 10000.0


def test_cli_convert(tmp_path, sources, capsys):
    out = tmp_path / "m.gguf"
    assert main(["convert", str(sources["moe"]), str(out), "--dtype", "q8_0"]) == 0
    assert gguf.GGUFReader(out).fields["general.file_type"].contents() == 7
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"error: {tmp_path / 'nowhere'}: is not a folder (expected a Hugging Face model folder or .gguf file)"
    with pytest.raises(SystemExit) as e:
        main(["convert", str(sources["moe"]), str(out), "--dtype", "q4_k"])
    assert e.value.code == 2


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_killed_cli_conversion_leaves_no_file(tmp_path, sources, sig):
    """A real signal in the middle of `tessera-cli convert` (slowed by a sleeping progress hook) leaves nothing."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "m.gguf"
    script = (
        "import signal, sys, time\n"
        # Python leaves SIGINT ignored when the process started with it ignored (a test run from a background job:
        # shells start those so); a user's Ctrl-C reaches a foreground tessera-cli with Python's handler in place.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import tessera.engine.convert as c\n"
        "real = c.convert\n"
        "def slow(*a, progress=None, **k):\n"
        "    def p(e):\n"
        # Slept in short slices: a signal the kernel hands to another thread of the process (numpy's BLAS threads)
        # only sets Python's flag, which the main thread acts on at its next bytecode, not inside one long sleep.
        "        if e.done == 3:\n"
        "            print('started', flush=True)\n"
        "            for _ in range(600): time.sleep(0.1)\n"
        "    return real(*a, progress=p, **k)\n"
        "c.convert = slow\n"
        "from tessera.engine.cli import main\n"
        f"sys.exit(main(['convert', {str(sources['moe'])!r}, {str(out)!r}]))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        assert any(p.name.endswith(".partial") for p in tmp_path.iterdir())
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "error: interrupted"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_folder_saved_by_current_transformers_converts_identically(tmp_path, sources):
    from transformers import Qwen3MoeForCausalLM

    src = sources["dense-tied-headdim"]
    saved = tmp_path / "saved"
    Qwen3MoeForCausalLM.from_pretrained(str(src)).save_pretrained(str(saved))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, saved / name)
    assert "rope_parameters" in json.loads((saved / "config.json").read_text())
    a = gguf.GGUFReader(convert(src, tmp_path / "a.gguf"))
    b = gguf.GGUFReader(convert(saved, tmp_path / "b.gguf"))
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert np.array_equal(ta.data, tb.data), ta.name


def test_prepack_fills_the_packed_cache(tmp_path, sources, monkeypatch, capsys):
    from tessera.engine import backends

    available = [name for name in backends.available_names() if name != "Reference"]
    if not available:
        pytest.skip("no packing backend on this machine")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "m.gguf"
    assert main(["convert", str(sources["moe"]), str(out), "--prepack", available[0]]) == 0
    assert f"experts packed for {available[0]}" in capsys.readouterr().err
    packed = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert packed, "nothing written to the packed-weight cache"
    assert main(["convert", str(sources["moe"]), str(out), "--prepack", "Torch", "--force"]) == 0
    assert "nothing to pack" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["bf16", "q8_0"])
def test_output_bytes_predicts_the_file_size(tmp_path, sources, dtype):
    from tessera.engine.convert import output_bytes, read_source

    predicted = output_bytes(read_source(sources["moe"]), dtype)
    size = convert(sources["moe"], tmp_path / "m.gguf", dtype=dtype).stat().st_size
    assert 0 < size - predicted < 200_000  # header, metadata (tokens, merges, template) and 32-byte alignment


def test_cancel_inside_an_expert_stack(tmp_path, sources, monkeypatch):
    cancel = threading.Event()
    real_get = HFCheckpoint.get
    seen = []

    def get(self, name):
        seen.append(name)
        if name.endswith("experts.2.up_proj.weight"):
            cancel.set()
        return real_get(self, name)

    monkeypatch.setattr(HFCheckpoint, "get", get)
    with pytest.raises(Cancelled):
        convert(sources["moe"], tmp_path / "m.gguf", cancel=cancel)
    assert seen[-1] == "model.layers.0.mlp.experts.2.up_proj.weight"  # stopped at the next expert, not the next tensor
    assert list(tmp_path.iterdir()) == []


def test_corrupt_headers_and_index_are_named(tmp_path, sources):
    src = sources["moe"]
    bad_index = make_model(tmp_path / "idx", max_shard_bytes=1_000_000)
    index = json.loads((bad_index / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    (bad_index / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFormatError, match=r"tensor model.norm.weight: bad shard file name '\.\./elsewhere"):
        convert(bad_index, tmp_path / "o.gguf")

    corrupt = _copy(src, tmp_path / "corrupt")
    shard = corrupt / "model.safetensors"
    data = shard.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    del header["model.norm.weight"]["data_offsets"]
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # shorter than before: pad to the same length
    assert len(raw) == n
    shard.write_bytes(data[:8] + raw + data[8 + n :])
    with pytest.raises(ModelFormatError, match="invalid safetensors file"):
        convert(corrupt, tmp_path / "o.gguf")
