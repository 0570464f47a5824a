#!/usr/bin/env python3
"""Checks what lib/Format writes with CPython's own pickle and zipfile.

No torch is needed: stand-in classes are installed at the module paths PyTorch
DCP uses (docs/CheckpointFormat.md) and behave like torch's where it
matters for unpickling (TensorProperties.__setstate__ takes the 5-tuple and
needs an enum member, MetadataIndex is a frozen dataclass hashed on
(fqn, offset), torch.Size is a tuple).

  metadata_python_check.py FILE
      FILE is the .metadata the FormatTests write (DcpMetadataTest's
      `referenceMetadata`); asserts its exact structure.
  metadata_python_check.py --tensor-item FILE
      FILE holds one tensor item (float32 [3, 4], element i = i * 0.5):
      zipfile CRCs, record order, 64-byte alignment, data.pkl, data/0.
  metadata_python_check.py --object-item FILE REPR
      FILE holds one bytes item whose data.pkl unpickles to repr REPR.
  metadata_python_check.py --zip64-item FILE DATA_BYTES
      FILE is a sparse tensor item whose data/0 has DATA_BYTES (> 4 GiB)
      bytes: zip64 sizes and offsets, records after the data readable.

Exits 0 when every check passes; prints the failing check otherwise.
"""

import dataclasses
import enum
import io
import pickle
import pickletools
import struct
import sys
import types
import zipfile
from typing import List, Optional


# --- stand-ins for torch -----------------------------------------------------

def _module(name):
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    return mod


torch = _module("torch")
_module("torch.distributed")
_module("torch.distributed.checkpoint")
meta_mod = _module("torch.distributed.checkpoint.metadata")
fs_mod = _module("torch.distributed.checkpoint.filesystem")
ser_mod = _module("torch.serialization")
utils_mod = _module("torch._utils")


class Size(tuple):
    def __repr__(self):
        return f"torch.Size({list(self)})"


class _Named:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name

    def __reduce__(self):
        return self.name


torch.Size = Size
for _name in ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16",
              "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "uint16",
              "uint32", "uint64", "complex64", "complex128", "strided"]:
    setattr(torch, _name, _Named(_name))


def _get_layout(name):
    assert name == "torch.strided", name
    return torch.strided


ser_mod._get_layout = _get_layout


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclasses.dataclass
class TensorProperties:
    dtype: object = None
    layout: object = None
    requires_grad: bool = False
    memory_format: object = None
    pin_memory: bool = False

    def __setstate__(self, state):
        # torch's __setstate__: the 4th element must be an enum member.
        (self.dtype, self.layout, self.requires_grad, memory_format,
         self.pin_memory) = state
        assert isinstance(memory_format, _MEM_FORMAT_ENCODING), memory_format
        self.memory_format = memory_format


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: Size
    sizes: Size


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: Size
    chunks: List[ChunkStorageMetadata]


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Optional[Size] = None
    index: Optional[int] = dataclasses.field(hash=False, compare=False, default=None)


@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: object = None
    save_id: str = ""
    load_id: Optional[str] = None
    modules: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: object = None
    storage_data: object = None
    storage_meta: Optional[StorageMeta] = None
    version: Optional[str] = None


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Optional[list] = None


for _cls in [TensorProperties, ChunkStorageMetadata, TensorStorageMetadata,
             BytesStorageMetadata, MetadataIndex, StorageMeta, Metadata,
             _MEM_FORMAT_ENCODING]:
    _cls.__module__ = meta_mod.__name__
    setattr(meta_mod, _cls.__name__, _cls)
_StorageInfo.__module__ = fs_mod.__name__
fs_mod._StorageInfo = _StorageInfo


def check(condition, message):
    if not condition:
        print("FAILED:", message)
        sys.exit(1)


def expect_equal(actual, expected, what):
    check(actual == expected, f"{what}: got {actual!r}, expected {expected!r}")


# --- .metadata ---------------------------------------------------------------

def props(dtype):
    return (getattr(torch, dtype), torch.strided, False,
            _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, False)


# DcpMetadataTest.cpp's referenceMetadata(), spelled out.
EXPECTED_KEYS = [
    ("model.w", "float32", (5, 3), [((0, 0), (3, 3)), ((3, 0), (2, 3))]),
    ("model.b", "bfloat16", (7,), [((0,), (7,))]),
    ("optimizer.state.w.step", "float32", (), [((), ())]),
    ("big", "uint8", (6000000000,), [((0,), (3000000000,)),
                                     ((3000000000,), (3000000000,))]),
    ("optimizer.param_groups.0.lr", None, None, None),
    ("f8", "float8_e4m3fn", (2, 2, 2, 2, 2), [((0, 0, 0, 0, 0), (2, 2, 2, 2, 2))]),
]
EXPECTED_STORAGE = [
    ("model.w", (0, 0), 0, "__0_0.distcp", 0, 1833, None),
    ("model.w", (3, 0), 1, "__1_0.distcp", 0, 1705, None),
    ("model.b", (0,), 0, "__0_0.distcp", 1833, 1577, None),
    ("optimizer.state.w.step", (), 0, "__0_0.distcp", 3410, 1577, None),
    ("big", (0,), 0, "__0_0.distcp", 4987, 3000001600, None),
    ("big", (3000000000,), 1, "__1_0.distcp", 5000000000, 3000001600,
     ["stream.zstd/1"]),
    ("optimizer.param_groups.0.lr", None, None, "__1_0.distcp", 1705, 1261, None),
    ("f8", (0, 0, 0, 0, 0), 0, "__0_0.distcp", 3000006587, 1600, None),
]
EXPECTED_PLANNER = {
    "model.w": ("model", "w"),
    "model.b": ("model", "b"),
    "optimizer.state.w.step": ("optimizer", "state", "w", "step"),
    "big": ("big",),
    "optimizer.param_groups.0.lr": ("optimizer", "param_groups", 0, "lr"),
    "f8": ("f8",),
}


def check_metadata(path):
    data = open(path, "rb").read()
    check(data[:2] == b"\x80\x02", "not a protocol-2 pickle")
    check(b"pathlib" not in data, "pickle names pathlib")
    pickletools.dis(data, out=io.StringIO())  # well-formed stack and memo

    md = pickle.loads(data)
    check(type(md) is Metadata, f"root is {type(md)}")
    expect_equal(list(md.__dict__), ["state_dict_metadata", "planner_data",
                                     "storage_data", "storage_meta", "version"],
                 "Metadata fields")

    sdm = md.state_dict_metadata
    expect_equal(list(sdm), [k for k, *_ in EXPECTED_KEYS], "state_dict_metadata keys")
    for key, dtype, size, chunks in EXPECTED_KEYS:
        entry = sdm[key]
        if dtype is None:
            check(type(entry) is BytesStorageMetadata, f"{key} is {type(entry)}")
            expect_equal(entry.__dict__, {}, f"{key} state")
            continue
        check(type(entry) is TensorStorageMetadata, f"{key} is {type(entry)}")
        expect_equal(list(entry.__dict__), ["properties", "size", "chunks"], f"{key} fields")
        check(type(entry.properties) is TensorProperties, f"{key}.properties type")
        p = entry.properties
        expect_equal((p.dtype, p.layout, p.requires_grad, p.memory_format, p.pin_memory),
                     props(dtype), f"{key}.properties")
        check(type(entry.size) is Size, f"{key}.size is {type(entry.size)}")
        expect_equal(tuple(entry.size), size, f"{key}.size")
        check(type(entry.chunks) is list, f"{key}.chunks is a {type(entry.chunks)}")
        expect_equal(len(entry.chunks), len(chunks), f"{key} chunk count")
        for i, (chunk, (offsets, sizes)) in enumerate(zip(entry.chunks, chunks)):
            check(type(chunk) is ChunkStorageMetadata, f"{key}.chunks[{i}] type")
            check(type(chunk.offsets) is Size and type(chunk.sizes) is Size,
                  f"{key}.chunks[{i}] offsets/sizes are not torch.Size")
            expect_equal((tuple(chunk.offsets), tuple(chunk.sizes)), (offsets, sizes),
                         f"{key}.chunks[{i}]")

    sd = md.storage_data
    check(type(sd) is dict, "storage_data is not a dict")
    expect_equal(len(sd), len(EXPECTED_STORAGE), "storage_data size")
    for (index, info), expected in zip(sd.items(), EXPECTED_STORAGE):
        fqn, offset, hint, path, start, length, transforms = expected
        check(type(index) is MetadataIndex, f"storage key {index!r}")
        keys = ["fqn", "index"] + (["offset"] if offset is not None else [])
        expect_equal(list(index.__dict__), keys, f"MetadataIndex({fqn}) fields")
        expect_equal((index.fqn, index.offset, index.index), (fqn, offset, hint),
                     "MetadataIndex")
        if offset is not None:
            check(type(index.offset) is Size, f"MetadataIndex({fqn}).offset type")
        check(type(info) is _StorageInfo, f"storage value {info!r}")
        fields = ["relative_path", "offset", "length"]
        if transforms is not None:
            fields.append("transform_descriptors")
        expect_equal(list(info.__dict__), fields, f"_StorageInfo({fqn}) fields")
        expect_equal((info.relative_path, info.offset, info.length,
                      info.transform_descriptors), (path, start, length, transforms),
                     f"_StorageInfo({fqn})")
        # What FileSystemReader does: look the chunk up by (fqn, offsets).
        check(sd[MetadataIndex(fqn, Size(offset) if offset is not None else None)]
              is info, f"lookup of {fqn} {offset}")

    expect_equal(md.planner_data, EXPECTED_PLANNER, "planner_data")
    check(type(md.storage_meta) is StorageMeta, "storage_meta type")
    expect_equal(md.storage_meta.__dict__,
                 {"checkpoint_id": "/ckpt/run-1",
                  "save_id": "5d0c3f4e-8a4b-4c53-9a4e-2b8f0c1d2e3f",
                  "load_id": None, "modules": []}, "storage_meta")
    check(type(md.storage_meta.checkpoint_id) is str, "checkpoint_id is not a str")
    expect_equal(md.version, "1.0.0", "version")


# --- items ---------------------------------------------------------------------

class _TensorUnpickler(pickle.Unpickler):
    """torch.load's view of data.pkl, reduced to what the test needs."""

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda *args: ("tensor", args)
        if (module, name) == ("collections", "OrderedDict"):
            import collections
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return "torch." + name
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")

    def persistent_load(self, pid):
        return pid


TORCH_RECORDS = ["data.pkl", ".format_version", ".storage_alignment", "byteorder",
                 "data/0", "version", ".data/serialization_id"]


def local_data_offset(raw, info):
    header = raw[info.header_offset:info.header_offset + 30]
    check(header[:4] == b"PK\x03\x04", f"{info.filename}: local header signature")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def check_records(zf, raw, records):
    expect_equal(zf.namelist(), ["archive/" + r for r in records], "records")
    for info in zf.infolist():
        expect_equal(info.compress_type, zipfile.ZIP_STORED, f"{info.filename} method")
        offset = local_data_offset(raw, info)
        expect_equal(offset % 64, 0, f"{info.filename} data offset {offset} % 64")
    expect_equal(zf.read("archive/version"), b"3\n", "version")
    expect_equal(zf.read("archive/byteorder"), b"little", "byteorder")
    expect_equal(zf.read("archive/.format_version"), b"1", ".format_version")
    expect_equal(zf.read("archive/.storage_alignment"), b"64", ".storage_alignment")


def check_tensor_item(path):
    raw = open(path, "rb").read()
    zf = zipfile.ZipFile(io.BytesIO(raw))
    check(zf.testzip() is None, "a CRC does not match")
    check_records(zf, raw, TORCH_RECORDS)
    kind, args = _TensorUnpickler(io.BytesIO(zf.read("archive/data.pkl"))).load()
    expect_equal(kind, "tensor", "data.pkl root")
    storage, offset, size, stride, requires_grad, hooks = args
    expect_equal(storage, ("storage", "torch.FloatStorage", "0", "cpu", 12), "storage pid")
    expect_equal((offset, size, stride, requires_grad, len(hooks)),
                 (0, (3, 4), (4, 1), False, 0), "rebuild args")
    values = struct.unpack("<12f", zf.read("archive/data/0"))
    expect_equal(list(values), [i * 0.5 for i in range(12)], "data/0")


def check_object_item(path, expected_repr):
    raw = open(path, "rb").read()
    zf = zipfile.ZipFile(io.BytesIO(raw))
    check(zf.testzip() is None, "a CRC does not match")
    check_records(zf, raw, [r for r in TORCH_RECORDS if r != "data/0"])
    expect_equal(repr(pickle.loads(zf.read("archive/data.pkl"))), expected_repr,
                 "data.pkl")


def check_zip64_item(path, data_bytes):
    with open(path, "rb") as f:
        zf = zipfile.ZipFile(f)
        expect_equal(zf.namelist(), ["archive/" + r for r in TORCH_RECORDS], "records")
        data = zf.getinfo("archive/data/0")
        expect_equal(data.file_size, data_bytes, "data/0 size")
        expect_equal(data.compress_size, data_bytes, "data/0 stored size")
        version = zf.getinfo("archive/version")
        check(version.header_offset > 0xFFFFFFFF,
              f"version header at {version.header_offset}, expected past 4 GiB")
        # zipfile seeks to the local headers past 4 GiB and checks them.
        expect_equal(zf.read("archive/version"), b"3\n", "version")
        expect_equal(len(zf.read("archive/.data/serialization_id")), 40,
                     "serialization_id length")
        f.seek(data.header_offset)
        header = f.read(30)
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        offset = data.header_offset + 30 + name_len + extra_len
        expect_equal(offset % 64, 0, "data/0 alignment")


def main(argv):
    if len(argv) == 2:
        check_metadata(argv[1])
    elif len(argv) == 3 and argv[1] == "--tensor-item":
        check_tensor_item(argv[2])
    elif len(argv) == 4 and argv[1] == "--object-item":
        check_object_item(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "--zip64-item":
        check_zip64_item(argv[2], int(argv[3]))
    else:
        print(__doc__)
        return 2
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
