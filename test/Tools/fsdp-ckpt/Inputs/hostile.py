#!/usr/bin/env python3
"""Hostile checkpoints: fsdp-ckpt must answer each with the right error kind,
never crash, hang, exhaust memory, follow a path out of the checkpoint,
execute a pickle global, or print raw control bytes.

usage: hostile.py --ckpt FSDP_CKPT --good DIR --plan1 PLAN --torch DIR
                  --torch-plan1 PLAN --work DIR [--only NAME[,NAME...]] [--keep]

  --good         a checkpoint of ours: `fsdp-ckpt save --fill 3` of
                 Inputs/hostile-model.json (2 ranks, f32 and bf16 tensors)
  --plan1        a 1-rank plan of that model (load --check 3)
  --torch        PyTorch's checkpoint test/Inputs/torch-fsdp2-ws2/checkpoint
  --torch-plan1  a 1-rank plan of torch-fsdp2-ws2.json (load without --check)

Each case is a copy of one of the two checkpoints with one hostile change
(crafted with CPython's pickle through stand-ins for torch's DCP classes, a
small zip editor, and an `.fsdp-index` writer that re-signs with xxh3-64).
A load of ours reads the chunk index `.fsdp-chunks` instead of `.metadata`
and `.fsdp-index`, so the cases that lie there drop it (and its entry in the
index): they test the `.metadata` path, which PyTorch's checkpoints take.
The plain control and the `chunks_` cases keep it.
Then `load`, `verify`, `inspect`, `inspect --json` and `export --safetensors` run on it
(export: the load's refusal or a result, since it reads only the model's tensors), each under a
3 GB address-space limit, a 64 MiB output-file limit and a 10 s timeout, and
must: not die of a signal or time out; exit with the expected code (table
CASES below); on failure end stderr with exactly one line starting
`fsdp-ckpt <command>: ` (verify may list problems before it); print no byte
below 0x20 but newline, nor 0x7f, on stdout or stderr. Needs the `xxhash`
package (pip install xxhash).
"""
import argparse
import copy
import dataclasses
import enum
import io
import json
import os
import pickle
import pickletools
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
import types
import zipfile

try:
    import xxhash
except ImportError:
    sys.exit("hostile.py needs the xxhash package: pip install xxhash (scripts/setup.sh does)")

# --- expectations --------------------------------------------------------------

LR = "optimizer.param_groups.0.lr"  # a bytes item in __0_0.distcp of ours

# Exit codes of the error kinds.
OK, CHECK, INVALID, NOT_FOUND, CORRUPT, INCOMPATIBLE, IO, BUSY = range(8)
NONREG = (CORRUPT, IO)  # a FIFO, directory or symlink where a regular file belongs
LIST = (OK, CORRUPT)    # inspect lists .metadata; it may or may not look deeper
EITHER = (OK, CORRUPT)  # a correct result, or a refusal: never a crash or a wrong value

# name: (base, load, verify, inspect (plain and --json), substring the stderr of a
# failing command must contain, or None). base "ours" is --good, "torch" --torch.
# An expectation is one exit code or a tuple of acceptable ones.
CASES = {
    # Controls: the crafting helpers alone change nothing that matters.
    "control":                  ("ours", OK, OK, OK, None),
    "control_repickled":        ("ours", OK, OK, OK, None),
    "control_rebuilt_item":     ("ours", OK, OK, OK, None),
    "control_torch":            ("torch", OK, OK, OK, None),
    "control_torch_repickled":  ("torch", OK, OK, OK, None),
    # 1. a bf16 chunk's storage_data points at an f32 item
    "bf16_at_f32_signed":       ("ours", CORRUPT, CORRUPT, LIST, None),
    "bf16_at_f32_noindex":      ("ours", CORRUPT, CORRUPT, LIST, None),
    # 2. data/0 claims more bytes than the item holds (no index)
    "zip_size_huge":            ("ours", CORRUPT, CORRUPT, LIST, "__0_0.distcp"),
    "zip_size_overlap":         ("ours", CORRUPT, CORRUPT, LIST, "__0_0.distcp"),
    # 3. paths out of the checkpoint: in the index only, in both
    "index_escape":             ("ours", CORRUPT, CORRUPT, LIST, "index"),
    "index_metadata_escape":    ("ours", CORRUPT, CORRUPT, CORRUPT, None),
    # 4. index entries at offsets near 2^63 and 2^64; index damage that re-signs cleanly
    "index_offset_2p63":        ("ours", CORRUPT, CORRUPT, LIST, "index"),
    "index_offset_2p64":        ("ours", CORRUPT, CORRUPT, LIST, "index"),
    "index_missing_item":       ("ours", CORRUPT, CORRUPT, LIST, "index"),
    "index_count_huge":         ("ours", CORRUPT, CORRUPT, LIST, "index"),
    "index_strlen_huge":        ("ours", CORRUPT, CORRUPT, LIST, "index"),
    # 5. memo-shared "billion laughs" tuples in .metadata (index re-signed)
    "laughs_size":              ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "laughs_chunks":            ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "laughs_planner_data":      ("ours", EITHER, EITHER, EITHER, None),
    "laughs_extra_field":       ("ours", EITHER, EITHER, EITHER, None),
    # 6. a bytes item whose data.pkl is billion laughs / a million nested lists
    "laughs_bytes_item":        ("ours", EITHER, EITHER, EITHER, None),
    "deep_bytes_item":          ("ours", EITHER, EITHER, EITHER, None),
    "deep_metadata":            ("ours", EITHER, EITHER, EITHER, None),
    # 7. storage_data lengths and offsets of 2^62 / 2^63
    "huge_length_bytes":        ("ours", CORRUPT, CORRUPT, CORRUPT, LR),
    "huge_length_tensor":       ("ours", CORRUPT, CORRUPT, LIST, "model.w"),
    "huge_offset_tensor":       ("ours", CORRUPT, CORRUPT, LIST, "model.w"),
    # 8. .metadata of GBs: a sparse hole, a pickle frame or string length (no index)
    "metadata_sparse_5g":       ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "metadata_frame_5g":        ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "metadata_string_4g":       ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    # 9. special files
    "fifo_metadata":            ("ours", NONREG, NONREG, NONREG, ".metadata"),
    "fifo_data":                ("ours", NONREG, NONREG, NONREG, "__0_0.distcp"),
    "fifo_index":               ("ours", NONREG, NONREG, LIST, "index"),
    "symlink_data":             ("ours", NONREG, NONREG, NONREG, "__0_0.distcp"),
    "metadata_is_dir":          ("ours", NONREG, NONREG, NONREG, ".metadata"),
    # 10. staging directories under other spellings
    "staging_dot":              ("ours", NOT_FOUND, NOT_FOUND, NOT_FOUND, "staging"),
    "staging_slash":            ("ours", NOT_FOUND, NOT_FOUND, NOT_FOUND, "staging"),
    "staging_dotslash":         ("ours", NOT_FOUND, NOT_FOUND, NOT_FOUND, "staging"),
    "staging_symlink":          ("ours", NOT_FOUND, NOT_FOUND, NOT_FOUND, None),
    # 11. terminal escapes and newlines in keys and paths (no index)
    "escape_key":               ("ours", INCOMPATIBLE, OK, OK, "model.b"),
    "escape_key_broken":        ("ours", CORRUPT, CORRUPT, CORRUPT, None),
    "escape_path":              ("ours", (NOT_FOUND, CORRUPT), (NOT_FOUND, CORRUPT),
                                 (NOT_FOUND, CORRUPT), None),
    # 12. one flipped byte of tensor data, PyTorch's checkpoint (CRC only)
    "torch_flipped_data":       ("torch", CORRUPT, CORRUPT, LIST, "__0_0.distcp"),
    # 13. two chunks of one tensor overlap with different values
    "torch_overlap_chunks":     ("torch", (CORRUPT, INCOMPATIBLE), (CORRUPT, INCOMPATIBLE),
                                 (OK, CORRUPT, INCOMPATIBLE), "fc1.weight"),
    # 14. more
    "relpath_absolute":         ("ours", CORRUPT, CORRUPT, CORRUPT, None),
    "relpath_etc_passwd":       ("ours", CORRUPT, CORRUPT, CORRUPT, None),
    "relpath_dotdot":           ("ours", CORRUPT, CORRUPT, CORRUPT, None),
    "relpath_empty":            ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "relpath_nul":              ("ours", CORRUPT, CORRUPT, CORRUPT, None),
    "negative_offset":          ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "negative_chunk_size":      ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "chunk_outside_tensor":     ("ours", CORRUPT, CORRUPT, CORRUPT, ".metadata"),
    "dtype_pkl_mismatch":       ("ours", CORRUPT, CORRUPT, LIST, "__0_0.distcp"),
    "storage_numel_huge":       ("ours", CORRUPT, CORRUPT, LIST, "__0_0.distcp"),
    "deflated_item":            ("ours", EITHER, EITHER, LIST, None),
    "empty_data_file":          ("ours", CORRUPT, CORRUPT, CORRUPT, "__1_0.distcp"),
    "evil_global_metadata":     ("ours", CORRUPT, CORRUPT, CORRUPT, "system"),
    "evil_global_bytes_item":   ("ours", EITHER, EITHER, CORRUPT, "system"),
    # 15. the chunk index: a flipped record, truncated, left from another
    #     .metadata (re-pickled, index re-signed), a FIFO. inspect never reads it.
    "chunks_flipped":           ("ours", CORRUPT, CORRUPT, LIST, ".fsdp-chunks"),
    "chunks_truncated":         ("ours", CORRUPT, CORRUPT, LIST, ".fsdp-chunks"),
    "chunks_stale":             ("ours", CORRUPT, CORRUPT, LIST, ".fsdp-chunks"),
    "chunks_fifo":              ("ours", NONREG, NONREG, LIST, ".fsdp-chunks"),
}
COMMANDS = ["load", "verify", "inspect", "inspect-json", "export"]
TIMEOUT_S = 10
ADDRESS_SPACE = 3 << 30
OUTPUT_LIMIT = 64 << 20

# --- stand-ins for torch's DCP classes (read and write) ---------------------------


def _module(name):
    mod = sys.modules.get(name) or types.ModuleType(name)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(_module(parent), child, mod)
    return mod


torch = _module("torch")
_meta = _module("torch.distributed.checkpoint.metadata")
_fs = _module("torch.distributed.checkpoint.filesystem")
_ser = _module("torch.serialization")


class _TorchGlobal:
    """torch.float32 and friends: pickled as the global torch.<name>."""

    def __init__(self, name):
        self.name, self.__module__ = name, "torch"

    def __reduce__(self):
        return self.name


class _Layout:
    def __reduce__(self):  # as PyTorch pickles it
        return (_get_layout, ("torch.strided",))


def _get_layout(name):
    return torch.strided


_get_layout.__module__ = "torch.serialization"
_ser._get_layout = _get_layout
torch.strided = _Layout()
for _name in ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
              "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64",
              "complex64", "complex128"]:
    setattr(torch, _name, _TorchGlobal(_name))


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size.__module__ = "torch"
torch.Size = Size


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


def _properties_setstate(self, state):  # torch's 5-tuple (6 since 2.15), or the old dict
    if isinstance(state, dict):
        state = tuple(state.get(f, None) for f in _PROPERTIES)
    for field, value in zip(_PROPERTIES, state):
        setattr(self, field, value)
    self.__dict__["_more"] = tuple(state[len(_PROPERTIES):])


_PROPERTIES = ["dtype", "layout", "requires_grad", "memory_format", "pin_memory"]


def _standin(name, fields, module=_meta, **options):
    cls = dataclasses.make_dataclass(name, fields, **options)
    cls.__module__ = module.__name__
    setattr(module, name, cls)
    return cls


_NONE, _NOT_KEY = (object, None), (object, dataclasses.field(default=None, compare=False))
_MEM_FORMAT_ENCODING.__module__ = _meta.__name__
_meta._MEM_FORMAT_ENCODING = _MEM_FORMAT_ENCODING
TensorProperties = _standin(
    "TensorProperties", _PROPERTIES, namespace={
        "__getstate__": lambda self: tuple(getattr(self, f) for f in _PROPERTIES) + self._more,
        "__setstate__": _properties_setstate})
ChunkStorageMetadata = _standin("ChunkStorageMetadata", ["offsets", "sizes"])
TensorStorageMetadata = _standin("TensorStorageMetadata", ["properties", "size", "chunks"])
BytesStorageMetadata = _standin("BytesStorageMetadata", [])
MetadataIndex = _standin("MetadataIndex", ["fqn", ("offset",) + _NONE, ("index",) + _NOT_KEY],
                         frozen=True)
StorageMeta = _standin("StorageMeta", [("checkpoint_id",) + _NONE, ("save_id",) + _NONE,
                                       ("load_id",) + _NONE, ("modules",) + _NONE])
Metadata = _standin("Metadata", ["state_dict_metadata", ("planner_data",) + _NONE,
                                 ("storage_data",) + _NONE, ("storage_meta",) + _NONE,
                                 ("version",) + _NONE])
_StorageInfo = _standin("_StorageInfo", ["relative_path", "offset", "length",
                                         ("transform_descriptors",) + _NONE], module=_fs)


class _Evil:
    """Unpickling this would run a shell command: readers must refuse it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def laughs(leaf, depth=10, width=10):
    """A tuple of `width` references to a tuple of ... `depth` levels deep."""
    for _ in range(depth):
        leaf = (leaf,) * width
    return leaf


def deep_lists(levels):
    """Raw protocol-2 opcodes for [[[...]]] nested `levels` deep."""
    return b"]" * levels + b"a" * (levels - 1)


def placeholder(tag):
    return "@@HOSTILE-%s@@" % tag


def pickle_bytes(obj, protocol=2, raw=None):
    """Pickles obj; each placeholder(tag) string becomes the raw opcodes raw[tag]."""
    data = pickle.dumps(obj, protocol=protocol)
    for tag, opcodes in (raw or {}).items():
        text = placeholder(tag).encode()
        data = data.replace(b"X" + struct.pack("<I", len(text)) + text, opcodes)
    return data


def patch_pickle(data, choose):
    """Replaces the opcodes for which choose(i, ops) returns bytes."""
    ops = list(pickletools.genops(data))
    out, last = [], 0
    for i in range(len(ops) - 1):
        new = choose(i, ops)
        if new is not None:
            out += [data[last:ops[i][2]], new]
            last = ops[i + 1][2]
    return b"".join(out) + data[last:]


def long1(value):
    return b"\x8a\x08" + value.to_bytes(8, "little", signed=True)


# --- the integrity index ----------------------------------------------------------


def read_index(path):
    data = open(path, "rb").read()
    pos = 8

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return values

    def text():
        nonlocal pos
        (n,) = take("<I")
        pos += n
        return data[pos - n:pos]

    version, plan = take("<IQ")
    writer = text()
    md_length, md_hash, count = take("<QQQ")
    items = [[text(), text(), *take("<QQQ")] for _ in range(count)]
    return dict(version=version, plan=plan, writer=writer, md_length=md_length,
                md_hash=md_hash, items=items)


def write_index(path, index, count=None, writer_length=None):
    """Writes and re-signs; count / writer_length override the recorded numbers."""
    out = [b"FSDPIDX1", struct.pack("<IQ", index["version"], index["plan"]),
           struct.pack("<I", len(index["writer"]) if writer_length is None else writer_length),
           index["writer"],
           struct.pack("<QQQ", index["md_length"], index["md_hash"],
                       len(index["items"]) if count is None else count)]
    for key, name, offset, length, digest in index["items"]:
        out += [struct.pack("<I", len(key)), key, struct.pack("<I", len(name)), name,
                struct.pack("<QQQ", offset, length, digest)]
    body = b"".join(out)
    open(path, "wb").write(body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body)))


# --- zip records inside one item ------------------------------------------------


def records(item):
    with zipfile.ZipFile(io.BytesIO(item)) as zf:
        return [(info.filename, zf.read(info)) for info in zf.infolist()]


def rebuild_item(recs, compression=zipfile.ZIP_STORED):
    """A new archive with these records, written by CPython's zipfile."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in recs:
            zf.writestr(zipfile.ZipInfo(name), data, compress_type=compression)
    return out.getvalue()


def replace_record(item, suffix, fn, compression=zipfile.ZIP_STORED):
    return rebuild_item([(n, fn(d) if n.endswith(suffix) else d) for n, d in records(item)],
                        compression)


def record_data_offset(item, suffix):
    with zipfile.ZipFile(io.BytesIO(item)) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(suffix))
    name_length, extra_length = struct.unpack_from("<HH", item, info.header_offset + 26)
    return info.header_offset + 30 + name_length + extra_length, info


def lie_about_size(item, suffix, claimed):
    """Rewrites every size field of one record (central directory, local
    header where non-zero, data descriptor) to `claimed`; the data stays."""
    item = bytearray(item)
    data_offset, info = record_data_offset(bytes(item), suffix)
    pos = item.find(b"PK\x01\x02")
    while pos >= 0:
        name_length = struct.unpack_from("<H", item, pos + 28)[0]
        if item[pos + 46:pos + 46 + name_length].decode().endswith(suffix):
            struct.pack_into("<II", item, pos + 20, claimed, claimed)
        pos = item.find(b"PK\x01\x02", pos + 46)
    if struct.unpack_from("<I", item, info.header_offset + 18)[0]:
        struct.pack_into("<II", item, info.header_offset + 18, claimed, claimed)
    descriptor = data_offset + info.compress_size
    if item[descriptor:descriptor + 4] == b"PK\x07\x08":
        struct.pack_into("<II", item, descriptor + 8, claimed, claimed)
    return bytes(item)


# --- one checkpoint copy being crafted -------------------------------------------


class Crafted:
    def __init__(self, root, base, keep_chunks):
        self.root = root                       # the case's scratch directory
        self.d = os.path.join(root, "dir", "ckpt")
        self.outside = os.path.join(root, "outside")
        self.marker = os.path.join(root, "PWNED")
        self.dir_arg, self.cwd = self.d, None  # how the commands name the checkpoint
        os.makedirs(self.outside)
        shutil.copytree(base, self.d)
        self.path_md = os.path.join(self.d, ".metadata")
        self.path_index = os.path.join(self.d, ".fsdp-index")
        self.md = pickle.loads(open(self.path_md, "rb").read())
        self.index = read_index(self.path_index) if os.path.exists(self.path_index) else None
        self.path_chunks = os.path.join(self.d, ".fsdp-chunks")
        if not keep_chunks:
            self.drop_chunks()

    def save(self, protocol=2, raw=None, data=None):
        """Writes .metadata (self.md, or `data`) and re-signs the index, if any."""
        data = data if data is not None else pickle_bytes(self.md, protocol, raw)
        open(self.path_md, "wb").write(data)
        if self.index:
            self.index.update(md_length=len(data), md_hash=xxhash.xxh3_64_intdigest(data))
            write_index(self.path_index, self.index)

    def drop_chunks(self):
        """Removes the chunk index and its entry in the index (re-signed)."""
        if os.path.exists(self.path_chunks):
            os.remove(self.path_chunks)
        if self.index:
            self.index["items"] = [i for i in self.index["items"] if i[1] != b".fsdp-chunks"]
            write_index(self.path_index, self.index)

    def drop_index(self):
        os.remove(self.path_index)
        self.index = None

    def key(self, fqn, offsets=None):
        for index in self.md.storage_data:
            if index.fqn == fqn and (offsets is None or tuple(index.offset) == offsets):
                return index
        raise KeyError(fqn)

    def info(self, fqn, offsets=None):
        return self.md.storage_data[self.key(fqn, offsets)]

    def index_item(self, info):
        return next(i for i in self.index["items"]
                    if i[1] == info.relative_path.encode() and i[2] == info.offset)

    def item(self, info):
        with open(os.path.join(self.d, info.relative_path), "rb") as f:
            f.seek(info.offset)
            return f.read(info.length)

    def write_at(self, name, offset, data):
        path = os.path.join(self.d, name)
        with open(path, "r+b" if os.path.exists(path) else "wb") as f:
            f.seek(offset)
            f.write(data)

    def relocate(self, info, item, name=None):
        """Puts `item` as info's item at the 4 KiB-aligned end of file `name`
        (default: its own file), zeroes the old bytes; .metadata and the index
        follow (call save())."""
        name = name or info.relative_path
        self.write_at(info.relative_path, info.offset, bytes(info.length))
        path = os.path.join(self.d, name)
        at = -(-os.path.getsize(path) // 4096) * 4096 if os.path.exists(path) else 0
        self.write_at(name, at, item)
        if self.index:
            entry = self.index_item(info)
            entry[1:] = [name.encode(), at, len(item), xxhash.xxh3_64_intdigest(item)]
        info.relative_path, info.offset, info.length = name, at, len(item)

    def rename_key(self, old, new):
        md = self.md
        md.state_dict_metadata = {new if k == old else k: v
                                  for k, v in md.state_dict_metadata.items()}
        md.storage_data = {self.with_fqn(k, new) if k.fqn == old else k: v
                           for k, v in md.storage_data.items()}
        if isinstance(md.planner_data, dict) and old in md.planner_data:
            md.planner_data = {new if k == old else k: v for k, v in md.planner_data.items()}

    @staticmethod
    def with_fqn(index, fqn):
        index = copy.copy(index)
        object.__setattr__(index, "fqn", fqn)
        return index


# --- the cases ------------------------------------------------------------------

BUILDERS = {}


def builds(*names):
    def register(fn):
        for name in names:
            BUILDERS[name] = fn
        return fn
    return register


F32, BF16 = ("model.w", (0, 0)), ("model.half.w", (0, 0))  # same shape, in __0_0.distcp


@builds("control", "control_torch")
def _(c, name):
    pass


@builds("control_repickled", "control_torch_repickled")
def _(c, name):
    c.save()


@builds("control_rebuilt_item")
def _(c, name):
    info = c.info(*BF16)
    c.relocate(info, rebuild_item(records(c.item(info))))
    c.save()


@builds("bf16_at_f32_signed", "bf16_at_f32_noindex")
def _(c, name):
    if name.endswith("noindex"):
        c.drop_index()
    f32, bf16 = c.info(*F32), c.info(*BF16)
    bf16.relative_path, bf16.offset, bf16.length = f32.relative_path, f32.offset, f32.length
    c.save()


@builds("zip_size_huge", "zip_size_overlap")
def _(c, name):
    c.drop_index()
    info = c.info(*F32)
    item = c.item(info)
    real = record_data_offset(item, "/data/0")[1].file_size
    claimed = 0x7FFFFFF0 if name.endswith("huge") else real + 200
    c.write_at(info.relative_path, info.offset, lie_about_size(item, "/data/0", claimed))


@builds("index_escape")
def _(c, name):
    info = c.info(*F32)
    shutil.copy(os.path.join(c.d, info.relative_path), os.path.join(c.outside, "file"))
    c.index_item(info)[1] = b"../../outside/file"
    c.save()


@builds("index_metadata_escape")
def _(c, name):
    info = c.info(LR)
    item = c.item(info)
    c.relocate(info, item, "../../outside/file")
    c.save()


@builds("index_offset_2p63", "index_offset_2p64")
def _(c, name):
    c.index_item(c.info(*F32))[2] = (1 << (63 if name.endswith("63") else 64)) - 512
    c.save()


@builds("index_missing_item")
def _(c, name):
    c.index["items"].remove(c.index_item(c.info(*F32)))
    c.save()


@builds("index_count_huge", "index_strlen_huge")
def _(c, name):
    c.save()
    if name == "index_count_huge":
        c.index["items"] = []
        write_index(c.path_index, c.index, count=1 << 60)
    else:
        write_index(c.path_index, c.index, writer_length=0xFFFFFFF0)


@builds("laughs_size", "laughs_chunks", "laughs_planner_data", "laughs_extra_field")
def _(c, name):
    tensor = c.md.state_dict_metadata[F32[0]]
    if name == "laughs_size":
        tensor.size = Size(laughs(1))
    elif name == "laughs_chunks":
        tensor.chunks = list(laughs(tensor.chunks[0]))
    elif name == "laughs_planner_data":
        c.md.planner_data[F32[0]] = laughs("model")
    else:
        c.md.hostile = laughs("ha")
    c.save()


@builds("laughs_bytes_item", "deep_bytes_item", "evil_global_bytes_item")
def _(c, name):
    info = c.info(LR)
    if name == "laughs_bytes_item":
        pkl = pickle.dumps(laughs("ha"), protocol=2)
    elif name == "deep_bytes_item":
        pkl = b"\x80\x02" + deep_lists(1_000_000) + b"."
    else:
        pkl = pickle.dumps(_Evil(c.marker), protocol=2)
    c.relocate(info, replace_record(c.item(info), "/data.pkl", lambda _: pkl))
    c.save()


@builds("deep_metadata", "evil_global_metadata")
def _(c, name):
    if name == "deep_metadata":
        c.md.hostile = placeholder("deep")
        c.save(raw={"deep": deep_lists(1_000_000)})
    else:
        c.md.hostile = _Evil(c.marker)
        c.save()


@builds("huge_length_bytes", "huge_length_tensor", "huge_offset_tensor")
def _(c, name):
    info = c.info(LR) if name.endswith("bytes") else c.info(*F32)
    if "length" in name:
        info.length = 1 << 62
    else:
        info.offset = (1 << 63) - 512
    c.save()


@builds("metadata_sparse_5g", "metadata_frame_5g", "metadata_string_4g")
def _(c, name):
    c.drop_index()
    if name == "metadata_sparse_5g":
        c.save()
        os.truncate(c.path_md, os.path.getsize(c.path_md) + (5 << 30))
    elif name == "metadata_frame_5g":
        data = bytearray(pickle.dumps(c.md, protocol=4))
        assert data[2] == 0x95  # FRAME, then its 8-byte length
        struct.pack_into("<Q", data, 3, 5 << 30)
        c.save(data=bytes(data))
    else:
        version = c.md.version.encode()
        find = b"X" + struct.pack("<I", len(version)) + version
        c.save(data=pickle_bytes(c.md).replace(find, b"X" + struct.pack("<I", 0xFFFFFFF0)
                                               + version))


@builds("fifo_metadata", "fifo_data", "fifo_index", "symlink_data", "metadata_is_dir")
def _(c, name):
    target = {"fifo_metadata": ".metadata", "fifo_index": ".fsdp-index",
              "metadata_is_dir": ".metadata"}.get(name, "__0_0.distcp")
    path = os.path.join(c.d, target)
    if name == "symlink_data":
        shutil.move(path, os.path.join(c.outside, target))
        os.symlink(os.path.join(c.outside, target), path)
        return
    os.remove(path)
    os.mkdir(path) if name == "metadata_is_dir" else os.mkfifo(path)


@builds("chunks_flipped", "chunks_truncated", "chunks_stale", "chunks_fifo")
def _(c, name):
    size = os.path.getsize(c.path_chunks)
    if name == "chunks_flipped":
        c.write_at(".fsdp-chunks", size - 10, b"\x5a")  # in the last record
    elif name == "chunks_truncated":
        os.truncate(c.path_chunks, size - 50)
    elif name == "chunks_stale":
        c.save(protocol=4)  # the same keys, another .metadata
    else:
        os.remove(c.path_chunks)
        os.mkfifo(c.path_chunks)


@builds("staging_dot", "staging_slash", "staging_dotslash", "staging_symlink")
def _(c, name):
    staging = c.d + ".fsdp-staging"
    os.rename(c.d, staging)
    c.cwd = os.path.dirname(c.d)
    c.dir_arg = {"staging_dot": "ckpt.fsdp-staging/.", "staging_slash": "ckpt.fsdp-staging/",
                 "staging_dotslash": "./ckpt.fsdp-staging", "staging_symlink": "ckpt"}[name]
    if name == "staging_symlink":
        os.symlink("ckpt.fsdp-staging", c.d)


ESCAPES = "\x1b[31mred\nsecond\r\x07\x1b]0;title\x07\x7f"


@builds("escape_key", "escape_key_broken", "escape_path")
def _(c, name):
    c.drop_index()
    if name == "escape_key":
        c.rename_key("model.b", "model." + ESCAPES)
    elif name == "escape_key_broken":  # one more bytes item, past the end of its file
        info = copy.copy(c.info(LR))
        info.offset = 1 << 20
        c.md.state_dict_metadata[LR + ESCAPES] = BytesStorageMetadata()
        c.md.storage_data[c.with_fqn(c.key(LR), LR + ESCAPES)] = info
    else:
        c.info(LR).relative_path = ESCAPES + "__0_0.distcp"
    c.save()


@builds("torch_flipped_data")
def _(c, name):
    info = c.info("model.fc1.weight", (0, 0))
    at = info.offset + record_data_offset(c.item(info), "/data/0")[0] + 10
    with open(os.path.join(c.d, info.relative_path), "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x5A]))


@builds("torch_overlap_chunks")
def _(c, name):
    # A third chunk of fc1.weight, rows [4, 12), served by exp_avg's rows [0, 8).
    tensor = c.md.state_dict_metadata["model.fc1.weight"]
    tensor.chunks.append(ChunkStorageMetadata(Size((4, 0)), Size((8, 8))))
    index = copy.copy(c.key("model.fc1.weight", (8, 0)))
    object.__setattr__(index, "offset", Size((4, 0)))
    object.__setattr__(index, "index", 2)
    c.md.storage_data[index] = copy.copy(c.info("optimizer.state.fc1.weight.exp_avg", (0, 0)))
    c.save()


@builds("relpath_absolute", "relpath_etc_passwd", "relpath_dotdot", "relpath_empty",
        "relpath_nul", "negative_offset")
def _(c, name):
    c.drop_index()
    info = c.info(LR)
    copied = os.path.join(c.outside, info.relative_path)
    shutil.copy(os.path.join(c.d, info.relative_path), copied)
    shutil.copy(copied, os.path.join(os.path.dirname(c.d), info.relative_path))
    info.relative_path = {"relpath_absolute": copied, "relpath_etc_passwd": "/etc/passwd",
                          "relpath_dotdot": "../" + info.relative_path, "relpath_empty": "",
                          "relpath_nul": info.relative_path + "\x00.evil",
                          "negative_offset": info.relative_path}[name]
    if name == "negative_offset":
        info.offset = -1
    c.save()


@builds("negative_chunk_size", "chunk_outside_tensor")
def _(c, name):
    chunk = c.md.state_dict_metadata[F32[0]].chunks[1]  # offsets [4, 0] sizes [2, 4]
    chunk.sizes = Size((-2, 4) if name == "negative_chunk_size" else (4, 4))
    c.save()


@builds("dtype_pkl_mismatch", "storage_numel_huge", "deflated_item")
def _(c, name):
    c.drop_index()
    info = c.info(*F32)
    item = c.item(info)
    if name == "dtype_pkl_mismatch":
        item = replace_record(item, "/data.pkl",
                              lambda d: d.replace(b"\nFloatStorage\n", b"\nBFloat16Storage\n"))
    elif name == "storage_numel_huge":
        def numel(i, ops):  # the int after 'cpu' in the storage's persistent id
            return long1(1 << 61) if ops[i][0].name.startswith("BININT") and any(
                op[1] == "cpu" for op in ops[i - 3:i]) else None
        item = replace_record(item, "/data.pkl", lambda d: patch_pickle(d, numel))
    else:
        item = rebuild_item(records(item), zipfile.ZIP_DEFLATED)
    c.relocate(info, item)
    c.save()


@builds("empty_data_file")
def _(c, name):
    os.truncate(os.path.join(c.d, "__1_0.distcp"), 0)


# --- running the commands --------------------------------------------------------


def limits():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def argv_for(args, c, base, command):
    if command == "load":
        plan = args.plan1 if base == "ours" else args.torch_plan1
        return [args.ckpt, "load", "--plan", plan, "--dir", c.dir_arg] + (
            ["--check", "3"] if base == "ours" else [])
    if command == "export":  # into the case's out/, which it must create whole or not at all
        return [args.ckpt, "export", c.dir_arg, "--safetensors",
                os.path.join(c.root, "out", "safetensors")]
    return [args.ckpt, command.split("-")[0], c.dir_arg] + (
        ["--json"] if command == "inspect-json" else [])


class Job:
    def __init__(self, name, command, argv, cwd, out_dir):
        self.name, self.command = name, command
        self.out = open(os.path.join(out_dir, command + ".stdout"), "w+b")
        self.err = open(os.path.join(out_dir, command + ".stderr"), "w+b")
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=self.err, preexec_fn=limits, start_new_session=True)
        self.deadline = time.monotonic() + TIMEOUT_S
        self.timed_out = False

    def poll(self):
        if self.proc.poll() is not None:
            return True
        if time.monotonic() > self.deadline:
            self.timed_out = True
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return True
        return False

    def output(self, f):
        f.seek(0)
        return f.read()


def control_byte(data):
    for at, byte in enumerate(data):
        if (byte < 0x20 and byte != 0x0A) or byte == 0x7F:
            return "byte 0x%02x at %d" % (byte, at)
    return None


def judge(job, expected, substring):
    """None if the run meets every rule, else why not."""
    out, err = job.output(job.out), job.output(job.err)
    lines = err.decode("utf-8", "backslashreplace").rstrip("\n").split("\n") if err else []
    last = lines[-1] if lines else ""
    rc = job.proc.returncode
    where = "(exit %s, last stderr line %r)" % (rc, last[:300])
    expected = expected if isinstance(expected, tuple) else (expected,)
    if job.timed_out:
        return "timed out after %d s %s" % (TIMEOUT_S, where)
    if rc < 0:
        return "killed by %s %s" % (signal.Signals(-rc).name, where)
    for stream, data in (("stdout", out), ("stderr", err)):
        bad = control_byte(data)
        if bad:
            return "%s holds a raw control %s %s" % (stream, bad, where)
    if rc not in expected:
        return "expected exit %s %s" % ("/".join(map(str, expected)), where)
    command = job.command.split("-")[0]
    if rc == 0:
        if job.command == "inspect-json":
            try:
                json.loads(out)
            except ValueError as e:
                return "stdout is not JSON (%s) %s" % (e, where)
        return None
    prefix = "fsdp-ckpt %s: " % command
    if not last.startswith(prefix):
        return "the last stderr line does not start with %r %s" % (prefix, where)
    # A load may say once that the checkpoint has no index ("note:").
    lines = [line for line in lines if not line.startswith(prefix + "note: ")]
    if sum(line.startswith("fsdp-ckpt ") for line in lines) != 1 or (
            command != "verify" and len(lines) != 1):
        return "stderr holds more than the one error line %s" % where
    if substring and substring not in err.decode("utf-8", "backslashreplace"):
        return "stderr does not mention %r %s" % (substring, where)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option in ["--ckpt", "--good", "--plan1", "--torch", "--torch-plan1", "--work"]:
        parser.add_argument(option, required=True)
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--keep", action="store_true", help="leave the crafted directories")
    parser.add_argument("--jobs", type=int, default=4, help="commands run at once")
    args = parser.parse_args()
    args.ckpt = shutil.which(args.ckpt) or os.path.abspath(args.ckpt)
    for attr in ["good", "plan1", "torch", "torch_plan1", "work"]:
        setattr(args, attr, os.path.abspath(getattr(args, attr)))
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit("unknown case(s): %s" % ", ".join(unknown))
    missing = [n for n in CASES if n not in BUILDERS]
    assert not missing, missing

    crafted, pending, results = {}, [], {}
    for name in names:
        root = os.path.join(args.work, name)
        shutil.rmtree(root, ignore_errors=True)
        base = CASES[name][0]
        c = crafted[name] = Crafted(root, args.good if base == "ours" else args.torch,
                                    keep_chunks=name == "control" or name.startswith("chunks_"))
        try:
            BUILDERS[name](c, name)
        except Exception as e:  # a fixture that changed under the helpers
            results.update({(name, cmd): "could not craft the case: %r" % e for cmd in COMMANDS})
            continue
        os.makedirs(os.path.join(root, "out"))
        pending += [(name, command, argv_for(args, c, base, command)) for command in COMMANDS]

    running = []
    while pending or running:
        while pending and len(running) < args.jobs:
            name, command, argv = pending.pop(0)
            c = crafted[name]
            running.append(Job(name, command, argv, c.cwd, os.path.join(c.root, "out")))
        for job in [j for j in running if j.poll()]:
            running.remove(job)
            _, load, verify, inspect, substring = CASES[job.name]
            # export reads only the model's tensors, through .metadata: the load's
            # refusal, or a result (a case may lie where export does not look).
            as_tuple = lambda e: e if isinstance(e, tuple) else (e,)
            expected = {"load": load, "verify": verify,
                        "export": tuple(sorted(set((OK,) + as_tuple(load))))}.get(job.command, inspect)
            results[job.name, job.command] = judge(job, expected, substring)
            job.out.close()
            job.err.close()
        time.sleep(0.01)

    passed = failed = 0
    for name in names:
        for command in COMMANDS:
            why = results[name, command]
            if why is None and os.path.exists(crafted[name].marker):
                why = "a pickle global was executed (%s exists)" % crafted[name].marker
            if why is None:
                passed += 1
                print("PASS %s %s" % (name, command))
            else:
                failed += 1
                print("FAIL %s %s: %s" % (name, command, why))
        if not args.keep:
            shutil.rmtree(crafted[name].root, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
