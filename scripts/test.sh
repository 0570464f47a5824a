#!/usr/bin/env bash
# Builds everything and runs every test (lit tests and GoogleTest unit tests,
# the latter through lit), then prints one line "N passed, N failed".
# Exits non-zero on any failure. Usage: scripts/test.sh [lit args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"

"$ROOT/scripts/setup.sh"
ninja -C "$BUILD" -j"${FSDP_JOBS:-2}" all mlir-doc

RESULTS="$BUILD/test-results.xml"
rm -f "$RESULTS"
status=0
# Python with torch, safetensors and transformers from PyPI, in a venv under
# ~/.cache (made once, reused): the lit tests that read our output with them
# (REQUIRES: torch-venv) and the Python package's tests use it. FSDP_PYTHON=0
# skips both (those lit tests then report unsupported).
if [[ "${FSDP_PYTHON:-1}" != 0 ]]; then
  if FSDP_VENV_PYTHON="$("$ROOT/scripts/python-tests.sh" --env-only)"; then
    export FSDP_VENV_PYTHON
  else
    echo "test.sh: no Python environment: its tests fail or report unsupported" >&2
    status=1
  fi
fi
/usr/lib/llvm-22/bin/lit -sv --xunit-xml-output "$RESULTS" "$@" "$BUILD/test" || status=$?
# The runtime's tests again with one worker thread per rank (the first pass
# ran the default, several): every save, load, fault and kill test passes
# through the executor both ways.
ONE_THREAD="$BUILD/test-results-1-thread.xml"
rm -f "$ONE_THREAD"
FSDP_THREADS=1 /usr/lib/llvm-22/bin/lit -sv --xunit-xml-output "$ONE_THREAD" "$@" \
  "$BUILD/test/Tools/fsdp-ckpt" "$BUILD/test/Runtime" || status=1
# The Python package (python/): built into a venv under ~/.cache with
# torch from PyPI and tested with pytest (FSDP_PYTHON=0 skips it).
PYTHON_ARGS=()
if [[ "${FSDP_PYTHON:-1}" != 0 ]]; then
  PYTHON_RESULTS="$BUILD/python-results.xml"
  rm -f "$PYTHON_RESULTS"
  "$ROOT/scripts/python-tests.sh" --junitxml "$PYTHON_RESULTS" || status=1
  PYTHON_ARGS=("$PYTHON_RESULTS")
fi
# The fuzzers, briefly (FSDP_FUZZ_SECONDS each; longer by hand with
# scripts/fuzz.sh): each counts as one test.
FUZZ_RESULTS="${FSDP_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}/fuzz/results.txt"
rm -f "$FUZZ_RESULTS"
FUZZ_ARGS=()
if [[ "${FSDP_FUZZ_SECONDS:-10}" != 0 ]]; then
  "$ROOT/scripts/fuzz.sh" "${FSDP_FUZZ_SECONDS:-10}" || status=1
  FUZZ_ARGS=("$FUZZ_RESULTS")
fi
# The runtime and its tests under ASan + UBSan (FSDP_ASAN=0 skips it).
ASAN_ARGS=()
if [[ "${FSDP_ASAN:-1}" != 0 ]]; then
  ASAN_RESULTS="${FSDP_ASAN_BUILD_DIR:-$ROOT/build-asan}/results"
  rm -rf "$ASAN_RESULTS"
  "$ROOT/scripts/asan.sh" || status=1
  ASAN_ARGS=("$ASAN_RESULTS"/*.xml "$ASAN_RESULTS/roundtrip.txt")
  if [[ -f "$ASAN_RESULTS/crashed.txt" ]]; then ASAN_ARGS+=("$ASAN_RESULTS/crashed.txt"); fi
fi
# The threaded tests under ThreadSanitizer (FSDP_TSAN=0 skips it).
TSAN_ARGS=()
if [[ "${FSDP_TSAN:-1}" != 0 ]]; then
  TSAN_RESULTS="${FSDP_TSAN_BUILD_DIR:-$ROOT/build-tsan}/results"
  rm -rf "$TSAN_RESULTS"
  "$ROOT/scripts/tsan.sh" || status=1
  TSAN_ARGS=("$TSAN_RESULTS"/*.xml)
fi
python3 "$ROOT/scripts/summarize_tests.py" "$RESULTS" "$ONE_THREAD" "${PYTHON_ARGS[@]}" \
  "${FUZZ_ARGS[@]}" "${ASAN_ARGS[@]}" "${TSAN_ARGS[@]}" || status=1
exit "$status"
