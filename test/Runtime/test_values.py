#!/usr/bin/env python3
"""Reference for the `fsdp-ckpt save --fill SEED` / `load --check SEED` values.

docs/TestValues.md: element i (row-major index in the global tensor; 0 for a
scalar) of checkpoint key k holds a value derived from

    N = ((i * 7919 + SEED * 104729 + fnv1a32(k)) mod 65521) - 32760

with the product and sum in unsigned 64-bit arithmetic (wrapping), so N is in
[-32760, 32760]. Floating dtypes hold N / 256 (exact in float32 and float64;
bfloat16 and float16 round it to nearest even, as torch's `.to()` does),
integer dtypes hold N (two's complement wrap for int8, modulo 2^bits for
unsigned types), bool holds N odd.

Standard library only. In PyTorch, check a loaded tensor `t` of key `k` with

    import torch, test_values as tv
    want = torch.tensor(tv.values(k, 0, t.numel(), SEED, "float32"))
    assert torch.equal(t.flatten().float(), want.to(t.dtype).float())

(`values` of "float32" then `.to(torch.bfloat16)` is exactly the bfloat16
test value.) fsdp-mlir's unit tests run this script to compare it with the
C++ runtime (unittests/Runtime/ValuesTest.cpp).

Usage:
  test_values.py                    the first 8 float32 values of key
                                    "model.p0", seed 7, one per line
  test_values.py --key K --seed S [--dtype D] [--first I] [--count C] [--hex]
      --key-hex HEX   the key as hex of its UTF-8 bytes (for non-ASCII keys)
      --dtype         float64 float32 bfloat16 float16 int64 int32 int16 int8
                      uint8 uint16 uint32 uint64 bool (default float32); with
                      --hex, a comma-separated list
      --hex           print the little-endian element bytes as one hex line
                      (per dtype) instead of one value per line
"""

import argparse
import struct
import sys

MASK64 = (1 << 64) - 1


def fnv1a32(key):
    """32-bit FNV-1a over the key's UTF-8 bytes (str) or the bytes themselves."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    h = 2166136261
    for b in key:
        h ^= b
        h = (h * 16777619) & 0xFFFFFFFF
    return h


def test_value(key_hash, index, seed):
    """N for element `index`, in [-32760, 32760]."""
    s = (index * 7919 + seed * 104729 + key_hash) & MASK64
    return s % 65521 - 32760


def float_to_bfloat16_bits(x):
    """float32 value -> bfloat16 bits, round to nearest even (x is finite)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def bfloat16_bits_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


# dtype -> (struct format of one element, N -> value stored)
DTYPES = {
    "float64": ("<d", lambda n: n / 256),
    "float32": ("<f", lambda n: n / 256),
    # struct's "e" rounds to nearest even; n / 256 is exact in a Python float
    # and in float32, so there is no double rounding.
    "float16": ("<e", lambda n: n / 256),
    "bfloat16": ("<H", lambda n: float_to_bfloat16_bits(n / 256)),
    "int64": ("<q", lambda n: n),
    "int32": ("<i", lambda n: n),
    "int16": ("<h", lambda n: n),
    "int8": ("<b", lambda n: (n + 128) % 256 - 128),
    "uint8": ("<B", lambda n: n % (1 << 8)),
    "uint16": ("<H", lambda n: n % (1 << 16)),
    "uint32": ("<I", lambda n: n % (1 << 32)),
    "uint64": ("<Q", lambda n: n % (1 << 64)),
    "bool": ("<B", lambda n: 1 if n % 2 != 0 else 0),
}


def values(key, first, count, seed, dtype="float32"):
    """The test values of elements [first, first + count) as Python numbers
    (bfloat16: the value of the rounded bfloat16, as a float)."""
    fmt, make = DTYPES[dtype]
    h = fnv1a32(key)
    out = []
    for i in range(first, first + count):
        v = make(test_value(h, i, seed))
        if dtype == "bfloat16":
            v = bfloat16_bits_to_float(v)
        elif dtype == "float16":
            v = struct.unpack("<e", struct.pack("<e", v))[0]
        elif dtype == "bool":
            v = bool(v)
        out.append(v)
    return out


def element_bytes(key, first, count, seed, dtype="float32"):
    """The little-endian bytes fsdp-ckpt writes for elements [first, first + count)."""
    fmt, make = DTYPES[dtype]
    h = fnv1a32(key)
    return b"".join(struct.pack(fmt, make(test_value(h, i, seed))) for i in range(first, first + count))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", default="model.p0")
    parser.add_argument("--key-hex")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--hex", action="store_true")
    args = parser.parse_args(argv)
    key = bytes.fromhex(args.key_hex) if args.key_hex is not None else args.key
    if not 0 <= args.seed < 2**31:
        parser.error("SEED must be in [0, 2^31)")
    dtypes = args.dtype.split(",")
    for dtype in dtypes:
        if dtype not in DTYPES:
            parser.error("unknown dtype %r (known: %s)" % (dtype, " ".join(sorted(DTYPES))))
    if args.first < 0 or args.count < 0:
        parser.error("--first and --count must be non-negative")
    if args.hex:
        for dtype in dtypes:
            print(element_bytes(key, args.first, args.count, args.seed, dtype).hex())
    elif len(dtypes) != 1:
        parser.error("several dtypes need --hex")
    else:
        for v in values(key, args.first, args.count, args.seed, args.dtype):
            print(int(v) if args.dtype == "bool" else v)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
