# Sourced by scripts/setup_env.sh (./run.sh, ./test.sh) and packaging/install.sh: the one place that decides which
# torch build to install, so that a machine without an NVIDIA GPU never downloads PyPI's multi-GB CUDA build.
#
#   choose_torch REQUESTED DEFAULT_SPEC   sets torch_spec, torch_index (empty: pip's configured index) and torch_kind
#
# REQUESTED (TESSERA_TORCH, install.sh --torch) wins as given. Otherwise DEFAULT_SPEC comes from
#   - pip's configured index (PyPI: the CUDA build) when `nvidia-smi -L` answers,
#   - PyTorch's CPU index when there is no working nvidia-smi and that index can be reached,
#   - pip's configured index, with a warning, when the CPU index cannot be reached (offline mirrors, proxies); a mirror
#     that holds a `+cpu` wheel of the same version gives that one, as pip ranks the local version label higher.
# TESSERA_TORCH_CPU_INDEX overrides the CPU index's address (mirrors; the tests point it at a local server).

tessera_cpu_index="${TESSERA_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

torch_index_reachable() {  # torch_index_reachable URL: does URL/torch/ answer within a few seconds?
  "${PYTHON:-python3}" - "$1" <<'PY' >/dev/null 2>&1
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
}

choose_torch() {
  local requested="$1" default_spec="$2"
  if [ -n "$requested" ]; then
    torch_spec="$requested" torch_index="" torch_kind="as requested"
    return
  fi
  torch_spec="$default_spec"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_index="" torch_kind="CUDA build (nvidia-smi found a GPU)"
  elif torch_index_reachable "$tessera_cpu_index"; then
    torch_index="$tessera_cpu_index" torch_kind="CPU build (no working nvidia-smi)"
  else
    torch_index=""
    torch_kind="CPU build wanted (no working nvidia-smi), but $tessera_cpu_index cannot be reached: pip's configured"
    torch_kind="$torch_kind index instead, which may give the CUDA build (several GB); set TESSERA_TORCH to choose"
  fi
}
