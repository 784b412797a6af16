#!/usr/bin/env bash
# Build the native C++ tests (native/tests: every backend vs the Reference, pool, headers, AMX emulator) with
# -fsanitize=address,undefined and run them. Standalone CMake build of native/ (no Python), into build/sanitize.
# Usage: scripts/sanitize_native.sh            (CI: tests/native/test_sanitize.py runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${TESSERA_SANITIZE_BUILD:-build/sanitize}"
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
cmake -S native -B "$BUILD" "${GEN[@]}" -DTESSERA_SANITIZE=ON -DTESSERA_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target tessera_native_tests
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
exec "$BUILD/tessera_native_tests"
