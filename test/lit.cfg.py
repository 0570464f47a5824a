# -*- Python -*-
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "FSDP"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.fsdp_obj_root, "test")
# Unit/ is its own suite (GoogleTest format); Inputs/ hold test data.
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%fsdp_src_root", config.fsdp_src_root))
config.substitutions.append(("%fsdp_obj_root", config.fsdp_obj_root))
config.substitutions.append(("%examples", os.path.join(config.fsdp_src_root, "examples")))
# One process per rank, as root in CI, more ranks than cores.
config.substitutions.append(("%mpirun", "mpirun --allow-run-as-root --oversubscribe"))
config.environment["OMPI_MCA_btl"] = "self,vader,tcp"
config.environment["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"

llvm_config.use_default_substitutions()
llvm_config.with_system_environment(["HOME", "TMPDIR", "FSDP_THREADS"])
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
# Captured names must not leak across CHECK-LABEL blocks.
config.environment["FILECHECK_OPTS"] = "-enable-var-scope"

tools = ["fsdp-opt", "fsdp-translate", "fsdp-ckpt", "fsdp-c-api-roundtrip", "fsdp-mpi-subcomm"]
llvm_config.add_tool_substitutions(tools, [config.fsdp_tools_dir, config.llvm_tools_dir])
# The benchmark programs, unless FSDP_BUILD_BENCH is off: `REQUIRES: bench`.
if os.access(os.path.join(config.fsdp_tools_dir, "fsdp-bench-memcpy-xxh3"), os.X_OK):
    config.available_features.add("bench")
    llvm_config.add_tool_substitutions(["fsdp-bench-memcpy-xxh3", "fsdp-bench-direct-io"],
                                       [config.fsdp_tools_dir])

# Python with torch, safetensors and transformers from PyPI (scripts/python-env.sh
# makes it, cached under ~/.cache): FSDP_VENV_PYTHON names its interpreter. Tests
# that need it say `REQUIRES: torch-venv` and are reported unsupported (not passed)
# without it.
venv_python = os.environ.get("FSDP_VENV_PYTHON", "")
if venv_python and os.access(venv_python, os.X_OK):
    config.available_features.add("torch-venv")
    config.substitutions.append(("%venv_python", venv_python))
config.substitutions.append(("%scripts", os.path.join(config.fsdp_src_root, "scripts")))
