#!/usr/bin/env bash
# Builds the runtime (with the layout, format and plan libraries it uses),
# its unit tests and fsdp-ckpt with ASan + UBSan in a separate tree, runs
# the unit tests (GoogleTest XML into <tree>/results/) and a save/load round
# trip under mpirun with the instrumented fsdp-ckpt.
#   scripts/asan.sh
# Environment: FSDP_ASAN_BUILD_DIR (default <repo>/build-asan).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_ASAN_BUILD_DIR:-$ROOT/build-asan}"
MAIN_BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug \
  -DFSDP_BUILD_COMPILER=OFF -DFSDP_ENABLE_CUDA=OFF -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
TESTS=(FSDPLayoutTests FSDPFormatTests FSDPPlanTests FSDPRuntimeTests)
ninja -C "$BUILD" -j"${FSDP_JOBS:-2}" "${TESTS[@]}" fsdp-ckpt

RESULTS="$BUILD/results"
rm -rf "$RESULTS" && mkdir -p "$RESULTS"
# MPI's own allocations are not ours to report.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1"
status=0
for test in "${TESTS[@]}"; do
  echo "asan.sh: $test"
  "$BUILD/unittests/$test" --gtest_output="xml:$RESULTS/$test.xml" > "$RESULTS/$test.log" 2>&1 \
    || { echo "asan.sh: $test FAILED"; tail -30 "$RESULTS/$test.log"; status=1
         # A binary the sanitizer stopped wrote no XML: counted as one failed test.
         if [[ ! -f "$RESULTS/$test.xml" ]]; then echo "$test fail" >> "$RESULTS/crashed.txt"; fi; }
done

# A save on 4 ranks and a reshard-load into 2 with the instrumented runtime
# (plans from the main build's compiler).
WORK="$BUILD/roundtrip"
rm -rf "$WORK" && mkdir -p "$WORK"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS -x UBSAN_OPTIONS)
roundtrip() {
  for n in 4 2; do
    "$MAIN_BUILD/bin/fsdp-translate" --import-model-json "$ROOT/examples/llama-tiny.json" --mesh "dp=$n" |
      "$MAIN_BUILD/bin/fsdp-opt" --fsdp-lower-fully-shard |
      "$MAIN_BUILD/bin/fsdp-translate" --emit-checkpoint-plan -o "$WORK/plan$n" || return 1
  done
  "${MPIRUN[@]}" -np 4 "$BUILD/bin/fsdp-ckpt" save --plan "$WORK/plan4" --dir "$WORK/ckpt" --fill 5 &&
    "$BUILD/bin/fsdp-ckpt" verify "$WORK/ckpt" &&
    "${MPIRUN[@]}" -np 2 "$BUILD/bin/fsdp-ckpt" load --plan "$WORK/plan2" --dir "$WORK/ckpt" --check 5 ||
    return 1
  # The reader on what PyTorch wrote (no index: zip CRCs), oldest and newest.
  local fixture
  for fixture in "$ROOT"/test/Inputs/torch-2.4.1-ws2 "$ROOT"/test/Inputs/torch-2.15.0-ws2; do
    "$BUILD/bin/fsdp-ckpt" verify "$fixture/checkpoint" &&
      "$BUILD/bin/fsdp-ckpt" inspect --json "$fixture/checkpoint" > /dev/null &&
      "$MAIN_BUILD/bin/fsdp-translate" --import-model-json "$fixture/model.json" --mesh dp=2 |
      "$MAIN_BUILD/bin/fsdp-opt" --fsdp-lower-fully-shard |
        "$MAIN_BUILD/bin/fsdp-translate" --emit-checkpoint-plan -o "$WORK/torch-plan" &&
      rm -rf "$WORK/torch-out" &&
      "${MPIRUN[@]}" -np 2 "$BUILD/bin/fsdp-ckpt" reshard --plan "$WORK/torch-plan" \
        --from "$fixture/checkpoint" --to "$WORK/torch-out" --allow-extra &&
      "$BUILD/bin/fsdp-ckpt" verify "$WORK/torch-out" || return 1
  done
}
if roundtrip > "$RESULTS/roundtrip.log" 2>&1; then
  echo "asan-roundtrip pass" > "$RESULTS/roundtrip.txt"
else
  echo "asan.sh: save/load round trip FAILED"; tail -30 "$RESULTS/roundtrip.log"
  echo "asan-roundtrip fail" > "$RESULTS/roundtrip.txt"
  status=1
fi
exit $status
