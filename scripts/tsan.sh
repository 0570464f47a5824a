#!/usr/bin/env bash
# Builds the runtime and its unit tests with ThreadSanitizer in a separate
# tree and runs the tests that use threads (ranks as threads in one process:
# the protocol, communicators, multi-rank save/load), GoogleTest XML into
# <tree>/results/.
#   scripts/tsan.sh
# Environment: FSDP_TSAN_BUILD_DIR (default <repo>/build-tsan).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_TSAN_BUILD_DIR:-$ROOT/build-tsan}"
FLAGS="-fsanitize=thread -fno-omit-frame-pointer"

cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFSDP_BUILD_COMPILER=OFF -DFSDP_ENABLE_CUDA=OFF -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
ninja -C "$BUILD" -j"${FSDP_JOBS:-2}" FSDPRuntimeTests

RESULTS="$BUILD/results"
rm -rf "$RESULTS" && mkdir -p "$RESULTS"
# halt_on_error: a race fails the run, not just a line in the log.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
echo "tsan: FSDPRuntimeTests, the threaded tests (ranks as threads, worker threads per rank)"
if ! "$BUILD/unittests/FSDPRuntimeTests" --gtest_filter='Protocol*:Communicators*:MultiRank*:SimulatedDevice.SaveLoad*:SimulatedDevice.Copies*:SimulatedDevice.Large*:SimulatedDevice.Loads*:BandStaging*:StagingPool*:AsyncSave*:SaveBlocks*:ReplacedRemoval*:ReplicaGroups*:CommunicatorDataPlane*:ReplicaLoads*:Pinning*:WriteQueue*:DirectReads*' \
      --gtest_output="xml:$RESULTS/FSDPRuntimeTests-tsan.xml" > "$RESULTS/tsan.log" 2>&1; then
  echo "tsan: FAILED"
  tail -40 "$RESULTS/tsan.log"
  exit 1
fi
echo "tsan: clean ($(grep -c '^\[       OK \]' "$RESULTS/tsan.log") tests)"
