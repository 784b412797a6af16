"""Tessera against llama.cpp on one GGUF file, same machine, same hour (the docs/BENCHMARKS.md comparison).

    .venv/bin/python scripts/bench_vs_llama.py MODEL --llama-bin DIR [--rounds 3] [--threads 2] [--out DIR]

DIR holds a llama.cpp build (llama-bench, llama-cli), made outside this repository. Every run takes /tmp/bench.lock
on its own (so the other users of the machine are not locked out for the whole comparison), and the two engines
alternate inside each round, so a drift in the machine's state hits both. Per round:

- load to first token, warm: the wall time and peak RSS (`/usr/bin/time -v`) of `tessera-cli generate MODEL
  --max-tokens 1` and of `llama-cli -n 1 -st` on a short prompt; once before the rounds, cold (page cache dropped, when
  this user may) for each engine, then one untimed warm-up run of each, since the second engine's cold run dropped the
  first one's files (a BF16 file's int8 packs are Tessera's own: its first "warm" round read them from disk, 13-18 s);
- prefill 128 and 512 tokens and decode 32 tokens: `llama-bench -p 128,512 -n 32 -r 1` against
  `tessera-cli bench --prompt-tokens 128 --gen-tokens 32` and `--prompt-tokens 512 --gen-tokens 2`.

Prints one Markdown table of medians over the rounds, and keeps every raw output under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOCK = "/tmp/bench.lock"
PROMPT = "The capital of France is"
HELD = False  # --lock-held: the caller runs this whole script under the lock
CONTEXT = 4096  # both engines' KV cache in the load runs (the model's 40,960 would cost Tessera ~4 GB at 48 layers)


def run(cmd: list[str], log: Path) -> tuple[str, float, int]:
    """(output, wall seconds, peak RSS bytes) of `cmd` run under the lock and /usr/bin/time -v; raises on failure."""
    full = ["/usr/bin/time", "-v", *cmd] if HELD else ["flock", LOCK, "/usr/bin/time", "-v", *cmd]
    t0 = time.perf_counter()
    p = subprocess.run(full, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log.write_text(f"$ {' '.join(full)}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    elapsed = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed (exit {p.returncode}), see {log}")
    if elapsed:  # the timed command's own wall time, without the wait for the lock
        wall = sum(float(x) * 60**i for i, x in enumerate(reversed(elapsed.group(1).split(":"))))
    return p.stdout, wall, int(rss.group(1)) * 1024 if rss else 0


def drop_caches() -> bool:
    """Drop the page cache (root only); False when this user may not."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench and llama-cli")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tessera", default=str(Path(sys.executable).parent / "tessera-cli"))
    ap.add_argument("--out", default="/tmp/bench_vs_llama", help="folder for the raw outputs")
    ap.add_argument("--llama-repack", choices=("0", "1"), default="1",
                    help="llama.cpp's weight repacking (its default 1; 0 = llama-bench --repack 0, llama-cli -nr)")
    ap.add_argument("--skip-load", action="store_true", help="only the speed runs")
    ap.add_argument("--skip-speed", action="store_true", help="only the load runs")
    ap.add_argument("--lock-held", action="store_true",
                    help=f"the caller already holds {LOCK} (e.g. `flock {LOCK} python scripts/bench_vs_llama.py ...`)")
    args = ap.parse_args()
    global HELD
    HELD = args.lock_held
    model, lb = args.model, Path(args.llama_bin)
    out = Path(args.out) / Path(model).stem
    out.mkdir(parents=True, exist_ok=True)
    t = str(args.threads)
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)
        print(f"  {key}: {value:.3f}", flush=True)

    tessera_gen = [args.tessera, "generate", model, "--prompt", PROMPT, "--max-tokens", "1", "--temperature", "0",
                   "--threads", t, "--context-length", str(CONTEXT)]
    llama_cli = [str(lb / "llama-cli"), "-m", model, "-t", t, "-c", str(CONTEXT), "-p", PROMPT, "-n", "1", "-st"]
    if args.llama_repack == "0":
        llama_cli.append("-nr")
    cold_ok = True
    engines = (("tessera", tessera_gen), ("llama.cpp", llama_cli))
    if not args.skip_load:
        for name, cmd in engines:  # cold once per engine: a dropped cache costs a full read of the file
            cold_ok = drop_caches() and cold_ok
            _, wall, rss = run(cmd, out / f"{name}_load_cold.log")
            add(f"{name} load cold s", wall)
            add(f"{name} peak RSS cold GB", rss / 1e9)
        for name, cmd in engines:  # untimed: each engine's files in the page cache again after the other's cold
            run(cmd, out / f"{name}_load_warmup.log")  # run dropped it (a BF16 file's packs are Tessera's alone)
    for r in range(args.rounds):
        print(f"round {r + 1}", flush=True)
        if not args.skip_load:
            for name, cmd in engines:
                _, wall, rss = run(cmd, out / f"{name}_load_warm_{r}.log")
                add(f"{name} load warm s", wall)
                add(f"{name} peak RSS warm GB", rss / 1e9)
        if args.skip_speed:
            continue
        text, _, _ = run([str(lb / "llama-bench"), "-m", model, "-t", t, "-p", "128,512", "-n", "32", "-r", "1",
                          "--repack", args.llama_repack, "-o", "jsonl"], out / f"llama_bench_{r}.log")
        for line in text.splitlines():
            j = json.loads(line)
            key = f"pp{j['n_prompt']}" if j["n_prompt"] else f"tg{j['n_gen']}"
            add(f"llama.cpp {key} tok/s", j["avg_ts"])
        for n, gen in ((128, 32), (512, 2)):
            text, _, rss = run([args.tessera, "bench", model, "--threads", t, "--prompt-tokens", str(n), "--gen-tokens",
                                str(gen), "--context-length", str(n + gen + 16), "--json"],
                               out / f"tessera_bench_{n}_{r}.log")
            j = json.loads(text.strip().splitlines()[-1])
            add(f"tessera pp{n} tok/s", j["prefill_tok_s"])
            if n == 128:
                add("tessera tg32 tok/s", j["decode_tok_s"])
                add("tessera bench peak RSS GB", rss / 1e9)
                print(f"  tessera backend: {j['backend']}", flush=True)
    print(f"\n{model}: medians over {args.rounds} rounds, {args.threads} threads"
          + ("" if cold_ok else " (cold runs: the page cache could not be dropped, so they are warm)"))
    print("| figure | median | runs |\n|---|---|---|")
    for key, values in rows.items():
        print(f"| {key} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
