#!/usr/bin/env bash
# One short, prepared check for a machine with a CUDA GPU (and possibly AMX), in under 8 minutes:
#   1. build Tessera (native kernels) into the machine's Python;
#   2. run the CUDA-path and hybrid tests (they use the GPU when torch.cuda.is_available()), and the native kernel
#      tests, which run the real AMX kernels against the emulator when the CPU reports amx_tile and Linux grants it;
#   3. benchmark decode tok/s on a 4-layer Qwen3-30B-A3B-shaped model with the hot-expert cache at 0 %, 25 % and
#      100 % of the experts, attention etc. on the GPU.
# Results go to $OUT (default ./device_check_out): machine.txt, build.log, tests.log, bench-*.json, summary.txt.
# Usage: scripts/device_check.sh            (PYTHON=python3 by default; needs torch with CUDA already installed)
# Python packages the machine lacks (gguf, platformdirs, ...) can be carried as wheels in ./.whl (see docs/HYBRID.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

{ date -u; nvidia-smi || true; lscpu || true; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u || true
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
} > "$OUT/machine.txt" 2>&1
summary "machine: $(grep -m1 'Model name' "$OUT/machine.txt" | sed 's/.*: *//'); $(tail -1 "$OUT/machine.txt")"

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/tessera-site .whl/*.whl >>"$OUT/build.log" 2>&1
  export PYTHONPATH="/tmp/tessera-site${PYTHONPATH:+:$PYTHONPATH}"
fi

start=$(date +%s)
if ! timeout 240 "$PY" -m pip install -q --no-deps --no-build-isolation -e . >>"$OUT/build.log" 2>&1; then
  summary "build: FAILED (see build.log)"; exit 1
fi
summary "build: ok in $(( $(date +%s) - start )) s"

timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/hybrid tests/native -x >"$OUT/tests.log" 2>&1
summary "tests (hybrid + native, exit $?): $(tail -1 "$OUT/tests.log")"
"$PY" - >>"$OUT/summary.txt" 2>&1 <<'EOF'
from tessera.engine import native
st = native.backend_status()
print("backends:", ", ".join(f"{k}={'yes' if v[0] else 'no (' + v[1] + ')'}" for k, v in st.items()))
EOF

MODEL=/tmp/tessera-30b-4l.gguf
[ -f "$MODEL" ] || timeout 180 "$PY" -m tessera.engine make-model "$MODEL" --preset qwen3-30b-a3b --layers 4 --dtype bf16 \
  --format gguf >>"$OUT/build.log" 2>&1 || { summary "make-model: FAILED"; exit 1; }
for n in 0 32 128; do  # of 128 experts per layer: 0 %, 25 %, 100 %
  timeout 100 "$PY" -m tessera.engine bench "$MODEL" --device cuda --gpu-experts "$n" --prompt-tokens 128 --gen-tokens 32 \
    --json >"$OUT/bench-gpu-experts-$n.json" 2>>"$OUT/bench.log"
  summary "decode with $n/128 experts per layer on the GPU (exit $?): $(cat "$OUT/bench-gpu-experts-$n.json")"
done
timeout 100 "$PY" -m tessera.engine bench "$MODEL" --prompt-tokens 128 --gen-tokens 32 --json >"$OUT/bench-cpu-only.json" \
  2>>"$OUT/bench.log"
summary "all on the CPU (exit $?): $(cat "$OUT/bench-cpu-only.json")"
