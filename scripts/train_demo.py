#!/usr/bin/env python
"""Train Tessera's demo model: a small Qwen3-MoE that does arithmetic, letter counting, list reversal and sorting, and
answers questions about Tessera, on procedurally generated chats (tessera/engine/demo). Then convert it with Tessera's
own converter to a BF16 GGUF under tessera/resources/demo/ and write the numbers the model card quotes.

    python scripts/train_demo.py                      # from scratch (fixed seed; 4,000 steps, not yet run on this data)
    python scripts/train_demo.py --init-from tessera/resources/demo/tessera-demo-moe.gguf --lr 1e-3 --warmup 50 \
        --steps 2000 --gguf build/demo-train/tessera-demo-moe.gguf   # continue the shipped model on today's data
    python scripts/train_demo.py --steps 40 --out build/demo-smoke --gguf build/demo-smoke/demo.gguf   # smoke run
    nohup nice -n 19 python scripts/train_demo.py ... --pause-while-locked /tmp/bench.lock &   # yield to benchmarks

Batches hold conversations of similar length up to --tokens-per-step padded tokens; chats run up to the model's
context (tessera/engine/demo/dataset.py). --threads may differ between a run and its resumption;
the other flags may not.

Training uses transformers' Qwen3MoeForCausalLM, the numerical oracle Tessera's engine is tested equal to; it is a
dev dependency of this script only (the engine never imports it). A checkpoint is written every --ckpt-every steps
into --out, and a rerun with the same arguments resumes from it. With --pause-while-locked PATH the run waits between
steps while anyone else holds a flock on PATH, so benchmarks and tests taken under that lock run undisturbed.
Letters: B batch, T tokens, V vocab, H hidden, E experts, L layers.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import string
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from tessera.engine.demo.dataset import (  # noqa: E402
    CONTEXT_TOKENS,
    IGNORE,
    SKILL_WEIGHTS,
    conversation,
    encode_conversations,
    make_renderer,
)
from tessera.engine.demo.evaluate import MAX_REPLY_TOKENS, earlier_turns  # noqa: E402
from tessera.engine.demo.skills import COUNT_PROMPTS, SKILLS, count_answer  # noqa: E402
from tessera.engine.demo.split import eval_problems  # noqa: E402
from tessera.engine.tokenizer_build import build_tokenizer, chat_template, save_tokenizer  # noqa: E402

DEFAULT_GGUF = REPO / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "build" / "demo-train",
                   help="work folder (checkpoints, HF model)")
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="where to write the BF16 GGUF")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--tokens-per-step", type=int, default=4096,
                   help="padded tokens per batch: conversations of similar length are batched until their padded "
                        f"size would pass this (at least the context, {CONTEXT_TOKENS})")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads (2 on an idle 2-core machine, 1.7x the speed of 1 thread; on a busy "
                        "machine use 1, since 2 threads on 2 loaded cores spin and run several times slower)")
    p.add_argument("--vocab", type=int, default=2022,
                   help="BPE tokens at most (the corpus yields fewer); Qwen's 26 added tokens come on top")
    p.add_argument("--hidden", type=int, default=192, help="hidden size; heads of 32, so 192 gives 6 query heads")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-dim", type=int, default=256, help="moe_intermediate_size")
    p.add_argument("--aux-coef", type=float, default=0.001, help="router load-balancing loss weight (Qwen3's default)")
    p.add_argument("--ckpt-every", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--final-eval", type=int, default=20, help="held-out prompts per skill for the closing HF check")
    p.add_argument("--init-from", type=Path, default=None, metavar="GGUF",
                   help="start from this demo model (its tokenizer and weights; the shape flags must match it) "
                        "instead of a new tokenizer and random weights")
    p.add_argument("--pause-while-locked", type=Path, default=None, metavar="PATH",
                   help="between steps, wait while another process holds a flock on PATH (e.g. /tmp/bench.lock)")
    args = p.parse_args(argv)
    if args.tokens_per_step < CONTEXT_TOKENS:
        p.error(f"--tokens-per-step: must be >= the context ({CONTEXT_TOKENS}) so the longest chat fits a batch, "
                f"got {args.tokens_per_step}")
    if args.steps < 1:
        p.error(f"--steps: must be >= 1, got {args.steps}")
    return args


def claim_out_dir(out: Path) -> int:
    """Hold an exclusive flock on `out`/run.lock for the life of this process (the descriptor returned), so a second
    run started on the same folder stops at once instead of writing the same checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"error: --out {out}: another train_demo run is using this folder (it holds "
                         f"{out / 'run.lock'}); wait for it, or stop it, before starting again") from None
    return fd


def lock_is_held(path: Path) -> bool:
    """Whether another process holds a flock (shared or exclusive) on `path`: probe with a non-blocking exclusive lock
    on a fresh descriptor and release it at once. A missing file is never held."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def wait_while_locked(path: Path | None, poll_s: float = 1.0, on_wait=None) -> float:
    """Sleep while `path` is locked by someone else (polling every `poll_s`); the seconds waited. `on_wait()` is
    called once when a wait begins (the log then says the run is paused, not stuck)."""
    if path is None:
        return 0.0
    t0 = time.time()
    if lock_is_held(path) and on_wait is not None:
        on_wait()
    while lock_is_held(path):
        time.sleep(poll_s)
    return time.time() - t0


def model_config(args, tok) -> dict:
    """A Qwen3-MoE config.json in the shape Qwen publishes (every layer sparse, q/k norm, GQA, renormalised top-k)."""
    head_dim = 32
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": tok.total_size,
        "hidden_size": args.hidden,
        "intermediate_size": 4 * args.hidden,
        "moe_intermediate_size": args.expert_dim,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.hidden // head_dim,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "num_experts": args.experts,
        "num_experts_per_tok": args.top_k,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,  # short chats: finer position resolution than Qwen3's 1e6 for 32-dim heads
        "max_position_embeddings": CONTEXT_TOKENS,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "router_aux_loss_coef": args.aux_coef,
        "output_router_logits": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "torch_dtype": "float32",
    }


def init_from_gguf(path: Path, tok_dir: Path):
    """The tokenizer (written to `tok_dir`) and the weights of a demo model GGUF, the weights under transformers'
    Qwen3MoeForCausalLM names (routed experts fused: `mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I])."""
    from tessera.engine.tokenizer import Tokenizer as EngineTokenizer
    from tessera.engine.weights import open_model

    built = save_tokenizer(EngineTokenizer.from_path(path)._tk, tok_dir)
    mf = open_model(path)
    raw = {t.canonical: mf.gguf.tensor(t.name).to(torch.float32) for t in mf.tensors}
    state: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        if name.endswith("mlp.experts.gate_proj"):  # [E, I, H]
            prefix = name[: -len("gate_proj")]
            state[prefix + "gate_up_proj"] = torch.cat([t, raw[prefix + "up_proj"]], dim=1)  # [E, 2I, H]
        elif not name.endswith("mlp.experts.up_proj"):
            state[name] = t
    return built, state, mf.config


def corpus(seed: int, render, n: int) -> list[str]:
    """The tokenizer's training text: generated chats of every skill except letter counting, plus the counting
    questions and answers with the word left out. The counted words thus never become whole tokens: they split into
    letters and short pieces whose spelling a small model can learn (a whole-word token hides its letters)."""
    rng = random.Random(f"tokenizer:{seed}")
    weights = {k: v for k, v in SKILL_WEIGHTS.items() if k != "count_letters"}
    texts = [render(conversation(rng, weights, max_turns=2)) for _ in range(n)]
    questions = [t.format(l=c, w="") for t in COUNT_PROMPTS for c in string.ascii_lowercase]
    return texts + questions + [count_answer("", c) for c in string.ascii_lowercase]


def batch_plan(lengths: list[int], tokens_per_step: int, seed: int, window: int = 1024) -> list[list[int]]:
    """Conversation indices per step: each window of `window` conversations is sorted by length (less padding) and cut
    into batches whose padded size (count x longest) stays within `tokens_per_step`, and the batches are shuffled with
    a seeded generator, so every run sees the same batches in the same order."""
    rng = random.Random(f"batches:{seed}")
    plan = []
    for w0 in range(0, len(lengths), window):
        idx = sorted(range(w0, min(w0 + window, len(lengths))), key=lambda i: lengths[i])
        chunk, batch = [], []
        for i in idx:  # ascending, so lengths[i] is the longest of the batch it joins
            if batch and (len(batch) + 1) * lengths[i] > tokens_per_step:
                chunk.append(batch)
                batch = []
            batch.append(i)
        chunk.append(batch)
        rng.shuffle(chunk)
        plan.extend(chunk)
    return plan


def training_data(tokenizer, render, args) -> tuple[list, list[list[int]]]:
    """Encoded training conversations and the batch plan (--steps batches): conversations are drawn (seeded) in
    blocks of 1024 until the plan is long enough, so a rerun with the same arguments rebuilds the same batches."""
    rng = random.Random(f"train:{args.seed}")
    data: list = []
    while True:
        convs = [conversation(rng) for _ in range(1024)]
        data += encode_conversations(tokenizer, render, convs, max_tokens=CONTEXT_TOKENS)
        if sum(len(x) for x, _ in data) < 0.8 * args.steps * args.tokens_per_step:
            continue  # batches are at most full, so no plan can be long enough yet
        plan = batch_plan([len(x) for x, _ in data], args.tokens_per_step, args.seed)
        if len(plan) >= args.steps:
            return data, plan[: args.steps]


def make_batch(data, rows_idx: list[int], pad_id: int):
    """Right-padded tensors for the conversations `rows_idx`."""
    rows = [data[i] for i in rows_idx]
    t = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), t), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full((len(rows), t), IGNORE, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(rows), t), dtype=torch.long)  # [B, T]
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        mask[i, : len(x)] = 1
    return ids, labels, mask


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def greedy(model, tokenizer, render, messages: list[dict], eos: int, max_new: int = MAX_REPLY_TOKENS) -> str:
    """Greedy reply to the chat `messages` with the HF model (training-time monitoring only; `tessera-cli eval-demo`
    is the real eval)."""
    text = render(messages, add_generation_prompt=True, enable_thinking=False)
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False).ids])  # [1, T]
    out = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    return tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)


def quick_eval(model, tokenizer, render, eos: int, n: int, turns: int = 1) -> dict[str, float]:
    """Per skill, percent of the first `n` held-out problems answered exactly, each as the last turn of a `turns`-turn
    chat built as `eval-demo --turns` builds it."""
    model.eval()
    acc = {}
    for skill in SKILLS:
        right = 0
        for i, p in enumerate(eval_problems(skill, n)):
            chat = [*earlier_turns(skill, i, turns - 1), {"role": "user", "content": p.prompt}]
            right += greedy(model, tokenizer, render, chat, eos).strip() == p.answer
        acc[skill] = 100.0 * right / n
    model.train()
    return acc


@torch.no_grad()
def expert_usage(model, tokenizer, render, n_per_skill: int = 50) -> list[dict]:
    """Per layer: share of routed (token, expert) pairs per expert over held-out conversations, and its entropy."""
    cfg = model.config
    counts = torch.zeros(cfg.num_hidden_layers, cfg.num_experts)  # [L, E]
    for skill in SKILLS:
        for p in eval_problems(skill, n_per_skill):
            text = render([{"role": "user", "content": p.prompt}, {"role": "assistant", "content": p.answer}])
            ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False).ids])  # [1, T]
            out = model(input_ids=ids, output_router_logits=True)
            for layer, logits in enumerate(out.router_logits):  # logits: [T, E]
                top = logits.topk(cfg.num_experts_per_tok, dim=-1).indices  # [T, k]
                counts[layer] += torch.bincount(top.flatten(), minlength=cfg.num_experts).float()
    rows = []
    for layer in range(cfg.num_hidden_layers):
        share = counts[layer] / counts[layer].sum()  # [E]
        entropy = float(-(share * share.clamp_min(1e-12).log2()).sum())
        rows.append({"layer": layer, "share": [round(float(s), 4) for s in share], "entropy_bits": round(entropy, 3),
                     "max_bits": round(math.log2(cfg.num_experts), 3)})
    return rows


def export_hf(model, folder: Path, config: dict, tok_dir: Path) -> None:
    """Write the HF folder as Qwen publishes it: config.json, tokenizer files, and model.safetensors with the experts
    stored one by one (`mlp.experts.{e}.{gate,up,down}_proj.weight`), the layout Tessera's converter and loaders
    read."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        t = t.detach().to(torch.float32).contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows then up rows
            prefix = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].clone()  # [I, H]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].clone()  # [I, H]
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone()  # [H, I]
        elif name.endswith("mlp.gate.weight") or "mlp.experts" not in name:
            out[name] = t
        else:
            raise RuntimeError(f"unexpected parameter {name}: update export_hf for this transformers version")
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
           "pad_token_id": config["pad_token_id"], "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for f in tok_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())


def main(argv=None) -> int:
    args = parse_args(argv)
    from tokenizers import Tokenizer
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    claim_out_dir(args.out)  # held until the process exits
    log = open(args.out / "train.log", "a", buffering=1)

    def say(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log.write(line + "\n")

    t0 = time.time()
    render = make_renderer(chat_template())
    tok_dir = args.out / "tokenizer"
    if args.init_from is not None:
        built, init_state, init_cfg = init_from_gguf(args.init_from, tok_dir)
        say(f"tokenizer and initial weights from {args.init_from}")
    else:
        built = build_tokenizer(corpus(args.seed, render, 20000), args.vocab, tok_dir)
    tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    config = model_config(args, built)
    say(f"tokenizer: {built.total_size} tokens ({built.bpe_size} BPE + 26 added), {time.time() - t0:.1f}s")

    data, plan = training_data(tokenizer, render, args)
    used = [i for b in plan for i in b]
    n_tok = sum(len(data[i][0]) for i in used)
    n_sup = sum(sum(1 for v in data[i][1] if v != IGNORE) for i in used)
    n_replies = sum(sum(1 for v in data[i][1] if v == built.eos_token_id) for i in used)  # one <|im_end|> per reply
    longest = max(len(data[i][0]) for i in used)
    say(f"data: {len(used)} conversations, {n_replies} replies, {n_tok} tokens ({n_sup} supervised, longest "
        f"{longest}), {time.time() - t0:.1f}s")

    hf_cfg = Qwen3MoeConfig(**{k: v for k, v in config.items()
                               if k not in ("architectures", "model_type", "torch_dtype")})
    hf_cfg.output_router_logits = True  # adds the load-balancing loss during training
    model = Qwen3MoeForCausalLM(hf_cfg)
    if args.init_from is not None:
        mismatch = {k: (v, config[k]) for k, v in init_cfg.to_hf_dict().items()
                    if k in config and k not in ("architectures", "torch_dtype") and v != config[k]}
        if mismatch:
            raise SystemExit(f"error: --init-from {args.init_from}: its config differs from the flags' "
                             f"(key: (file, flags)): {mismatch}")
        model.load_state_dict(init_state, strict=True)
    params = sum(p.numel() for p in model.parameters())
    shape_keys = ("hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size")
    say(f"model: {params / 1e6:.2f} M parameters, config {json.dumps({k: config[k] for k in shape_keys})}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)

    ckpt = args.out / "checkpoint.pt"
    start, elapsed_before, paused = 0, 0.0, 0.0  # elapsed: seconds of training, pauses excluded
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, elapsed_before = int(state["step"]), float(state["elapsed"])
        say(f"resumed at step {start}")

    model.train()
    t_train = time.time()
    for step in range(start, args.steps):
        waited = wait_while_locked(args.pause_while_locked, on_wait=lambda step=step: say(
            f"waiting before step {step + 1}: {args.pause_while_locked} is locked by someone else"))
        paused += waited
        if waited >= 1.0:
            say(f"paused {waited:.0f} s while {args.pause_while_locked} was locked")
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        ids, labels, mask = make_batch(data, plan[step], built.pad_token_id)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        elapsed = elapsed_before + time.time() - t_train - paused
        if done % 25 == 0 or done == args.steps:
            say(f"step {done}/{args.steps} loss {out.loss.item():.4f} aux {out.aux_loss.item():.3f} "
                f"lr {lr_at(step, args):.2e} {elapsed / 60:.1f} min")
        if done % args.ckpt_every == 0 or done == args.steps:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": done, "elapsed": elapsed},
                       ckpt.with_suffix(".tmp"))
            ckpt.with_suffix(".tmp").replace(ckpt)
        if done % args.eval_every == 0 and done < args.steps:
            paused += wait_while_locked(args.pause_while_locked)
            t_eval = time.time()
            for turns in (1, 10):
                acc = quick_eval(model, tokenizer, render, built.eos_token_id, 5, turns)
                say(f"held-out (HF greedy, 5 each, turn {turns} of a chat): {acc}")
            paused += time.time() - t_eval  # not training time

    train_minutes = (elapsed_before + time.time() - t_train - paused) / 60
    paused += wait_while_locked(args.pause_while_locked)
    model.eval()
    final = {}
    for turns in (1, 10):
        final[turns] = quick_eval(model, tokenizer, render, built.eos_token_id, args.final_eval, turns)
        say(f"final held-out (HF greedy, {args.final_eval} each, turn {turns} of a chat): {final[turns]}")
    usage = expert_usage(model, tokenizer, render)
    say("expert usage entropy (bits) per layer: " + ", ".join(str(r["entropy_bits"]) for r in usage))

    hf_dir = args.out / "tessera-demo-moe"  # the folder name becomes the GGUF's general.name
    export_hf(model, hf_dir, config, tok_dir)
    from tessera.engine.convert import convert

    args.gguf.parent.mkdir(parents=True, exist_ok=True)
    convert(hf_dir, args.gguf, dtype="bf16")
    stats = {
        "seed": args.seed, "steps": args.steps, "tokens_per_step": args.tokens_per_step, "lr": args.lr,
        "threads": args.threads, "train_minutes": round(train_minutes, 1),
        "total_minutes": round((time.time() - t0 - paused) / 60, 1), "parameters": params, "config": config,
        "conversations": len(used), "replies": n_replies, "tokens": n_tok, "supervised_tokens": n_sup,
        "longest_conversation_tokens": longest,
        "hf_heldout_accuracy": {"n": args.final_eval, "percent_by_turns": final},
        "expert_usage": usage,
        "gguf_bytes": args.gguf.stat().st_size,
    }
    (args.out / "train_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    say(f"wrote {args.gguf} ({args.gguf.stat().st_size / 1e6:.1f} MB) and {args.out / 'train_stats.json'}; "
        f"training {train_minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
