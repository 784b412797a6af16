"""Where one decode step's time goes, on a real model file: the whole step, the layers' one native call, the lm_head,
and each part of a layer re-run alone in layer order (so no layer's weights are still in the caches when it runs
again), with the bytes each part reads and the GB/s that makes.

    python scripts/profile_decode.py MODEL [--threads 2] [--steps 20] [--rounds 5] [--context-length 4096] [--json]
                                           [--phases] [--step-only]

Loads MODEL as `tessera-cli bench` does (default backend), prefills 16 random tokens, then times (wall clock, median
of --rounds, each round --steps steps or passes over all layers):
- step: model.forward on one token (the decode step `tessera-cli bench` times, minus sampling);
- lm_head: the final norm's output through the lm_head Linear;
- qkv / o / router: each layer's q/k/v projections (as the native step dispatches them: one
  engine.native.dense_matvec_multi call when the weights are 16-bit, else one call each), o_proj and the router,
  through the kernels the step uses, on the pool the step runs on;
- experts: each layer's routed experts at T = 1 (the backend's forward, 8 random experts a layer).
--phases sets TESSERA_PROFILE=1 for this process and adds, per step, the native step's own phase timers
(engine.native.decode_profile: the caller's wall time per phase, each pool thread's time inside jobs, the caller's
wait at the jobs' ends, the worker's wake-up latency and sleeps); the timed steps then include the timers' cost.
Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _median_ms(fn, steps: int, rounds: int) -> float:
    fn()  # warm: first touches of the weights' pages
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        per.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(per)


def _bytes(lin) -> int:
    return int(lin.nbytes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--json", action="store_true")
    p.add_argument("--phases", action="store_true", help="TESSERA_PROFILE=1: the native step's phase timers")
    p.add_argument("--step-only", action="store_true", help="time the step (and its phases) only, not the parts")
    a = p.parse_args()
    if a.phases:  # before the native module is first imported: it reads its knobs once
        os.environ["TESSERA_PROFILE"] = "1"
    import torch

    from tessera import engine
    from tessera.engine import native
    from tessera.engine.sampling import SamplingParams

    session = engine.load(a.model, threads=a.threads, context_length=a.context_length)
    try:
        m = session.model
        cfg = m.config
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, cfg.vocab_size, (16,), generator=g).tolist()
        for _ in session.generate(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)):
            pass
        cache = m.new_cache(a.context_length)
        m.forward(torch.tensor(prompt), cache)
        tok = torch.tensor([prompt[0]])

        def step():
            m.forward(tok, cache)
            cache.truncate(len(prompt))  # every step at the same position

        parts: dict[str, float] = {}
        nbytes: dict[str, int] = {}
        step()  # warm, outside the profile
        if a.phases:
            native.decode_profile(reset=True)
        parts["step"] = _median_ms(step, a.steps, a.rounds)
        phases = native.decode_profile(reset=True) if a.phases else None
        if a.step_only:
            print(f"step {parts['step']:.2f} ms (median of {a.rounds} rounds of {a.steps})")
            if a.phases:
                print_phases(phases)
            return
        H = cfg.hidden_size
        x = torch.randn(1, H, generator=g)  # [1, H]
        parts["lm_head"] = _median_ms(lambda: m.lm_head(x), a.steps, a.rounds)
        nbytes["lm_head"] = _bytes(m.lm_head)

        pool = m.experts.pool
        blocks = [b for b in m.layers if hasattr(b.mlp, "router")]
        attn = [b.self_attn for b in blocks]
        outs = {id(lin): torch.empty(1, lin.out_features) for at in attn
                for lin in (at.q_proj, at.k_proj, at.v_proj, at.o_proj)}
        xo = torch.randn(1, attn[0].o_proj.in_features, generator=g)  # [1, nh*hd]
        fused = hasattr(native, "dense_matvec_multi")

        def run_lin(lin, xin):
            if lin.path == "native":
                native.dense_matvec(lin.weight, xin, outs[id(lin)], pool)
            else:
                lin(xin)

        def qkv():
            for at in attn:
                lins = (at.q_proj, at.k_proj, at.v_proj)
                if fused and all(lin.path == "native" for lin in lins):
                    native.dense_matvec_multi([lin.weight for lin in lins], x, [outs[id(lin)] for lin in lins], pool)
                else:
                    for lin in lins:
                        run_lin(lin, x)

        parts["qkv"] = _median_ms(qkv, a.steps, a.rounds)
        nbytes["qkv"] = sum(_bytes(lin) for at in attn for lin in (at.q_proj, at.k_proj, at.v_proj))
        parts["o"] = _median_ms(lambda: [run_lin(at.o_proj, xo) for at in attn], a.steps, a.rounds)
        nbytes["o"] = sum(_bytes(at.o_proj) for at in attn)
        parts["router"] = _median_ms(lambda: [b.mlp.router.proj(x) for b in blocks], a.steps, a.rounds)
        nbytes["router"] = sum(_bytes(b.mlp.router.proj) for b in blocks)

        k = cfg.num_experts_per_tok

        def experts():
            for b in blocks:
                ids = torch.randperm(cfg.num_experts, generator=g)[:k].view(1, k)  # [1, k]
                w = torch.full((1, k), 1.0 / k)  # [1, k]
                m.experts.forward(b.layer, x, ids, w)

        parts["experts"] = _median_ms(experts, a.steps, a.rounds)
        inter = cfg.moe_intermediate_size
        packed = getattr(m.experts, "bytes_per_expert", None) or 3 * H * inter  # a packed copy: int8, 1 B a weight

        def expert_bytes(layer) -> int:  # one expert's bytes as its kernels read them
            raw = getattr(m.experts.layers[layer], "raw", None)  # a quantized file's blocks, read in place
            return sum(r.nbytes // r.shape[0] for r in raw) if raw is not None else packed

        nbytes["experts"] = k * sum(expert_bytes(b.layer) for b in blocks)
    finally:
        session.close()
    result = {"threads": a.threads, "backend": type(m.experts).__name__, "layers": len(blocks),
              "qkv_fused": fused, "ms": parts, "phases": phases,
              "GB_s": {k_: nbytes[k_] / (parts[k_] * 1e-3) / 1e9 for k_ in nbytes}}
    if a.json:
        print(json.dumps(result))
        return
    print(f"backend {result['backend']}, {result['layers']} layers, {a.threads} threads, q/k/v fused: {fused}")
    for name, ms in parts.items():
        gbs = result["GB_s"].get(name)
        print(f"  {name:8s} {ms:8.2f} ms" + (f"   {nbytes[name] / 1e6:8.1f} MB  {gbs:5.1f} GB/s" if gbs else ""))
    if a.phases:
        print_phases(phases)


def print_phases(prof: dict) -> None:
    """The native step's phase timers, per step (prof from engine.native.decode_profile)."""
    n = max(1, prof["steps"])
    if not prof["enabled"] or not prof["steps"]:
        print("phase timers: none recorded (TESSERA_PROFILE unset, or no native one-call step ran)")
        return
    print(f"native step phases, per step (mean of {prof['steps']} native calls, {prof['step_ms'] / n:.2f} ms each;"
          f" {prof['threads']} pool threads): wall | caller busy, tail | workers busy, idle | dispatches,"
          f" wake us/job, sleeps")
    tot = {"wall": 0.0, "busy0": 0.0, "tail": 0.0, "busyw": 0.0}
    for name, ph in prof["phases"].items():
        wall, busy = ph["wall_ms"] / n, [b / n for b in ph["busy_ms"]]
        busyw = sum(busy[1:])
        nw = max(1, len(busy) - 1)
        wake = ph["wake_ms"] / ph["joined"] * 1e3 if ph["joined"] else 0.0
        tot["wall"] += wall
        tot["busy0"] += busy[0]
        tot["tail"] += ph["tail_ms"] / n
        tot["busyw"] += busyw
        print(f"  {name:14s} {wall:7.2f} ms | {busy[0]:6.2f} {ph['tail_ms'] / n:6.2f} | {busyw:6.2f}"
              f" {wall * nw - busyw:6.2f} | {ph['dispatches'] / n:6.1f} {wake:6.1f} {ph['sleeps'] / n:5.1f}")
    print(f"  {'total':14s} {tot['wall']:7.2f} ms | {tot['busy0']:6.2f} {tot['tail']:6.2f} | {tot['busyw']:6.2f}")


if __name__ == "__main__":
    main()
