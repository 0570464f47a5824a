#!/usr/bin/env bash
# The main job: the whole pipeline on a bundled example.
#
#   scripts/run-example.sh                 examples/llama-1gb.json (a ~1 GB checkpoint): import,
#                                          lower for 4 ranks, emit the plans, save on 4 ranks
#                                          (mpirun), reshard-load into 2 ranks of another layout,
#                                          check every value, print throughput
#   scripts/run-example.sh --compile MODEL.json [--mesh ...] [--placements ...]
#                                          the compiler alone: lowered IR, layout JSON and SVG,
#                                          the ranks' pieces, the plans
# Outputs go to out/<model>/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"

"$ROOT/scripts/setup.sh"
ninja -C "$BUILD" -j"${FSDP_JOBS:-2}" fsdp-opt fsdp-translate fsdp-ckpt
BIN="$BUILD/bin"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)

compile() { # MODEL OUT [import options...]
  local model="$1" out="$2"
  shift 2
  mkdir -p "$out"
  echo "== import $model $*"
  "$BIN/fsdp-translate" --import-model-json "$model" "$@" -o "$out/model.mlir"
  echo "== lower (fsdp-opt --fsdp-lower-fully-shard)"
  "$BIN/fsdp-opt" "$out/model.mlir" --fsdp-lower-fully-shard=report-canonical-mismatch \
    -o "$out/lowered.mlir" 2> "$out/remarks.txt"
  "$BIN/fsdp-translate" --emit-layout-json "$out/lowered.mlir" -o "$out/layout.json"
  "$BIN/fsdp-translate" --emit-layout-svg "$out/lowered.mlir" -o "$out/layout.svg"
  echo "== plan (fsdp-translate --emit-checkpoint-plan)"
  "$BIN/fsdp-translate" --emit-checkpoint-plan "$out/lowered.mlir" -o "$out/model.fsdpplan"
}

summarize() { # OUT
  python3 - "$1/layout.json" "$1/remarks.txt" <<'PY'
import json, sys
layout = json.load(open(sys.argv[1]))
mesh = " x ".join(f"{a['name']}={a['size']}" for a in layout["mesh"])
groups = layout["groups"]
params = sum(len(g["params"]) for g in groups)
print(f"mesh {mesh}: {len(groups)} parameter groups, {params} tensors")
for g in groups[:3]:
    print(f"  unit {g['unit'] or '(root)'!r} {g['dtype']}: chunk {g['chunk']}, "
          f"{g['size']} elements, {g['shard_size']} per rank")
    for p in g["params"][:4]:
        rows = ", ".join(f"r{c['rank']}:{c['row_offset']}+{c['rows']}" for c in p["chunks"][:8])
        print(f"    {p['fqn']} {p['shape']} @ {p['offset']}: rows {rows}")
if len(groups) > 3:
    print(f"  ... {len(groups) - 3} more groups")
mismatched = sum(1 for line in open(sys.argv[2]) if "remark:" in line)
print(f"{mismatched} tensors are not where canonical Shard(0) assumes: a checkpointer that "
      "ignores the packed layout would corrupt them silently.")
PY
}

if [[ "${1:-}" == "--compile" ]]; then
  shift
  MODEL="${1:?usage: scripts/run-example.sh --compile MODEL.json [import options]}"
  shift
  OUT="$ROOT/out/$(basename "$MODEL" .json)"
  compile "$MODEL" "$OUT" "$@"
  if [[ $(wc -c < "$OUT/lowered.mlir") -lt 20000 ]]; then cat "$OUT/lowered.mlir"; fi
  summarize "$OUT"
  echo "outputs in $OUT"
  exit 0
fi

MODEL="$ROOT/examples/llama-1gb.json"
OUT="$ROOT/out/llama-1gb"
rm -rf "$OUT"
compile "$MODEL" "$OUT/save4" --mesh dp=4
summarize "$OUT/save4"
echo "== the same model lowered for 2 ranks: another layout to load into"
compile "$MODEL" "$OUT/load2" --mesh dp=2 > /dev/null

SEED=20261129
echo "== save on 4 ranks (mpirun -np 4 fsdp-ckpt save --fill $SEED)"
"${MPIRUN[@]}" -np 4 "$BIN/fsdp-ckpt" save --plan "$OUT/save4/model.fsdpplan" \
  --dir "$OUT/checkpoint" --fill "$SEED"
echo "== verify every byte"
"$BIN/fsdp-ckpt" verify "$OUT/checkpoint"
echo "== load into 2 ranks of another layout, check every value"
"${MPIRUN[@]}" -np 2 "$BIN/fsdp-ckpt" load --plan "$OUT/load2/model.fsdpplan" \
  --dir "$OUT/checkpoint" --check "$SEED"
# The first lines of the listing. Captured first: `inspect | head` would end
# inspect with SIGPIPE once head has its lines, failing the job (pipefail).
INSPECT="$("$BIN/fsdp-ckpt" inspect "$OUT/checkpoint")"
head -n 6 <<< "$INSPECT"
echo "outputs in $OUT (checkpoint: $(du -sh "$OUT/checkpoint" | cut -f1))"
