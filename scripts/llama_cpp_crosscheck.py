"""Cross-check GGUF files written by Tessera (make-model, convert) against real llama.cpp.

llama.cpp is not a dependency; this script borrows a prebuilt one from npm (`@fugood/llama.node`, which bundles
llama.cpp's CPU build) in a throw-away folder:

    mkdir -p /tmp/llnode && (cd /tmp/llnode && npm init -y && npm install @fugood/llama.node@1.7.15)
    python scripts/llama_cpp_crosscheck.py --node-modules /tmp/llnode/node_modules M.gguf [M2.gguf ...]

For each file and each prompt it loads the model in llama.cpp (a fresh context per prompt), asks for the next-token
distribution (temperature 1, no truncation, top 5), and compares it with Tessera's teacher-forced softmax on the same
token ids (relative difference of the top-5 probabilities); it also compares the two tokenizations. Prints one line per
file; exit 1 when llama.cpp refuses a file or
the tokenizations differ. Probabilities are reported, not judged: llama.cpp keeps the KV cache in f16 and, for bf16 and
quantized weights, rounds the activations too, so only f32 files are expected to agree to ~1e-4.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

NODE_SCRIPT = r"""
const { loadModel } = require('@fugood/llama.node')
async function main() {
  const [path, prompt] = process.argv.slice(2)
  const ctx = await loadModel({ model: path, n_ctx: 512, n_threads: 1, n_gpu_layers: 0 })
  const tok = await ctx.tokenize(prompt)
  const res = await ctx.completion({ prompt, n_predict: 1, temperature: 1, top_k: 0, top_p: 1, min_p: 0,
                                     n_probs: 5, seed: 0, ignore_eos: true })
  console.log('RESULT ' + JSON.stringify({ tokens: Array.from(tok.tokens),
                                           probs: res.completion_probabilities[0].probs }))
  await ctx.release()
}
main().catch(e => { console.log('FAILED ' + String(e)); process.exit(1) })
"""

PROMPTS = [
    "Hello world, the quick brown fox",
    "今天天气很好。 def f(x):\n    return x 🙂",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "Numbers 1234 and   spaces\n\n",
]


def llama_cpp(node_modules: str, script: str, path: str, prompt: str) -> dict:
    env = {**os.environ, "NODE_PATH": node_modules}
    proc = subprocess.run(
        ["node", script, path, prompt], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower() or "FAILED" in line]
    raise RuntimeError(errors[-1] if errors else f"node exited with {proc.returncode}")


def main() -> int:
    import torch

    from tessera.engine.compare import teacher_forced_logits
    from tessera.engine.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-modules", required=True, help="node_modules folder holding @fugood/llama.node")
    parser.add_argument("gguf", nargs="+")
    args = parser.parse_args()
    status = 0
    with tempfile.NamedTemporaryFile("w", suffix=".js", delete=False) as f:
        f.write(NODE_SCRIPT)
        script = f.name
    try:
        for path in args.gguf:
            tok = Tokenizer.from_path(path)
            worst, same_tokens = 0.0, True
            try:
                for prompt in PROMPTS:
                    got = llama_cpp(args.node_modules, script, path, prompt)
                    ids = tok.encode(prompt)
                    same_tokens &= got["tokens"] == ids
                    logits = teacher_forced_logits(path, ids, "Torch")  # [T, V]: the pure-torch engine, as measured
                    p = torch.softmax(logits[-1].double(), -1)  # [V]
                    top = torch.topk(p, len(got["probs"]))
                    worst = max(worst, *(abs(e["prob"] / float(v) - 1) for e, v in zip(got["probs"], top.values)))
            except RuntimeError as e:
                print(f"{path}: llama.cpp refused it: {e}")
                status = 1
                continue
            status |= 0 if same_tokens else 1
            print(
                f"{path}: loads in llama.cpp; tokenization {'identical' if same_tokens else 'DIFFERENT'}; "
                f"max |p_llama.cpp / p_tessera - 1| over the top-5 next tokens of {len(PROMPTS)} prompts = {worst:.2e}"
            )
    finally:
        os.unlink(script)
    return status


if __name__ == "__main__":
    sys.exit(main())
