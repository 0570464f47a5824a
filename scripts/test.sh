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
/usr/lib/llvm-22/bin/lit -sv --xunit-xml-output "$RESULTS" "$@" "$BUILD/test" || status=$?
python3 "$ROOT/scripts/summarize_tests.py" "$RESULTS" || status=1
exit "$status"
