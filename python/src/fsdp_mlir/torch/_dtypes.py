"""dtype names: torch.dtype <-> the model description's short names (fsdp-model-v1)."""

from __future__ import annotations

import torch

_TORCH_TO_SHORT = {
    torch.float64: "f64", torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool",
}
_SHORT_TO_TORCH = {v: k for k, v in _TORCH_TO_SHORT.items()}
_NAME_TO_SHORT = {
    "f64": "f64", "float64": "f64", "double": "f64",
    "f32": "f32", "float32": "f32", "float": "f32",
    "bf16": "bf16", "bfloat16": "bf16",
    "f16": "f16", "float16": "f16", "half": "f16",
    "i64": "i64", "int64": "i64", "long": "i64",
    "i32": "i32", "int32": "i32", "int": "i32",
    "i16": "i16", "int16": "i16", "short": "i16",
    "i8": "i8", "int8": "i8",
    "u8": "u8", "uint8": "u8",
    "bool": "bool",
}


def short_dtype(dtype, what: str) -> str:
    """A torch.dtype or a dtype name -> the model description's short name."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_TO_SHORT:
            raise ValueError(f"{what}: dtype {dtype} has no fsdp-model-v1 name "
                             f"(supported: {', '.join(_NAME_TO_SHORT)})")
        return _TORCH_TO_SHORT[dtype]
    if isinstance(dtype, str):
        name = dtype[6:] if dtype.startswith("torch.") else dtype
        if name in _NAME_TO_SHORT:
            return _NAME_TO_SHORT[name]
    raise ValueError(f"{what}: unknown dtype {dtype!r} (expected a torch.dtype or one of "
                     f"{', '.join(_NAME_TO_SHORT)})")


def torch_dtype(name: str) -> torch.dtype:
    return _SHORT_TO_TORCH[short_dtype(name, "dtype")]

