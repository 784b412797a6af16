"""The training script's HF export: experts written one by one as Qwen publishes them, loadable by transformers (the
oracle) with identical logits, and by Tessera's converter and engine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _train_demo():
    spec = importlib.util.spec_from_file_location("train_demo", REPO / "scripts" / "train_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from tessera.engine.tokenizer_build import build_tokenizer

    td = _train_demo()
    tmp = tmp_path_factory.mktemp("demo-export")
    built = build_tokenizer(None, 300, tmp / "tok")
    args = td.parse_args(["--hidden", "64", "--layers", "2", "--experts", "4", "--expert-dim", "32"])
    config = td.model_config(args, built)
    torch.manual_seed(0)
    skip = ("architectures", "model_type", "torch_dtype")
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**{k: v for k, v in config.items()
                                                                            if k not in skip}))
    model.eval()
    td.export_hf(model, tmp / "hf", config, tmp / "tok")
    return td, model, tmp / "hf", config


def test_experts_are_stored_one_by_one(exported):
    from safetensors import safe_open

    _, _, folder, config = exported
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    for e in range(config["num_experts"]):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.1.mlp.experts.{e}.{proj}.weight" in names
    assert "model.layers.0.mlp.gate.weight" in names and "lm_head.weight" in names
    assert not any("gate_up_proj" in n for n in names)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen3MoeForCausalLM"]


def test_transformers_reloads_the_same_model(exported):
    import transformers

    _, model, folder, _ = exported
    again = transformers.Qwen3MoeForCausalLM.from_pretrained(folder)
    again.eval()
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_converter_and_engine_agree_with_transformers(exported, tmp_path):
    from tessera import engine
    from tessera.engine.convert import convert
    from tessera.engine.sampling import SamplingParams

    _, model, folder, _ = exported
    gguf = convert(folder, tmp_path / "demo.gguf", dtype="f32")
    session = engine.load(gguf, backend="Torch")
    try:
        ids = [1, 5, 9, 200, 17, 3]
        events = list(session.generate(ids, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)))
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                                  min_new_tokens=8)
        assert events[-1].token_ids == want[0, len(ids):].tolist()
    finally:
        session.close()
