"""A Hugging Face hub cache as huggingface_hub.snapshot_download leaves it, built offline:
<root>/models--fsdp--tiny/{blobs/<hash>, refs/main, snapshots/<rev>/<file> -> ../../blobs/<hash>}
(large files' blobs named by their sha256, small ones by their git blob sha1, each snapshot
file a relative link as huggingface_hub makes it). The safetensors files are written by the
safetensors package from the tensors of SOURCE (a model.safetensors).

  hub_snapshot.py SOURCE ROOT CASE

prints the snapshot directory. CASE: single, sharded, absolute (a link by absolute path, as
huggingface_hub falls back to), and refusals: outside (a link to a file beside the cache),
blob-link (the blob is itself a link to another blob), blob-dir, blob-fifo, chain (a snapshot
file linked to another snapshot file that links to the blob), dangling (a link to a blob that
is not there).
"""
import hashlib
import json
import os
import sys

from safetensors.torch import load_file, save_file

REPO = "models--fsdp--tiny"
REV = "0123456789abcdef0123456789abcdef01234567"


def main():
    source, root, case = sys.argv[1:4]
    repo = os.path.join(root, REPO)
    blobs = os.path.join(repo, "blobs")
    snapshot = os.path.join(repo, "snapshots", REV)
    os.makedirs(blobs)
    os.makedirs(snapshot)
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(REV)

    def blob(data, lfs):
        """The blob of `data`: sha256 (an LFS file) or git's blob sha1 (a small file)."""
        name = (hashlib.sha256(data).hexdigest() if lfs else
                hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        with open(os.path.join(blobs, name), "wb") as f:
            f.write(data)
        return name

    def link(file, name, absolute=False):
        target = os.path.join(blobs, name) if absolute else os.path.join("..", "..", "blobs", name)
        os.symlink(target, os.path.join(snapshot, file))

    def safetensors_bytes(tensors):
        path = os.path.join(root, "scratch.safetensors")
        save_file(tensors, path, metadata={"format": "pt"})
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
        return data

    tensors = load_file(source)
    config = json.dumps({"model_type": "fsdp-test"}).encode()
    link("config.json", blob(config, lfs=False))
    whole = safetensors_bytes(tensors)
    if case == "single":
        link("model.safetensors", blob(whole, lfs=True))
    elif case == "absolute":
        link("model.safetensors", blob(whole, lfs=True), absolute=True)
    elif case == "sharded":
        names = sorted(tensors)
        shards = [names[:1], names[1:]]
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            link(file, blob(safetensors_bytes({n: tensors[n] for n in shard}), lfs=True))
            weight_map.update({n: file for n in shard})
        index = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}).encode()
        link("model.safetensors.index.json", blob(index, lfs=False))
    elif case == "outside":
        outside = os.path.join(root, "outside.safetensors")
        with open(outside, "wb") as f:
            f.write(whole)
        os.symlink(os.path.join("..", "..", "..", "outside.safetensors"),
                   os.path.join(snapshot, "model.safetensors"))
    elif case == "blob-link":
        real = blob(whole, lfs=True)
        name = "f" * 64
        os.symlink(real, os.path.join(blobs, name))
        link("model.safetensors", name)
    elif case == "blob-dir":
        name = "d" * 64
        os.mkdir(os.path.join(blobs, name))
        link("model.safetensors", name)
    elif case == "blob-fifo":
        name = "e" * 64
        os.mkfifo(os.path.join(blobs, name))
        link("model.safetensors", name)
    elif case == "chain":
        link("weights.safetensors", blob(whole, lfs=True))
        os.symlink("weights.safetensors", os.path.join(snapshot, "model.safetensors"))
    elif case == "dangling":
        link("model.safetensors", "0" * 64)
    else:
        sys.exit(f"unknown case {case}")
    print(snapshot)


if __name__ == "__main__":
    main()
