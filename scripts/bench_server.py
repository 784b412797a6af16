"""Server overhead: `tessera-cli bench` (in-process) against the same work through `tessera-cli serve` and the official
`openai` client (streaming), then N concurrent clients. Prints one JSON object and a Markdown table for
docs/BENCHMARKS.md.

    python scripts/bench_server.py tessera/resources/demo/tessera-demo-moe.gguf [--runs 5] [--clients 4]

Work per request, as `tessera-cli bench` does: a random prompt of --prompt-tokens ids (sent as token ids to
/v1/completions, so both paths run exactly the same ids), --gen-tokens generated greedily with end-of-sequence ignored.
Each request has its own random prompt, so the prefix cache never helps. Client-side TTFT: from sending the request to
the first streamed token chunk; client-side decode tok/s: (completion_tokens - 1) / (last token chunk - first). The
server sends a chunk per token, with "" while a character is incomplete (random-weight models from make-model emit
mostly ids their small tokenizer decodes to nothing, so timing text chunks would see none).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time

import openai
import torch


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def in_process(model: str, args) -> list[dict]:
    runs = []
    for seed in range(args.runs):
        out = subprocess.run([sys.executable, "-m", "tessera.engine", "bench", model, "--json", "--seed", str(seed),
                              "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    return runs


def start_server(model: str, max_queue: int):
    proc = subprocess.Popen([sys.executable, "-m", "tessera.engine", "serve", model, "--port", "0", "--log-level",
                             "warning", "--max-queue", str(max_queue)], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"at (http://\S+/v1);", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("the server did not start")


def streamed(client: openai.OpenAI, name: str, prompt_ids: list[int], gen_tokens: int) -> dict:
    t0 = time.perf_counter()
    first = last = None
    usage = None
    stream = client.completions.create(model=name, prompt=prompt_ids, max_tokens=gen_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    for chunk in stream:
        now = time.perf_counter() - t0
        if chunk.choices and chunk.choices[0].finish_reason is None:  # a token's chunk (its text may be "")
            first = now if first is None else first
            last = now
        if chunk.usage is not None:
            usage = chunk.usage
    n = usage.completion_tokens
    if first is None:
        raise SystemExit(f"a request streamed {n} tokens and no token chunk (a server that sends only text?)")
    return {"ttft_s": first, "decode_tok_s": (n - 1) / (last - first) if last > first else 0.0, "tokens": n,
            "total_s": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="rounds of concurrent clients")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=32)
    args = p.parse_args()

    local = in_process(args.model, args)
    proc, url = start_server(args.model, max_queue=args.clients)
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        name = client.models.list().data[0].id
        g = torch.Generator().manual_seed(1000)
        # ids below 256 are byte tokens in every Qwen vocabulary: valid for any model, never special
        prompt = lambda: torch.randint(0, 256, (args.prompt_tokens,), generator=g).tolist()  # noqa: E731
        streamed(client, name, prompt(), 2)  # warm-up, as bench does
        single = [streamed(client, name, prompt(), args.gen_tokens) for _ in range(args.runs)]

        concurrent, walls = [], []
        for _ in range(args.rounds):
            prompts = [prompt() for _ in range(args.clients)]
            results: list[dict] = [None] * args.clients  # type: ignore[list-item]

            def one(i, results=results, prompts=prompts):
                results[i] = streamed(client, name, prompts[i], args.gen_tokens)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(args.clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            walls.append(time.perf_counter() - t0)
            concurrent += results
    finally:
        proc.terminate()
        proc.wait(30)

    med = statistics.median
    report = {
        "in_process": {"ttft_s": med(r["ttft_s"] for r in local), "decode_tok_s": med(r["decode_tok_s"] for r in local),
                       "backend": local[0]["backend"], "threads": local[0]["threads"]},
        "openai_stream": {"ttft_s": med(r["ttft_s"] for r in single),
                          "decode_tok_s": med(r["decode_tok_s"] for r in single)},
        "concurrent": {"clients": args.clients, "rounds": args.rounds,
                       "total_tok_s": med(args.clients * args.gen_tokens / w for w in walls),
                       "ttft_p50_s": percentile([r["ttft_s"] for r in concurrent], 0.5),
                       "ttft_p95_s": percentile([r["ttft_s"] for r in concurrent], 0.95)},
        "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "runs": args.runs,
    }
    print(json.dumps(report, indent=1))
    ip, st, c = report["in_process"], report["openai_stream"], report["concurrent"]
    print()
    print("| path | TTFT | decode tok/s |")
    print("|---|---|---|")
    print(f"| `tessera-cli bench` (in-process, {ip['backend']}) | {1000 * ip['ttft_s']:.1f} ms | "
          f"{ip['decode_tok_s']:.1f} |")
    print(f"| `tessera-cli serve` + `openai` streaming | {1000 * st['ttft_s']:.1f} ms | {st['decode_tok_s']:.1f} |")
    print(f"| {c['clients']} concurrent clients | p50 {1000 * c['ttft_p50_s']:.0f} ms, p95 "
          f"{1000 * c['ttft_p95_s']:.0f} ms | {c['total_tok_s']:.1f} in total |")


if __name__ == "__main__":
    main()
