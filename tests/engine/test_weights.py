"""load_weights: GGUF and HF folders to canonical tensors; unknown/missing/misshapen tensors and bad files are named."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from gguf_factory import Q, random_tensors, tiny_config, write_gguf
from safetensors.torch import load_file, save_file

from tessera.engine.checkpoint_layout import gguf_tensors
from tessera.engine.errors import Cancelled, ModelFormatError
from tessera.engine.quantized import QuantizedMatrix
from tessera.engine.weights import load_weights


def test_gguf_to_canonical(tmp_path):
    cfg = tiny_config(num_hidden_layers=3, mlp_only_layers=(1,))
    src = random_tensors(cfg)
    events = []
    w = load_weights(write_gguf(tmp_path / "m.gguf", cfg, tensors=src), progress=events.append)
    assert w.config == cfg
    table = {t.name: t.canonical for t in gguf_tensors(cfg)}
    assert set(w.tensors) == set(table.values())
    for g, c in table.items():
        assert torch.equal(w.tensors[c], torch.from_numpy(src[g])), g
    assert w.tensors["model.layers.0.mlp.experts.down_proj"].shape == (4, 64, 32)  # [E, H, I]
    assert w.tensors["model.layers.1.mlp.down_proj.weight"].shape == (64, 96)  # dense [H, Id]
    assert events[-1].done == events[-1].total == len(table) and events[0].stage == "load"


def test_gguf_dtypes(tmp_path):
    cfg = tiny_config(tie_word_embeddings=True)
    w = load_weights(write_gguf(tmp_path / "m.gguf", cfg, qtype={"blk.0.ffn_up_exps.weight": Q.BF16,
                                                               "blk.1.attn_q.weight": Q.Q8_0}))  # fmt: skip
    assert w.config.tie_word_embeddings and "lm_head.weight" not in w.tensors
    assert w.tensors["model.layers.0.mlp.experts.up_proj"].dtype == torch.bfloat16
    q = w.tensors["model.layers.1.self_attn.q_proj.weight"]  # kept as its blocks (engine.quantized.QuantizedMatrix)
    assert isinstance(q, QuantizedMatrix) and q.qtype == Q.Q8_0 and q.shape == (cfg.num_attention_heads
                                                                                 * cfg.head_dim, cfg.hidden_size)


def test_gguf_errors(tmp_path):
    cfg = tiny_config()

    def err(match, **kw):
        p = write_gguf(tmp_path / "bad.gguf", cfg, **kw)
        with pytest.raises(ModelFormatError, match=match) as e:
            load_weights(p)
        assert e.value.subject == str(p)

    err("tensor blk.0.attn_q_norm.weight is missing", drop=("blk.0.attn_q_norm.weight",))
    err("tensor blk.1.ffn_down_exps.weight is missing", drop=("blk.1.ffn_down_exps.weight",))
    err("tensor blk.0.mystery.weight: unknown tensor", extra={"blk.0.mystery.weight": np.zeros(64, np.float32)})
    err("tensor blk.5.attn_norm.weight: unknown tensor", extra={"blk.5.attn_norm.weight": np.zeros(64, np.float32)})
    src = random_tensors(cfg)
    src["blk.1.attn_k.weight"] = np.zeros((16, 64), np.float32)
    err(r"tensor blk.1.attn_k.weight has shape \[16, 64\], the metadata needs \[32, 64\]", tensors=src)
    err("unsupported architecture 'llama'", arch="llama")
    err("key qwen3moe.expert_count is missing", drop_keys=("qwen3moe.expert_count",))
    err("unsupported tensor type Q4_1", qtype={"blk.0.attn_v.weight": Q.Q4_1})
    # A block without ffn_gate_inp is dense: its expert tensors become unknown, its dense ones missing.
    err("tensor blk.1.ffn_gate_exps.weight: unknown tensor", drop=("blk.1.ffn_gate_inp.weight",))


def test_missing_path_and_pickles(tmp_path):
    with pytest.raises(ModelFormatError, match="does not exist"):
        load_weights(tmp_path / "none.gguf")
    (tmp_path / "model.pt").write_bytes(b"\x80\x04not really")
    with pytest.raises(ModelFormatError, match="pickle checkpoints are not loaded"):
        load_weights(tmp_path / "model.pt")
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_config().to_hf_dict()))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04junk")
    with pytest.raises(ModelFormatError, match="pickle checkpoints are not loaded") as e:
        load_weights(folder)
    assert e.value.subject.endswith("pytorch_model.bin")


def test_hf_and_gguf_fixtures_agree(tiny_hf_model, tiny_gguf_model):
    """make-model writes the same weights both ways: both loaders give identical canonical tensors."""
    a, b = load_weights(tiny_hf_model), load_weights(tiny_gguf_model)
    assert a.config == b.config
    assert set(a.tensors) == set(b.tensors) == {t.canonical for t in gguf_tensors(a.config)}
    for name in a.tensors:
        assert torch.equal(a.tensors[name], b.tensors[name]), name


def test_hf_sharded_stacks_experts(tiny_hf_model):
    index = json.loads((tiny_hf_model / "model.safetensors.index.json").read_text())
    shards = {f: load_file(tiny_hf_model / f) for f in set(index["weight_map"].values())}
    assert len(shards) > 1
    stored = {n: t for s in shards.values() for n, t in s.items()}
    w = load_weights(tiny_hf_model)
    cfg = w.config
    for i in cfg.moe_layers:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            want = torch.stack([stored[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"]
                                for e in range(cfg.num_experts)])
            assert torch.equal(w.tensors[f"model.layers.{i}.mlp.experts.{proj}"], want)
    assert torch.equal(w.tensors["model.embed_tokens.weight"], stored["model.embed_tokens.weight"])


@pytest.mark.slow
def test_hf_matches_transformers_save(tmp_path):
    """A folder saved by transformers' save_pretrained (bf16) loads; dtypes are kept."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3MoeConfig(
        vocab_size=90, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
        num_experts=5, num_experts_per_tok=2, moe_intermediate_size=20, intermediate_size=36, mlp_only_layers=[2],
    )  # fmt: skip
    model = transformers.Qwen3MoeForCausalLM(hf).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    w = load_weights(tmp_path / "m")
    assert w.config.dense_layers == [2]
    stored = load_file(tmp_path / "m" / "model.safetensors")
    assert w.tensors["model.layers.0.mlp.experts.down_proj"].dtype == torch.bfloat16
    assert torch.equal(w.tensors["model.layers.1.mlp.experts.down_proj"][3],
                       stored["model.layers.1.mlp.experts.3.down_proj.weight"])
    assert torch.equal(w.tensors["model.layers.2.mlp.up_proj.weight"], stored["model.layers.2.mlp.up_proj.weight"])


def _copy_folder(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_hf_errors(tiny_hf_model, tmp_path):
    index = json.loads((tiny_hf_model / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]

    def err(match, folder, subject_end=None):
        with pytest.raises(ModelFormatError, match=match) as e:
            load_weights(folder)
        if subject_end:
            assert e.value.subject.endswith(subject_end)

    f = _copy_folder(tiny_hf_model, tmp_path / "missing_shard")
    (f / shard).unlink()
    err("shard is missing", f, shard)

    f = _copy_folder(tiny_hf_model, tmp_path / "truncated")
    data = (f / shard).read_bytes()
    (f / shard).write_bytes(data[: len(data) // 2])
    err("invalid safetensors file", f, shard)

    f = _copy_folder(tiny_hf_model, tmp_path / "extra")
    tensors = load_file(f / shard)
    tensors["model.layers.0.mlp.shared_expert.gate_proj.weight"] = torch.zeros(4, 4)
    save_file(tensors, f / shard)
    err("shared_expert.gate_proj.weight is stored here but not listed", f)
    idx = json.loads((f / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.0.mlp.shared_expert.gate_proj.weight"] = shard
    (f / "model.safetensors.index.json").write_text(json.dumps(idx))
    err("tensor model.layers.0.mlp.shared_expert.gate_proj.weight: unknown tensor", f)

    f = _copy_folder(tiny_hf_model, tmp_path / "gone")
    idx = json.loads((f / "model.safetensors.index.json").read_text())
    victim = next(n for n in idx["weight_map"] if ".experts.4.up_proj" in n)
    sh = idx["weight_map"].pop(victim)
    t = load_file(f / sh)
    del t[victim]
    save_file(t, f / sh)
    (f / "model.safetensors.index.json").write_text(json.dumps(idx))
    err(f"tensor {victim.replace('.', '[.]')} is missing", f)

    f = _copy_folder(tiny_hf_model, tmp_path / "shape")
    idx = json.loads((f / "model.safetensors.index.json").read_text())
    victim = "model.layers.0.self_attn.o_proj.weight"
    sh = idx["weight_map"][victim]
    t = load_file(f / sh)
    t[victim] = t[victim][:, :-1].contiguous()
    save_file(t, f / sh)
    err(r"tensor model.layers.0.self_attn.o_proj.weight has shape \[96, 95\], config.json needs \[96, 96\]", f)

    f = _copy_folder(tiny_hf_model, tmp_path / "arch")
    cfg = json.loads((f / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "mixtral", ["MixtralForCausalLM"]
    (f / "config.json").write_text(json.dumps(cfg))
    err("unsupported architecture 'mixtral'", f, "config.json")

    f = _copy_folder(tiny_hf_model, tmp_path / "noconfig")
    (f / "config.json").unlink()
    err("is missing", f, "config.json")


def test_cancel(tiny_gguf_model):
    ev = threading.Event()
    ev.set()
    with pytest.raises(Cancelled):
        load_weights(tiny_gguf_model, cancel=ev)


def test_safetensors_corruption_never_raw_errors(tiny_hf_model, tmp_path):
    """Flip bytes in a shard's header: opening and reading either works or raises ModelFormatError."""
    import random
    import struct

    f = _copy_folder(tiny_hf_model, tmp_path / "fuzz")
    shard = sorted(f.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    header_len = struct.unpack_from("<Q", data, 0)[0]
    rng = random.Random(0)
    for _ in range(150):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(8 + header_len)] = rng.randrange(256)
        shard.write_bytes(bytes(b))
        try:
            load_weights(f)
        except ModelFormatError:
            pass


def test_table_uses_llama_cpp_names():
    """Every GGUF name in the table is llama.cpp's name for a qwen3moe tensor (gguf's own constants), and every
    qwen3moe tensor llama.cpp knows is in the table; dense blocks use llama.cpp's dense FFN names."""
    import gguf

    cfg = tiny_config(num_hidden_layers=2, mlp_only_layers=(1,))
    ours = {t.name for t in gguf_tensors(cfg)}
    T = gguf.MODEL_TENSOR
    theirs = set()
    for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3MOE]:
        for i in range(2):
            name = gguf.TENSOR_NAMES[t].format(bid=i) + ".weight"
            if "{bid}" not in gguf.TENSOR_NAMES[t] and i:
                continue
            if i == 1 and t in (T.FFN_GATE_INP, T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP):
                continue
            theirs.add(name)
    theirs |= {gguf.TENSOR_NAMES[t].format(bid=1) + ".weight" for t in (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN)}
    assert ours == theirs


def test_config_keys_are_gguf_constants():
    import gguf

    from tessera.engine.config import GGUF_KEYS

    K = gguf.Keys
    arch = "qwen3moe"
    assert set(GGUF_KEYS.values()) == {
        K.LLM.CONTEXT_LENGTH.format(arch=arch), K.LLM.EMBEDDING_LENGTH.format(arch=arch),
        K.LLM.BLOCK_COUNT.format(arch=arch), K.LLM.FEED_FORWARD_LENGTH.format(arch=arch),
        K.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch), K.Attention.HEAD_COUNT.format(arch=arch),
        K.Attention.HEAD_COUNT_KV.format(arch=arch), K.Attention.KEY_LENGTH.format(arch=arch),
        K.Attention.LAYERNORM_RMS_EPS.format(arch=arch), K.Rope.FREQ_BASE.format(arch=arch),
        K.LLM.EXPERT_COUNT.format(arch=arch), K.LLM.EXPERT_USED_COUNT.format(arch=arch),
        K.LLM.EXPERT_WEIGHTS_NORM.format(arch=arch), K.LLM.VOCAB_SIZE.format(arch=arch),
        K.Tokenizer.BOS_ID, K.Tokenizer.EOS_ID,
    }  # fmt: skip


def test_split_gguf(tmp_path):
    """llama.cpp gguf-split files (NAME-00001-of-0000N.gguf) load as one model, equal to the unsplit file."""
    cfg = tiny_config()
    src = random_tensors(cfg)
    whole = load_weights(write_gguf(tmp_path / "whole.gguf", cfg, tensors=src))
    write_gguf(tmp_path / "m.gguf", cfg, tensors=src, split_max_tensors=10)
    parts = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(parts) == 3 and parts[0].name == "m-00001-of-00003.gguf"
    w = load_weights(parts[0])
    assert w.config == whole.config and set(w.tensors) == set(whole.tensors)
    assert all(torch.equal(w.tensors[n], whole.tensors[n]) for n in w.tensors)
    from tessera.engine.model_info import inspect_model

    assert inspect_model(parts[0]).total_bytes == inspect_model(tmp_path / "whole.gguf").total_bytes
    with pytest.raises(ModelFormatError, match="is part 00002 of a split model; open m-00001-of-00003.gguf"):
        load_weights(parts[1])
    parts[2].unlink()
    with pytest.raises(ModelFormatError, match="split part 3 of 3 is missing") as e:
        load_weights(parts[0])
    assert e.value.subject.endswith("m-00003-of-00003.gguf")


@pytest.mark.parametrize("which", ["gguf", "hf"])
def test_a_load_reads_each_header_once(which, tiny_gguf_model, tiny_hf_model, monkeypatch):
    """engine.load opens the model once (open_model): inspect, weights and tokenizer share the parsed header."""
    from tessera import engine
    from tessera.engine import gguf_reader, safetensors_reader

    opened = []
    if which == "gguf":
        real = gguf_reader._Parser.parse
        monkeypatch.setattr(gguf_reader._Parser, "parse", lambda self: opened.append(self.source) or real(self))
    else:
        real_init = safetensors_reader.HFCheckpoint.__init__
        monkeypatch.setattr(safetensors_reader.HFCheckpoint, "__init__",
                            lambda self, folder: opened.append(str(folder)) or real_init(self, folder))
    path = tiny_gguf_model if which == "gguf" else tiny_hf_model
    session = engine.load(path, backend="Torch")
    session.close()
    assert opened == [str(path)]
