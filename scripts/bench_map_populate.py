"""A/B of populating a cached model file's map at load (engine.readahead.populate) end to end, docs/BENCHMARKS.md.

    .venv/bin/python scripts/bench_map_populate.py MODEL ROUNDS PROMPT_TOKENS GEN_TOKENS [--no-llama] [--held]

Runs `tessera-cli bench MODEL --backend Auto --threads 2 --context-length 4096` in a fresh process per run, "on" (as
built) and "off" (madvise answers EINVAL: the populate absent, as on a kernel without MADV_POPULATE_READ) alternating
in order and reverse order round by round, then `llama-bench -m MODEL -t 2 -p 0 -n GEN_TOKENS --repack 0` ($LLAMA_BENCH,
default the build in /tmp/llsrc). Each run under /tmp/bench.lock unless --held (the caller holds it). Prints each
run's decode tok/s (and Tessera's load seconds and prefill tok/s), then the medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

LLAMA_BENCH = (os.environ.get("LLAMA_BENCH")
               or "/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench")
OFF = ("import sys, errno\nimport tessera.engine.readahead as r\n"
       "if sys.argv[1] == 'off':\n    r.madvise = lambda *a: errno.EINVAL\n"
       "from tessera.engine.cli import main\nsys.exit(main(sys.argv[2:]))")


def main() -> int:
    model, rounds, prompt, gen = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    lock = [] if "--held" in sys.argv else ["flock", "/tmp/bench.lock"]
    res: dict[str, list[float]] = {"on": [], "off": [], "llama": []}
    for k in range(rounds):
        order = ["on", "off"] if k % 2 == 0 else ["off", "on"]
        for mode in order + ([] if "--no-llama" in sys.argv else ["llama"]):
            if mode == "llama":
                out = subprocess.run([*lock, LLAMA_BENCH, "-m", model, "-t", "2", "-p", "0", "-n", gen, "-r", "1",
                                      "--repack", "0", "-o", "json"], capture_output=True, text=True, check=True)
                v, extra = json.loads(out.stdout)[0]["avg_ts"], ""
            else:
                p = subprocess.run([*lock, sys.executable, "-c", OFF, mode, "bench", model, "--backend", "Auto",
                                    "--threads", "2", "--context-length", "4096", "--prompt-tokens", prompt,
                                    "--gen-tokens", gen, "--json"], capture_output=True, text=True)
                if p.returncode:
                    print(p.stderr[-2000:])
                    return 1
                j = json.loads(p.stdout.strip().splitlines()[-1])
                v, extra = j["decode_tok_s"], f"  (load {j['load_s']:.1f} s, prefill {j['prefill_tok_s']:.1f} tok/s)"
            res[mode].append(v)
            print(time.strftime("%H:%M:%S"), k, mode, f"{v:.2f}{extra}", flush=True)
    for mode, v in res.items():
        if v:
            print(mode, "median", f"{statistics.median(v):.2f}", "all", " ".join(f"{x:.2f}" for x in v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
