#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in a separate tree
# and runs each for the given number of seconds (default 30), seeded from the
# real PyTorch checkpoint in test/Inputs. Crashes land in the build tree's
# fuzz/ folder (crash-*, leak-*, timeout-*, oom-*) and fail the script; copy
# one into fuzz/regressions/<fuzzer>/ (after the fix) and every run replays it.
#   scripts/fuzz.sh [seconds]
# Environment: FSDP_FUZZ_BUILD_DIR (default <repo>/build-fuzz),
#              FSDP_FUZZ_CXX / FSDP_FUZZ_CC (default /usr/bin/clang++, clang).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${1:-30}"
BUILD="${FSDP_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
CXX="${FSDP_FUZZ_CXX:-/usr/bin/clang++}"
CC="${FSDP_FUZZ_CC:-/usr/bin/clang}"
FIXTURE="$ROOT/test/Inputs/torch-fsdp2-ws2/checkpoint"

cmake -G Ninja -S "$ROOT" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_COMPILER="$CC" \
  -DFSDP_BUILD_COMPILER=OFF -DFSDP_BUILD_TESTS=OFF -DFSDP_BUILD_FUZZERS=ON -DFSDP_ENABLE_CUDA=OFF >/dev/null
ninja -C "$BUILD" FuzzPickle FuzzZip FuzzPlan FuzzCheckpoint FuzzChunkIndex FuzzSafetensors \
  MakePlanSeed MakeSafetensorsSeed

# Seeds: .metadata and every item's data.pkl for the unpickler; every item
# (its byte range of a data file) and whole data files for the zip reader;
# a file of layoutFile's, its header and data, a shard index for safetensors.
SEEDS="$BUILD/fuzz/seeds"
rm -rf "$SEEDS"
mkdir -p "$SEEDS/pickle" "$SEEDS/zip" "$SEEDS/plan" "$SEEDS/checkpoint" "$SEEDS/safetensors"
"$BUILD/fuzz/MakePlanSeed" "$SEEDS/plan/worked-example.fsdpplan"
"$BUILD/fuzz/MakeSafetensorsSeed" "$SEEDS/safetensors"
python3 - "$FIXTURE" "$SEEDS" <<'PY'
import io, os, sys, zipfile
fixture, seeds = sys.argv[1], sys.argv[2]
open(os.path.join(seeds, "pickle", "metadata"), "wb").write(
    open(os.path.join(fixture, ".metadata"), "rb").read())
n = 0
for name in sorted(os.listdir(fixture)):
    if not name.endswith(".distcp"):
        continue
    data = open(os.path.join(fixture, name), "rb").read()
    open(os.path.join(seeds, "zip", name), "wb").write(data)
    start = 0
    while True:  # items end with an end-of-central-directory record, no comment
        end = data.find(b"PK\x05\x06", start)
        if end < 0:
            break
        item = data[start:end + 22]
        open(os.path.join(seeds, "zip", f"item{n}"), "wb").write(item)
        pkl = zipfile.ZipFile(io.BytesIO(item)).read("archive/data.pkl")
        open(os.path.join(seeds, "pickle", f"data{n}.pkl"), "wb").write(pkl)
        n, start = n + 1, end + 22
print(f"fuzz.sh: {n} items seeded")
PY
# Whole directories (FuzzCheckpoint's layout: u32 metadata length, u32 index
# length or 0xFFFFFFFF, metadata, index, __0_0.distcp): each PyTorch
# version's fixture, and one checkpoint of ours with its index.
OURS="$BUILD/fuzz/seed-ours"
rm -rf "$OURS" "$OURS.plan"
if [[ -x "$ROOT/build/bin/fsdp-ckpt" && -x "$ROOT/build/bin/fsdp-translate" ]]; then
  "$ROOT/build/bin/fsdp-translate" --import-model-json "$ROOT/examples/worked-example.json" --mesh dp=1 |
    "$ROOT/build/bin/fsdp-opt" --fsdp-lower-fully-shard |
    "$ROOT/build/bin/fsdp-translate" --emit-checkpoint-plan -o "$OURS.plan"
  "$ROOT/build/bin/fsdp-ckpt" save --plan "$OURS.plan" --dir "$OURS" --fill 1 >/dev/null
fi
python3 - "$SEEDS/checkpoint" "$OURS" "$ROOT"/test/Inputs/torch-*/checkpoint <<'PY'
import os, struct, sys
out, dirs = sys.argv[1], sys.argv[2:]
for n, d in enumerate(dirs):
    if not os.path.isdir(d):
        continue
    read = lambda name: open(os.path.join(d, name), "rb").read()
    index = read(".fsdp-index") if os.path.exists(os.path.join(d, ".fsdp-index")) else None
    metadata = read(".metadata")
    head = struct.pack("<II", len(metadata), 0xFFFFFFFF if index is None else len(index))
    open(os.path.join(out, f"dir{n}"), "wb").write(
        head + metadata + (index or b"") + read("__0_0.distcp"))
PY

status=0
RESULTS="$BUILD/fuzz/results.txt"
: > "$RESULTS"
for fuzzer in FuzzPickle FuzzZip FuzzPlan FuzzCheckpoint FuzzChunkIndex FuzzSafetensors; do
  seeds="$SEEDS/pickle"
  [[ $fuzzer == FuzzCheckpoint ]] && seeds="$SEEDS/checkpoint"
  [[ $fuzzer == FuzzZip ]] && seeds="$SEEDS/zip"
  [[ $fuzzer == FuzzPlan ]] && seeds="$SEEDS/plan"
  [[ $fuzzer == FuzzSafetensors ]] && seeds="$SEEDS/safetensors"
  corpus="$BUILD/fuzz/corpus-$fuzzer"
  mkdir -p "$corpus"
  # Inputs that once failed (fuzz/regressions/<fuzzer>/) run first, each once.
  regressions=("$ROOT/fuzz/regressions/$fuzzer"/*)
  if [[ -e "${regressions[0]}" ]]; then
    if ! (cd "$BUILD/fuzz" && "./$fuzzer" "${regressions[@]}" > "$fuzzer.regressions.log" 2>&1); then
      echo "fuzz.sh: $fuzzer FAILED on a regression input (see $BUILD/fuzz/$fuzzer.regressions.log)"
      tail -20 "$BUILD/fuzz/$fuzzer.regressions.log"
      echo "$fuzzer fail" >> "$RESULTS"
      status=1
      continue
    fi
    echo "fuzz.sh: $fuzzer: ${#regressions[@]} regression inputs pass"
  fi
  echo "fuzz.sh: running $fuzzer for ${SECONDS_EACH}s"
  if ! (cd "$BUILD/fuzz" && "./$fuzzer" -max_total_time="$SECONDS_EACH" -timeout=10 \
          -rss_limit_mb=2048 -max_len=262144 -print_final_stats=1 "$corpus" "$seeds" \
          > "$fuzzer.log" 2>&1); then
    echo "fuzz.sh: $fuzzer FAILED (see $BUILD/fuzz/$fuzzer.log)"
    tail -40 "$BUILD/fuzz/$fuzzer.log"
    echo "$fuzzer fail" >> "$RESULTS"
    status=1
  else
    grep -E "^stat::(number_of_executed_units|peak_rss_mb|new_units_added)" \
      "$BUILD/fuzz/$fuzzer.log" | sed "s/^/fuzz.sh: $fuzzer /"
    grep -E "cov: [0-9]+" "$BUILD/fuzz/$fuzzer.log" | tail -1 | sed "s/^/fuzz.sh: $fuzzer /"
    echo "$fuzzer pass" >> "$RESULTS"
  fi
done
exit $status
