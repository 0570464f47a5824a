#!/usr/bin/env bash
# Regenerates the dialect and pass reference from TableGen into docs/
# (test/Docs checks that the committed copies are current).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh"
ninja -C "$BUILD" mlir-doc
mkdir -p "$ROOT/docs/Dialects"
cp "$BUILD/docs/Dialects/FSDPDialect.md" "$ROOT/docs/Dialects/FSDPDialect.md"
cp "$BUILD/docs/FSDPPasses.md" "$ROOT/docs/FSDPPasses.md"
echo "docs updated: docs/Dialects/FSDPDialect.md docs/FSDPPasses.md"
