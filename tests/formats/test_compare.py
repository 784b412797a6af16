"""compare / convert --verify: teacher-forced logits of a model pair, with the stated tolerances."""

from __future__ import annotations

import json

import pytest
import torch

from tessera.engine.cli import main
from tessera.engine.compare import compare_logits, verdict


def test_compare_logits_statistics():
    a = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    same = compare_logits(a, a.clone())
    assert same.max_abs_diff == 0 and same.top1_agreement == 1 and same.mean_kl == 0 and same.logit_range == 3
    b = torch.tensor([[0.0, 2.5, 2.0], [3.0, 0.0, 0.5]])
    r = compare_logits(a, b)
    assert r.max_abs_diff == pytest.approx(1.5) and r.top1_agreement == 0.5 and r.rel_max_diff == pytest.approx(0.5)
    pa, pb = torch.softmax(a.double(), -1), torch.softmax(b.double(), -1)
    assert r.mean_kl == pytest.approx((pa * (pa / pb).log()).sum(-1).mean().item())
    assert verdict(same, lossless=True)[0] and not verdict(r, lossless=True)[0] and not verdict(r, lossless=False)[0]


def test_hf_and_gguf_fixtures_give_identical_logits(tiny_hf_model, tiny_gguf_model, capsys):
    assert main(["compare", str(tiny_hf_model), str(tiny_gguf_model), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] > 20 and report["max_abs_diff"] <= 1e-5 * report["logit_range"]
    assert report["top1_agreement"] == 1.0


@pytest.mark.parametrize(("src_dtype", "dtype", "rule"), [
    ("bf16", "bf16", "lossless"),  # float outputs: source against output, as before quantized outputs had their rule
    ("f32", "bf16", "lossy"),
    ("f32", "q8_0", "quantized output"),  # block-quantized: tensors against the source, logits against the F32 twin
])
def test_convert_verify(tmp_path, capsys, src_dtype, dtype, rule):
    from tessera.engine.compare import verify_conversion
    from tessera.engine.make_model import make_model

    src = make_model(tmp_path / "src", dtype=src_dtype, seed=9, config_overrides={"mlp_only_layers": [2]})
    out = tmp_path / "m.gguf"
    assert main(["convert", str(src), str(out), "--dtype", dtype, "--verify", "--text", "Hello world, 你好 🙂"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith(f"verify: PASS ({rule}")
    report, ok, why = verify_conversion(src, out, dtype)
    assert ok and why.startswith(rule)
    if rule == "lossless":  # same values, same engine: bit-identical logits
        assert report.max_abs_diff == 0.0
    elif rule == "lossy":
        assert 0 < report.mean_kl <= 0.02 and report.max_abs_diff > 0
    else:  # q8_0: the output through the backend against its dequantized-F32 twin
        assert 0 < report.mean_kl <= 0.01 and report.max_abs_diff > 0


def test_converted_tokenizer_round_trips(tiny_hf_model, tmp_path):
    """The GGUF's tokenizer.ggml.* keys rebuild the same tokenizer as the folder's tokenizer.json."""
    from tessera.engine.convert import convert
    from tessera.engine.tokenizer import Tokenizer

    out = convert(tiny_hf_model, tmp_path / "m.gguf", dtype="q8_0")
    hf, gg = Tokenizer.from_path(tiny_hf_model), Tokenizer.from_path(out)
    for text in [
        "Hello, world!  It's 42.",
        "今天天气很好 🙂👍🏽",
        "def f(x):\n\tif x:\n        return None\n\n\n",
        "<|im_start|>user\n<think>hi</think><|im_end|><|endoftext|>",
        "café naïve  \u00a0 nbsp",
    ]:
        ids = hf.encode(text)
        assert gg.encode(text) == ids, text
        assert gg.decode(ids) == hf.decode(ids)
