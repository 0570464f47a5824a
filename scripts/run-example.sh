#!/usr/bin/env bash
# The main job on a bundled example: import the model description, lower
# every fully_shard unit into verified Megatron-FSDP packed layouts, print the
# lowered IR and where each parameter lives, and write the layout JSON, the
# layout picture and the per-rank checkpoint plans.
#
# usage: scripts/run-example.sh [MODEL.json] [--mesh NAME=SIZE,...] [--placements ...]
#   default MODEL: examples/worked-example.json; outputs go to out/<model>/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"

MODEL="$ROOT/examples/worked-example.json"
if [[ $# -gt 0 && "$1" != --* ]]; then
  MODEL="$1"
  shift
fi
[[ -f "$MODEL" ]] || { echo "run-example: no such model description: $MODEL" >&2; exit 2; }

"$ROOT/scripts/setup.sh"
ninja -C "$BUILD" -j"${FSDP_JOBS:-2}" fsdp-opt fsdp-translate

NAME="$(basename "$MODEL" .json)"
OUT="$ROOT/out/$NAME"
mkdir -p "$OUT"
BIN="$BUILD/bin"

echo "== import $MODEL $*"
"$BIN/fsdp-translate" --import-model-json "$MODEL" "$@" -o "$OUT/model.mlir"
echo "== lower (fsdp-opt --fsdp-lower-fully-shard)"
"$BIN/fsdp-opt" "$OUT/model.mlir" \
  --fsdp-lower-fully-shard=report-canonical-mismatch \
  -o "$OUT/lowered.mlir" 2> "$OUT/remarks.txt"
"$BIN/fsdp-translate" --emit-layout-json "$OUT/lowered.mlir" -o "$OUT/layout.json"
echo "== plan (fsdp-translate --emit-checkpoint-plan)"
"$BIN/fsdp-translate" --emit-checkpoint-plan "$OUT/lowered.mlir" -o "$OUT/model.fsdpplan"
"$BIN/fsdp-translate" --emit-layout-svg "$OUT/lowered.mlir" -o "$OUT/layout.svg"

if [[ $(wc -c < "$OUT/lowered.mlir") -lt 20000 ]]; then
  cat "$OUT/lowered.mlir"
else
  echo "(lowered IR is $(wc -c < "$OUT/lowered.mlir") bytes: see $OUT/lowered.mlir)"
fi
python3 - "$OUT/layout.json" "$OUT/remarks.txt" <<'PY'
import json, sys
layout = json.load(open(sys.argv[1]))
mesh = " x ".join(f"{a['name']}={a['size']}" for a in layout["mesh"])
groups = layout["groups"]
params = sum(len(g["params"]) for g in groups)
print(f"\nmesh {mesh}: {len(groups)} parameter groups, {params} tensors")
for g in groups[:4]:
    print(f"  unit {g['unit'] or '(root)'!r} {g['dtype']}: chunk {g['chunk']}, "
          f"{g['size']} elements, {g['shard_size']} per rank")
    for p in g["params"][:6]:
        rows = ", ".join(f"r{c['rank']}:{c['row_offset']}+{c['rows']}" for c in p["chunks"][:8])
        more = " ..." if len(p["chunks"]) > 8 else ""
        print(f"    {p['fqn']} {p['shape']} @ {p['offset']}: rows {rows}{more}")
if len(groups) > 4:
    print(f"  ... {len(groups) - 4} more groups")
mismatched = sum(1 for line in open(sys.argv[2]) if "remark:" in line)
print(f"\n{mismatched} tensors are not where canonical Shard(0) assumes: a "
      "checkpointer that ignores the packed layout would corrupt them silently.")
PY
echo "checkpoint plan: $OUT/model.fsdpplan ($(wc -c < "$OUT/model.fsdpplan") bytes)"
echo "outputs in $OUT: model.mlir lowered.mlir layout.json remarks.txt model.fsdpplan$([[ -f $OUT/layout.svg ]] && echo ' layout.svg')"
