#!/usr/bin/env python3
"""Makes Hugging Face model directories out of one model.safetensors, for the
--from-hf tests: renamed, sharded, mismatched and hostile ones.

usage: safetensors_cases.py SOURCE_FILE OUT_DIR CASE
Only the standard library: the header is parsed and rewritten here, the
tensors' bytes are copied as they are.
"""
import json
import os
import struct
import sys


def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    return header.get("__metadata__"), tensors, body


def pack(tensors, body_of, metadata=None):
    """A file of `tensors` ({name: {dtype, shape}}) with bytes body_of(name)."""
    header, blobs, at = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, spec in tensors.items():
        blob = body_of(name)
        header[name] = {"dtype": spec["dtype"], "shape": spec["shape"],
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def raw(header_text, body=b""):
    return struct.pack("<Q", len(header_text)) + header_text + body


def main():
    source, out, case = sys.argv[1:4]
    metadata, tensors, body = read(source)
    blob = {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in tensors.items()}
    os.makedirs(out, exist_ok=True)
    single = os.path.join(out, "model.safetensors")
    names = sorted(tensors)
    first = names[0]

    def write(path, data):
        with open(path, "wb") as f:
            f.write(data)

    def header_with(change):
        """The source's header as JSON text after change(header), the bytes unchanged."""
        header = {k: dict(v) for k, v in tensors.items()}
        change(header)
        return json.dumps(header).encode()

    if case == "prefix":  # every name under model., as transformers' LlamaForCausalLM has it
        renamed = {"model." + k: v for k, v in tensors.items()}
        write(single, pack(renamed, lambda n: blob[n[6:]], metadata))
    elif case == "sharded":  # one tensor per file, and the index
        weight_map = {}
        for i, name in enumerate(names):
            file = f"model-{i + 1:05d}-of-{len(names):05d}.safetensors"
            write(os.path.join(out, file), pack({name: tensors[name]}, blob.get, metadata))
            weight_map[name] = file
        write(os.path.join(out, "model.safetensors.index.json"),
              json.dumps({"metadata": {"total_size": len(body)}, "weight_map": weight_map}).encode())
    elif case == "missing":  # the first tensor left out
        write(single, pack({k: v for k, v in tensors.items() if k != first}, blob.get))
    elif case == "shape":  # the first tensor's shape transposed (same bytes)
        changed = dict(tensors)
        changed[first] = dict(tensors[first], shape=list(reversed(tensors[first]["shape"])))
        if changed[first]["shape"] == tensors[first]["shape"]:
            changed[first]["shape"] = [1] + tensors[first]["shape"]
        write(single, pack(changed, blob.get))
    elif case == "int-dtype":  # the first tensor as I32 (same bytes)
        changed = dict(tensors)
        changed[first] = dict(tensors[first], dtype="I32")
        write(single, pack(changed, blob.get))
    elif case == "bf16":  # every tensor cast to bf16 by truncation (a cast on load back)
        def to_bf16(name):
            values = struct.unpack(f"<{len(blob[name]) // 4}I", blob[name])
            return struct.pack(f"<{len(values)}H", *[v >> 16 for v in values])
        write(single, pack({k: dict(v, dtype="BF16") for k, v in tensors.items()}, to_bf16))
    elif case == "empty":
        write(single, b"")
    elif case == "short-length":
        write(single, b"\x10\x00\x00")
    elif case == "length-past-end":
        write(single, struct.pack("<Q", 1 << 20) + b"{}")
    elif case == "length-huge":
        write(single, struct.pack("<Q", (1 << 64) - 8) + b"{}")
    elif case == "not-json":
        write(single, raw(b"{\"a\": [1, 2"))
    elif case == "not-object":
        write(single, raw(b"[1, 2, 3]"))
    elif case == "deep":
        write(single, raw(b"[" * 100000 + b"]" * 100000))
    elif case == "repeated":
        spec = tensors[first]
        entry = json.dumps({"dtype": spec["dtype"], "shape": spec["shape"],
                            "data_offsets": spec["data_offsets"]})
        text = ("{\"%s\": %s, \"%s\": %s}" % (first, entry, first, entry)).encode()
        write(single, raw(text, body))
    elif case == "overlap":
        def change(h):
            second = names[1]
            h[second]["data_offsets"] = [0, h[second]["data_offsets"][1] -
                                         h[second]["data_offsets"][0]]
            h[first]["data_offsets"] = [0, h[first]["data_offsets"][1] -
                                        h[first]["data_offsets"][0]]
        write(single, raw(header_with(change), body))
    elif case == "outside":
        def change(h):
            size = h[first]["data_offsets"][1] - h[first]["data_offsets"][0]
            h[first]["data_offsets"] = [len(body), len(body) + size]
        write(single, raw(header_with(change), body))
    elif case == "wrong-size":
        def change(h):
            h[first]["data_offsets"] = [h[first]["data_offsets"][0],
                                        h[first]["data_offsets"][1] - 2]
        write(single, raw(header_with(change), body))
    elif case == "negative-dim":
        write(single, raw(header_with(lambda h: h[first].update(shape=[-1, 3])), body))
    elif case == "float-dim":
        write(single, raw(header_with(lambda h: h[first].update(shape=[2.5])), body))
    elif case == "many-dims":
        write(single, raw(header_with(lambda h: h[first].update(shape=[1] * 65)), body))
    elif case == "unknown-dtype":
        write(single, raw(header_with(lambda h: h[first].update(dtype="F4")), body))
    elif case == "truncated":  # the data cut short: the last tensor's end is past the file
        write(single, pack(tensors, blob.get)[:-4])
    elif case == "trailing":  # bytes after the last tensor: a polyglot file hides there
        write(single, pack(tensors, blob.get) + b"\0" * 8)
    elif case == "gap":  # 8 bytes before the first tensor belong to none
        def change(h):
            for v in h.values():
                v["data_offsets"] = [v["data_offsets"][0] + 8, v["data_offsets"][1] + 8]
        write(single, raw(header_with(change), b"\0" * 8 + body))
    elif case == "bad-utf8":
        write(single, raw(b"{\"\xff\xfe\": 1}"))
    elif case in ("index-escape", "index-absent", "index-not-object", "index-link"):
        file = "model-00001-of-00001.safetensors"
        write(os.path.join(out, file), pack(tensors, blob.get))
        weight_map = {n: file for n in names}
        if case == "index-escape":
            weight_map[first] = "../" + file
        elif case == "index-absent":
            weight_map["not.in.the.file"] = file
        elif case == "index-link":
            outside = os.path.join(os.path.dirname(os.path.abspath(out)), "outside.safetensors")
            write(outside, pack(tensors, blob.get))
            os.symlink(outside, os.path.join(out, "link.safetensors"))
            weight_map = {n: "link.safetensors" for n in names}
        index = {"weight_map": weight_map} if case != "index-not-object" else {"weight_map": [1]}
        write(os.path.join(out, "model.safetensors.index.json"), json.dumps(index).encode())
    elif case == "fifo":
        os.mkfifo(single)
    else:
        sys.exit(f"unknown case {case}")


if __name__ == "__main__":
    main()
