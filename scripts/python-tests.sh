#!/usr/bin/env bash
# Builds the Python package (python/, fsdp_mlir) into a virtual environment
# outside the repository and runs its tests with pytest.
#
#   scripts/python-tests.sh [--junitxml FILE] [pytest args...]
#   scripts/python-tests.sh --env-only     (a) alone, then prints the venv's python
#
# (a) makes or reuses $FSDP_PYTHON_VENV (default
#     ~/.cache/fsdp-mlir/venv-torch-2.15.0) with torch==2.15.0 and the test
#     requirements from PyPI, installing only when the list changed;
# (b) pip-installs ./python into it (every run, so the extension matches the
#     tree; the CMake build directory persists in build-python/, so a rerun
#     rebuilds only what changed);
# (c) puts the compiler's tools (build/bin: fsdp-translate, fsdp-opt,
#     fsdp-ckpt) on PATH for fm.compile;
# (d) runs pytest on python/tests, writing JUnit XML when asked.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"
TORCH_VERSION=2.15.0
VENV="${FSDP_PYTHON_VENV:-$HOME/.cache/fsdp-mlir/venv-torch-$TORCH_VERSION}"
PYTHON="${FSDP_PYTHON_BIN:-python3}"
# The test environment; the build requirements match python/pyproject.toml's.
REQUIREMENTS=("torch==$TORCH_VERSION" numpy pytest safetensors transformers tqdm
              "nanobind==2.12.0" "scikit-build-core==0.11.6")
# Megatron-FSDP itself (pure Python), for the test that packs a model with it:
# without its dependencies, which pin other torch versions.
NO_DEPS=("megatron-fsdp==0.6.1" einops)

PYTEST_ARGS=()
PATHS=(tests) # python/tests unless test paths are given
ENV_ONLY=0
while (($#)); do
  case "$1" in
    --env-only) ENV_ONLY=1; shift ;;
    --junitxml) PYTEST_ARGS+=("--junitxml=$(realpath -m "$2")"); shift 2 ;;
    -*) PYTEST_ARGS+=("$1"); shift ;;
    *) [[ "${PATHS[0]}" == tests && ${#PATHS[@]} == 1 && -z "${GIVEN:-}" ]] && PATHS=()
       GIVEN=1; PATHS+=("$1"); shift ;;
  esac
done

# (a) The virtual environment, reused when it holds the requirements.
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "python-tests: creating $VENV" >&2
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.fsdp-mlir-requirements"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "${REQUIREMENTS[*]} ${NO_DEPS[*]}" ]]; then
  echo "python-tests: installing ${REQUIREMENTS[*]} ${NO_DEPS[*]} into $VENV" >&2
  "$VENV/bin/python" -m pip install -q "${REQUIREMENTS[@]}" >&2
  "$VENV/bin/python" -m pip install -q --no-deps "${NO_DEPS[@]}" >&2
  echo "${REQUIREMENTS[*]} ${NO_DEPS[*]}" >"$STAMP"
fi
if [[ "$ENV_ONLY" == 1 ]]; then
  echo "$VENV/bin/python"
  exit 0
fi

# (b) The package, built against this tree (no build isolation: the venv
# has the pinned build requirements, and no index is needed).
echo "python-tests: pip install ./python"
mkdir -p "$ROOT/build-python"
if ! CMAKE_BUILD_PARALLEL_LEVEL="${FSDP_JOBS:-2}" "$VENV/bin/python" -m pip install -q \
     --no-build-isolation --no-deps --force-reinstall \
     --config-settings=build-dir="$ROOT/build-python/{wheel_tag}" "$ROOT/python" >"$ROOT/build-python/pip-install.log" 2>&1; then
  tail -n 60 "$ROOT/build-python/pip-install.log" >&2
  echo "python-tests: pip install ./python failed (log: build-python/pip-install.log)" >&2
  exit 1
fi

# (c) The tools fm.compile runs.
export PATH="$BUILD/bin:$PATH"
for tool in fsdp-translate fsdp-opt fsdp-ckpt; do
  [[ -x "$BUILD/bin/$tool" ]] || echo "python-tests: warning: $BUILD/bin/$tool is missing" >&2
done

# (d) The tests, from python/ so that `import fsdp_mlir` is the installed
# package (python/src is not on the path).
cd "$ROOT/python"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q "${PYTEST_ARGS[@]}" "${PATHS[@]}"
