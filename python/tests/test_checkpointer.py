"""fsdp_mlir.Checkpointer in one process: buffers, allocate, tensor views,
bind (and every way it refuses), fill/check, save, save_async, load, verify,
inspect, progress and the typed errors."""

import ctypes
import errno
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time

import pytest

import fsdp_mlir as fm
from conftest import example

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

ROLES = ["main_weight", "model_weight", "main_grad", "exp_avg", "exp_avg_sq"]


def fnv1a32(key):
    h = 0x811C9DC5
    for byte in key.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def seed_value(key, i, seed):
    """docs/TestValues.md: element i of key k for SEED, as a float."""
    n = ((i * 7919 + seed * 104729 + fnv1a32(key)) & 0xFFFFFFFFFFFFFFFF) % 65521 - 32760
    return n / 256


@pytest.fixture
def plan1(plans):
    return plans("worked-example", 1)


@pytest.fixture
def ck(plan1):
    c = fm.Checkpointer(plan1)
    c.allocate()
    return c


# -- buffers, allocate, tensor -------------------------------------------------

def test_buffers_as_in_the_design(plan1):
    ck = fm.Checkpointer(plan1, rank=0, world_size=1, comm=None)
    buffers = ck.buffers
    assert [b["role"] for b in buffers] == ROLES
    assert buffers[0] == {"group": 0, "role": "main_weight", "dtype": "float32",
                          "elements": 48, "aliases": None}
    assert [b["dtype"] for b in buffers] == ["float32", "bfloat16", "bfloat16", "float32",
                                            "float32"]
    assert all(b["group"] == 0 and b["elements"] == 48 and b["aliases"] is None
               for b in buffers)
    assert ck.rank == 0 and ck.world_size == 1 and ck.device is None


def test_buffers_of_a_rank_of_four(plans):
    plan = plans("worked-example", 4)
    # comm=None with world_size > 1: a rank without a communicator.
    for rank in range(4):
        ck = fm.Checkpointer(plan, rank=rank, world_size=4, comm=None)
        assert ck.rank == rank and ck.world_size == 4
        assert [b["elements"] for b in ck.buffers] == [12] * 5
        ck.allocate()
        ck.fill(3)  # local: works without a communicator
        with pytest.raises(ValueError, match="no communicator"):
            ck.check(3)
        with pytest.raises(ValueError, match="no communicator"):
            ck.save("/nonexistent/never")


def test_aliases(tmp_path):
    # f32 parameters with f32 main weights: model_weight is main_weight's
    # memory.
    description = json.load(open(example("worked-example.json")))
    for param in description["module"]["params"]:
        param["dtype"] = "f32"
    try:
        plan = fm.compile(description, tmp_path, mesh="dp=1")
    except FileNotFoundError:
        pytest.skip("fsdp-translate/fsdp-opt not found")
    ck = fm.Checkpointer(plan)
    aliased = [b for b in ck.buffers if b["aliases"]]
    assert aliased and all(b["role"] == "model_weight" and b["aliases"] == "main_weight"
                           for b in aliased)
    ck.allocate()
    g = aliased[0]["group"]
    assert ck.tensor(g, "model_weight").data_ptr() == ck.tensor(g, "main_weight").data_ptr()
    # Binding the alias binds main_weight; another tensor than main_weight's is refused.
    t = torch.zeros(aliased[0]["elements"])
    ck.bind(g, "main_weight", t)
    ck.bind(g, "model_weight", t)
    with pytest.raises(ValueError, match="aliases main_weight"):
        ck.bind(g, "model_weight", torch.zeros(aliased[0]["elements"]))
    assert ck.tensor(g, "model_weight").data_ptr() == t.data_ptr()
    bind_all(ck)
    ck.bind(g, "model_weight", ck.tensor(g, "main_weight"))
    ck.fill(4)
    ck.save(tmp_path / "ck")
    ck.fill(0)
    ck.load(tmp_path / "ck")
    ck.check(4)
    # An aliased model_weight is main_weight: nothing to refresh.
    with pytest.raises(ValueError, match=f"group {g} has no model_weight of its own"):
        ck.refresh_model_weights(g)


def test_allocate_zeroed_and_tensor_is_a_view(ck):
    for b in ck.buffers:
        t = ck.tensor(b["group"], b["role"])
        assert t.dtype == getattr(torch, b["dtype"]) and t.shape == (b["elements"],)
        assert t.device.type == "cpu" and t.is_contiguous()
        assert torch.count_nonzero(t) == 0
    assert ck.device == "cpu"
    view = ck.tensor(0, "exp_avg")
    view[:] = 5
    assert torch.equal(ck.tensor(0, "exp_avg"), torch.full((48,), 5.0))
    assert ck.tensor(0, "exp_avg").data_ptr() == view.data_ptr()


def test_tensor_outlives_the_checkpointer(plan1):
    import gc

    ck = fm.Checkpointer(plan1)
    ck.allocate()
    ck.fill(2)
    t = ck.tensor(0, "main_weight")
    expected = t.clone()
    del ck
    gc.collect()
    assert torch.equal(t, expected)


def test_tensor_before_memory(plan1):
    ck = fm.Checkpointer(plan1)
    with pytest.raises(ValueError, match="allocate"):
        ck.tensor(0, "main_weight")
    with pytest.raises(ValueError, match="no buffer"):
        fm.Checkpointer(plan1).bind(7, "main_weight", torch.zeros(48))
    with pytest.raises(ValueError, match="unknown buffer role"):
        ck.bind(0, "weights", torch.zeros(48))


def test_fill_values_match_the_design(plans, plan1):
    ck = fm.Checkpointer(plan1)
    ck.allocate()
    ck.fill(7)
    layout = json.load(open(os.path.join(os.path.dirname(plan1), "layout.json")))
    main = ck.tensor(0, "main_weight")
    model = ck.tensor(0, "model_weight")
    for param in layout["groups"][0]["params"]:
        n = 1
        for d in param["shape"]:
            n *= d
        want = torch.tensor([seed_value("model." + param["fqn"], i, 7) for i in range(n)])
        got = main[param["offset"]:param["offset"] + n]
        assert torch.equal(got, want), param["fqn"]
        # model_weight is main_weight cast (round to nearest even).
        assert torch.equal(model[param["offset"]:param["offset"] + n], want.to(torch.bfloat16))
    ck.check(7)
    with pytest.raises(fm.CheckpointError, match="check failed"):
        ck.check(8)
    for bad in (-1, 2**31, 1.5, True):
        with pytest.raises(ValueError):
            ck.fill(bad)


def test_refresh_model_weights(plan1):
    """The runtime's cast (round to nearest even, overflow to inf) matches torch's .to()."""
    ck = fm.Checkpointer(plan1)
    ck.allocate()
    main, model = ck.tensor(0, "main_weight"), ck.tensor(0, "model_weight")
    assert model.dtype == torch.bfloat16
    gen = torch.Generator().manual_seed(5)
    values = torch.randn(main.numel(), generator=gen) * 1e3
    values[:4] = torch.tensor([3.4e38, -float("inf"), 1.0 + 2**-8, 1.0 + 3 * 2**-8])
    main.copy_(values)
    ck.refresh_model_weights()
    assert torch.equal(model.view(torch.int16), values.to(torch.bfloat16).view(torch.int16))
    main.zero_()
    ck.refresh_model_weights(0)
    assert not model.any()
    with pytest.raises(ValueError, match="group 7 has no model_weight of its own"):
        ck.refresh_model_weights(7)


# -- bind ---------------------------------------------------------------------

def bind_all(ck, make=None):
    tensors = {}
    for b in ck.buffers:
        if b["aliases"]:
            continue
        dtype = getattr(torch, b["dtype"])
        t = make(b) if make else torch.zeros(b["elements"], dtype=dtype)
        ck.bind(b["group"], b["role"], t)
        tensors[(b["group"], b["role"])] = t
    return tensors


def test_bind_is_zero_copy(plan1):
    ck = fm.Checkpointer(plan1)
    tensors = bind_all(ck)
    ck.fill(4)
    ck.check(4)
    assert torch.count_nonzero(tensors[(0, "main_weight")]) > 0
    for key, t in tensors.items():
        assert ck.tensor(*key).data_ptr() == t.data_ptr()
    # The caller's writes are what a save sees.
    tensors[(0, "exp_avg")].add_(1)
    with pytest.raises(fm.CheckpointError):
        ck.check(4)


def test_bind_keeps_the_object_alive(plan1):
    import gc

    ck = fm.Checkpointer(plan1)
    bind_all(ck)  # the tensors go out of scope here
    gc.collect()
    ck.fill(11)
    ck.check(11)


def test_bind_replaces_one_allocated_buffer(ck):
    t = torch.zeros(48)
    ck.bind(0, "exp_avg", t)
    ck.fill(3)
    ck.check(3)
    assert torch.count_nonzero(t) > 0
    assert ck.tensor(0, "main_weight").data_ptr() != t.data_ptr()


def test_bind_shapes_and_parameters(plan1):
    ck = fm.Checkpointer(plan1)
    tensors = bind_all(ck)
    two_d = torch.zeros(4, 12)
    ck.bind(0, "main_weight", two_d)  # any shape of exactly the elements
    p = torch.nn.Parameter(torch.zeros(48))  # requires grad: bound through detach
    ck.bind(0, "exp_avg", p)
    ck.fill(5)
    ck.check(5)
    assert torch.count_nonzero(two_d) > 0 and torch.count_nonzero(p.detach()) > 0
    # A contiguous slice of a larger tensor (a DLPack byte offset).
    big = torch.zeros(100)
    ck.bind(0, "exp_avg_sq", big[10:58])
    ck.fill(6)
    ck.check(6)
    assert torch.count_nonzero(big[:10]) == 0 and torch.count_nonzero(big[58:]) == 0
    del tensors


def test_bind_refuses_bad_tensors(ck):
    cases = [
        (torch.zeros(48, dtype=torch.float64), "float32, not float64"),
        (torch.zeros(48, dtype=torch.bfloat16), "float32, not bfloat16"),
        (torch.zeros(47), "48 elements, not 47"),
        (torch.zeros(49), "48 elements, not 49"),
        (torch.zeros(96)[::2], "not contiguous"),
        (torch.zeros(12, 4).t(), "not contiguous"),
        (torch.zeros(48, device="meta"), "meta"),
    ]
    for tensor, message in cases:
        with pytest.raises(ValueError, match=message):
            ck.bind(0, "main_weight", tensor)
    for obj in ["tensor", 3, [0.0] * 48, None]:
        with pytest.raises(TypeError):
            ck.bind(0, "main_weight", obj)
    # Nothing was bound by the failures.
    ck.fill(1)
    ck.check(1)


def _bind_all(ck):
    """Every buffer bound to a fresh torch tensor of its own: {(group, role): tensor}."""
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    bound = {}
    for b in ck.buffers:
        if b["aliases"]:
            continue
        t = torch.zeros(b["elements"], dtype=dtypes[b["dtype"]])
        ck.bind(b["group"], b["role"], t)
        bound[(b["group"], b["role"])] = t
    return bound


def test_bound_memory_freed_or_repointed_is_refused(tmp_path, plan1):
    """torch may free a bound tensor's memory (untyped_storage().resize_(0), as FSDP frees
    parameters) or re-point it (t.data = other): every call that touches the buffers refuses
    with a ValueError naming the buffer, instead of reading or writing memory that is not the
    tensor's."""
    ck = fm.Checkpointer(plan1)
    bound = _bind_all(ck)
    ck.fill(1)
    ck.save(tmp_path / "good")
    main = bound[(0, "main_weight")]
    main.untyped_storage().resize_(0)
    for call in (lambda: ck.fill(2), lambda: ck.check(1), lambda: ck.load(tmp_path / "good"),
                 lambda: ck.save(tmp_path / "freed"), lambda: ck.save_async(tmp_path / "freed"),
                 lambda: ck.refresh_model_weights(), lambda: ck.tensor(0, "main_weight")):
        with pytest.raises(ValueError, match="group 0 main_weight has lost its memory"):
            call()
    assert not (tmp_path / "freed").exists()
    # Bound again, all is well.
    fresh = torch.zeros(main.numel(), dtype=main.dtype)
    ck.bind(0, "main_weight", fresh)
    ck.load(tmp_path / "good")
    ck.check(1)
    # t.data = other: the tensor now holds other memory.
    exp_avg = bound[(0, "exp_avg")]
    exp_avg.data = torch.ones_like(exp_avg)
    with pytest.raises(ValueError, match="group 0 exp_avg points at other memory"):
        ck.load(tmp_path / "good")
    exp_avg.data = torch.zeros(exp_avg.numel(), dtype=torch.float16)
    with pytest.raises(ValueError, match="group 0 exp_avg is now torch.float16"):
        ck.fill(1)


def test_overlapping_bindings_are_refused(plan1):
    """One tensor bound to two roles would save one as the other."""
    ck = fm.Checkpointer(plan1)
    bound = _bind_all(ck)
    with pytest.raises(ValueError, match="group 0 exp_avg overlaps the memory bound as group 0 "
                                         "main_weight"):
        ck.bind(0, "exp_avg", bound[(0, "main_weight")])
    halves = torch.zeros(2 * bound[(0, "exp_avg_sq")].numel())
    ck.bind(0, "exp_avg_sq", halves[:48])
    with pytest.raises(ValueError, match="overlaps"):
        ck.bind(0, "exp_avg", halves[24:72])
    ck.bind(0, "exp_avg", halves[48:])  # beside it: fine
    ck.bind(0, "exp_avg_sq", halves[:48])  # the same role again: a rebind, fine
    ck.fill(4)
    ck.check(4)


def test_thread_counts_are_bounded(tmp_path, ck):
    """threads as the CLI takes them (0 for the default, 1-1024): a ValueError, never an abort
    or gigabytes of worker stacks."""
    for bad in (50000, 10**6, -1, 1.5, "4", True):
        with pytest.raises(ValueError, match="threads must be an integer from 0"):
            ck.save(tmp_path / "ck", threads=bad)
    assert not (tmp_path / "ck").exists()
    ck.fill(1)
    ck.save(tmp_path / "ck", threads=1024)
    with pytest.raises(ValueError, match="threads must be"):
        ck.load(tmp_path / "ck", threads=10**6)
    with pytest.raises(ValueError, match="threads must be"):
        ck.save_async(tmp_path / "other", threads=2**31)
    ck.load(tmp_path / "ck", threads=3)
    with pytest.raises(ValueError, match="threads must be 0"):
        fm._core.Checkpointer.save(ck._core, str(tmp_path / "raw"), False, 1.0, 5000, False,
                                   None, None, False)


def test_reserved_write_blocks_serve_later_saves(tmp_path, ck):
    """reserve_write_blocks makes a save's direct-I/O blocks up front: saves after it, with
    as many threads or more (a larger set then), write checkpoints that load back exactly; a
    bad thread count is a ValueError, as for a save."""
    ck.reserve_write_blocks(threads=2)
    ck.fill(3)
    ck.save(tmp_path / "a", threads=2)
    ck.fill(4)
    ck.save(tmp_path / "b", threads=4)
    ck.load(tmp_path / "a")
    ck.check(3)
    ck.load(tmp_path / "b")
    ck.check(4)
    with pytest.raises(ValueError, match="threads must be an integer from 0"):
        ck.reserve_write_blocks(threads=10**6)


def test_reserved_snapshot_serves_async_saves(tmp_path, ck):
    """reserve_snapshot(threads) makes the async save's snapshot up front: async saves after
    it return before their buffers change and write what the buffers held then; a bad thread
    count is a ValueError, as for a save."""
    with pytest.raises(ValueError, match="threads must be an integer from 0"):
        ck.reserve_snapshot(threads=-1)
    ck.reserve_snapshot(threads=2)
    for seed, name in ((5, "a"), (6, "b")):
        ck.fill(seed)
        pending = ck.save_async(tmp_path / name, threads=2)
        ck.fill(seed + 10)  # training goes on while it writes
        pending.wait()
    for seed, name in ((5, "a"), (6, "b")):
        ck.load(tmp_path / name)
        ck.check(seed)


class _Stop(Exception):
    pass


def test_progress_callback_exception_cancels_and_is_raised(tmp_path, ck):
    """An exception in a progress callback (a Ctrl-C in it too) cancels the operation: nothing
    is committed, and that exception is what the call raises."""
    def stop(done, total):
        raise _Stop(f"stopped at {done} of {total}")

    ck.fill(5)
    with pytest.raises(_Stop, match="stopped at"):
        ck.save(tmp_path / "ck", progress=stop)
    assert not (tmp_path / "ck").exists()
    handle = ck.save_async(tmp_path / "ck", progress=stop)
    with pytest.raises(_Stop):
        handle.wait()
    assert not (tmp_path / "ck").exists()

    def interrupt(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ck.save(tmp_path / "ck", progress=interrupt)
    assert not (tmp_path / "ck").exists()
    ck.save(tmp_path / "ck")
    ck.fill(0)
    with pytest.raises(_Stop):
        ck.load(tmp_path / "ck", progress=stop)
    ck.load(tmp_path / "ck", progress=lambda done, total: None)
    ck.check(5)


def test_bind_dlpack_objects(plan1):
    ck = fm.Checkpointer(plan1)
    bind_all(ck)
    a = np.zeros(48, dtype=np.float32)
    ck.bind(0, "main_weight", a)  # numpy: __dlpack__
    capsule_source = torch.zeros(48)
    ck.bind(0, "exp_avg", capsule_source.__dlpack__())  # a raw DLPack capsule
    ck.fill(9)
    ck.check(9)
    assert np.count_nonzero(a) > 0 and torch.count_nonzero(capsule_source) > 0
    # The C++ checks for objects that are not torch tensors.
    with pytest.raises(ValueError, match="float32, not float64"):
        ck.bind(0, "main_weight", np.zeros(48))
    with pytest.raises(ValueError, match="48 elements, not 40"):
        ck.bind(0, "main_weight", np.zeros(40, dtype=np.float32))
    with pytest.raises(ValueError, match="not contiguous"):
        ck.bind(0, "main_weight", np.zeros(96, dtype=np.float32)[::2])
    # A buffer's own DLPack view binds too.
    other = fm.Checkpointer(plan1)
    other.allocate()
    ck.bind(0, "exp_avg_sq", other.dlpack(0, "exp_avg_sq"))


def test_cuda_tensor(plan1):
    ck = fm.Checkpointer(plan1)
    if not fm.cuda_built:
        # The check comes before any CUDA call: a meta-free stand-in is
        # not needed, the device type alone decides.
        if torch.cuda.is_available():
            with pytest.raises(ValueError, match="CUDA"):
                ck.bind(0, "main_weight", torch.zeros(48, device="cuda"))
        return
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    tensors = bind_all(ck, lambda b: torch.zeros(b["elements"], dtype=getattr(torch, b["dtype"]),
                                                device="cuda"))
    assert ck.device == "cuda:0"
    ck.fill(3)
    ck.check(3)
    host = fm.Checkpointer(plan1)
    host.allocate()
    host.fill(3)
    for (g, role), t in tensors.items():
        assert torch.equal(t.cpu(), host.tensor(g, role)), role
    # Every buffer on one device.
    with pytest.raises(ValueError, match="one device"):
        ck.bind(0, "main_weight", torch.zeros(48))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


def fake_dlpack(device_type, elements, code=2, bits=32):
    """A DLPack capsule claiming memory on `device_type` (2: CUDA) that is
    never touched: what the extension's own checks see."""
    shape = (ctypes.c_int64 * 1)(elements)
    managed = _DLManagedTensor()
    managed.dl_tensor.data = 0x1000
    managed.dl_tensor.device = _DLDevice(device_type, 0)
    managed.dl_tensor.ndim = 1
    managed.dl_tensor.dtype = _DLDataType(code, bits, 1)
    managed.dl_tensor.shape = shape
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new(ctypes.addressof(managed), b"dltensor", None)
    return capsule, (managed, shape)  # the second keeps the struct alive


def test_cuda_dlpack_is_checked_before_use(plan1):
    if fm.cuda_built and torch.cuda.is_available():
        pytest.skip("a GPU is here: test_cuda_tensor binds real CUDA tensors")
    # No CUDA in the build, or no GPU: an error naming CUDA, nothing bound.
    ck = fm.Checkpointer(plan1)
    capsule, keep = fake_dlpack(2, 48)
    with pytest.raises((ValueError, fm.CheckpointError), match="CUDA"):
        ck.bind(0, "main_weight", capsule)
    assert ck.device is None
    ck.allocate()
    # Once the buffers are on the host, a CUDA tensor is refused as such.
    capsule, keep1 = fake_dlpack(2, 48)
    with pytest.raises(ValueError, match="CUDA|one device"):
        ck.bind(0, "main_weight", capsule)
    # Other devices are refused by name.
    capsule, keep2 = fake_dlpack(8, 48)  # Vulkan
    with pytest.raises(ValueError, match="DLPack device type 8"):
        ck.bind(0, "main_weight", capsule)
    # And the dtype check reads DLPack's codes (bfloat16: code 4).
    capsule, keep3 = fake_dlpack(1, 48, code=4, bits=16)
    with pytest.raises(ValueError, match="float32, not bfloat16"):
        ck.bind(0, "main_weight", capsule)
    ck.fill(1)
    ck.check(1)


def test_cuda_device_without_cuda(plan1):
    if fm.cuda_built:
        pytest.skip("this build has CUDA")
    with pytest.raises(ValueError, match="CUDA"):
        fm.Checkpointer(plan1, device="cuda")


# -- save, load, verify, inspect ----------------------------------------------

def test_save_load_round_trip(tmp_path, ck, plan1):
    ck.fill(21)
    stats = ck.save(tmp_path / "ck", step=5.0)
    assert set(stats) == {"rank", "bytes", "items", "seconds", "stall_seconds",
                          "bytes_read_storage", "bytes_written_storage", "bytes_from_peers"}
    assert stats["bytes"] > 0 and stats["items"] > 0 and stats["bytes_written_storage"] > 0
    assert fm.verify(tmp_path / "ck") is True

    other = fm.Checkpointer(plan1)
    other.allocate()
    result = other.load(str(tmp_path / "ck"))
    assert result["step"] == 5.0 and result["bytes"] > 0
    other.check(21)
    for b in ck.buffers:
        if b["role"] != "main_grad":  # gradients are not saved
            assert torch.equal(other.tensor(0, b["role"]), ck.tensor(0, b["role"])), b["role"]


def test_load_reading_through_the_page_cache(tmp_path, ck, plan1):
    # direct_reads=False (cold ranges through the page cache, not direct I/O) loads the same
    # values; which way the bytes come is tested in the runtime's unit tests.
    ck.fill(23)
    ck.save(tmp_path / "ck")
    for name in os.listdir(tmp_path / "ck"):
        fd = os.open(tmp_path / "ck" / name, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    other = fm.Checkpointer(plan1)
    other.allocate()
    result = other.load(tmp_path / "ck", direct_reads=False)
    other.check(23)
    # Nothing came by direct I/O, so nothing landed straight in the buffers.
    assert result["bytes_read_in_place"] == 0 < result["bytes_read_storage"], result
    with pytest.raises(TypeError):
        other.load(tmp_path / "ck", direct_read=False)  # a misspelt option is an error


def test_load_without_syncing_model_weights(tmp_path, ck, plan1):
    ck.fill(2)
    ck.save(tmp_path / "ck")
    other = fm.Checkpointer(plan1)
    other.allocate()
    other.load(tmp_path / "ck", sync_model_weights=False)
    assert torch.count_nonzero(other.tensor(0, "model_weight")) == 0
    other.load(tmp_path / "ck", sync_model_weights=True)
    assert torch.equal(other.tensor(0, "model_weight"), ck.tensor(0, "model_weight"))


def test_save_over_an_existing_checkpoint(tmp_path, ck):
    ck.fill(1)
    ck.save(tmp_path / "ck")
    ck.fill(2)
    with pytest.raises(ValueError, match="already exists.*overwrite=True"):
        ck.save(tmp_path / "ck")
    ck.save(tmp_path / "ck", overwrite=True)
    ck.fill(0)
    ck.load(tmp_path / "ck")
    ck.check(2)


def test_overwrite_replaces_only_a_checkpoint(tmp_path, ck):
    """overwrite=True never deletes what is not a checkpoint: a directory of the user's files,
    a regular file, an empty path; an export never replaces the checkpoint it reads."""
    home = tmp_path / "home"
    (home / "sub").mkdir(parents=True)
    (home / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="without a .metadata.*overwrite=True replaces only"):
        ck.save(home, overwrite=True)
    assert (home / "notes.txt").read_text() == "precious" and (home / "sub").is_dir()
    (tmp_path / "file").write_text("keep")
    with pytest.raises(ValueError, match="a regular file, not a checkpoint"):
        ck.save(tmp_path / "file", overwrite=True)
    assert (tmp_path / "file").read_text() == "keep"
    with pytest.raises(ValueError, match="empty path"):
        ck.save("", overwrite=True)
    ck.fill(3)
    ck.save(tmp_path / "ck")
    with pytest.raises(ValueError, match="inside the checkpoint it reads"):
        fm.export_safetensors(tmp_path / "ck", tmp_path / "ck", overwrite=True)
    with pytest.raises(ValueError, match="not an export of ours"):
        fm.export_safetensors(tmp_path / "ck", home, overwrite=True)
    assert (home / "notes.txt").read_text() == "precious"
    ck.fill(0)
    ck.load(tmp_path / "ck")
    ck.check(3)


def test_load_missing_is_not_found(tmp_path, ck):
    with pytest.raises(fm.NotFound) as caught:
        ck.load(tmp_path / "missing")
    assert isinstance(caught.value, fm.CheckpointError) and caught.value.kind == "not found"
    with pytest.raises(fm.NotFound):
        fm.verify(tmp_path / "missing")
    with pytest.raises(fm.NotFound):
        fm.inspect(tmp_path / "missing")


def flip_a_data_byte(directory):
    data = sorted(f for f in os.listdir(directory) if f.endswith(".distcp"))[0]
    path = os.path.join(directory, data)
    with open(path, "r+b") as f:
        blob = bytearray(f.read())
        # A byte inside the first item's data: past the zip local header.
        position = blob.index(b"PK\x03\x04") + 4096 + 10
        position = min(position, len(blob) - 1)
        f.seek(position)
        f.write(bytes([blob[position] ^ 0xFF]))


def test_corrupt_checkpoint(tmp_path, ck):
    ck.fill(5)
    ck.save(tmp_path / "ck")
    flip_a_data_byte(tmp_path / "ck")
    with pytest.raises(fm.Corrupt) as caught:
        fm.verify(tmp_path / "ck")
    assert caught.value.kind == "corrupt"
    with pytest.raises(fm.Corrupt):
        ck.load(tmp_path / "ck")


def test_busy_target(tmp_path, ck):
    ck.fill(5)
    target = tmp_path / "ck"
    # Another save holds the target: its flock on <target>.fsdp-lock.
    with open(str(target) + ".fsdp-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(fm.Busy) as caught:
            ck.save(target)
    assert caught.value.kind == "busy"
    ck.save(target)


def test_io_error_keeps_errno(tmp_path, ck):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(fm.CheckpointError) as caught:
        ck.save(blocker / "ck")
    error = caught.value
    assert isinstance(error, fm.IOError_) and isinstance(error, OSError)
    assert error.kind == "I/O error" and "Not a directory" in str(error)
    # The runtime's agreement between ranks carries the kind and message
    # but not the errno (runtime/Protocol.cpp): None then.
    assert error.errno in (None, errno.ENOTDIR)
    # Constructed directly, as the extension does.
    made = fm._errors.make_error(5, "I/O error", 28, "disk full")
    assert isinstance(made, fm.IOError_) and made.errno == 28 and str(made) == "disk full"


def test_inspect_matches_fsdp_ckpt(tmp_path, ck):
    ck.fill(3)
    ck.save(tmp_path / "ck")
    got = fm.inspect(tmp_path / "ck")
    assert got["keys"] and got["files"]
    keys = {k["key"]: k for k in got["keys"]}
    assert keys["model.p0"]["dtype"] == "float32" and keys["model.p0"]["shape"] == [5, 3]
    tool = shutil.which("fsdp-ckpt")
    if tool:
        out = subprocess.run([tool, "inspect", "--json", str(tmp_path / "ck")], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        assert json.loads(out) == got


# -- async save ----------------------------------------------------------------

def test_save_async_holds_the_old_values(tmp_path, plan1):
    ck = fm.Checkpointer(plan1)
    tensors = bind_all(ck)
    ck.fill(31)
    handle = ck.save_async(tmp_path / "ck", step=3.0)
    # The buffers change as soon as save_async returns.
    for t in tensors.values():
        t.fill_(7)
    stats = handle.wait()
    assert handle.done() and handle.stall_seconds >= 0
    assert stats["stall_seconds"] == pytest.approx(handle.stall_seconds)
    assert stats["bytes"] > 0
    assert handle.wait() == stats  # the same outcome again
    fm.verify(tmp_path / "ck")
    other = fm.Checkpointer(plan1)
    other.allocate()
    assert other.load(tmp_path / "ck")["step"] == 3.0
    other.check(31)


def test_save_async_error_comes_from_wait(tmp_path, ck):
    ck.fill(1)
    ck.save(tmp_path / "ck")
    handle = ck.save_async(tmp_path / "ck")
    with pytest.raises(ValueError, match="already exists"):
        handle.wait()
    with pytest.raises(ValueError):
        handle.wait()


def test_second_save_waits_for_the_first(tmp_path, ck):
    ck.fill(1)
    first = ck.save_async(tmp_path / "a")
    second = ck.save_async(tmp_path / "b")
    ck.load(tmp_path / "a")  # waits for the saves still running
    first.wait()
    second.wait()
    ck.check(1)
    fm.verify(tmp_path / "b")


def test_checkpointer_dropped_while_saving(tmp_path, plan1):
    import gc

    ck = fm.Checkpointer(plan1)
    ck.allocate()
    ck.fill(4)
    handle = ck.save_async(tmp_path / "ck")
    del ck
    gc.collect()
    handle.wait()
    del handle
    gc.collect()
    fm.verify(tmp_path / "ck")


def test_gil_is_released_while_waiting(tmp_path, plans):
    # A Python thread keeps running while the main thread is in the runtime.
    ck = fm.Checkpointer(plans("llama-tiny", 1))
    ck.allocate()
    ck.fill(1)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        before = len(ticks)
        ck.save(tmp_path / "ck")
        ck.load(tmp_path / "ck")
        ck.check(1)
    finally:
        stop.set()
        thread.join()
    assert len(ticks) > before


# -- progress -----------------------------------------------------------------

def test_progress_callback(tmp_path, ck):
    ck.fill(1)
    seen = []
    ck.save(tmp_path / "ck", progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] > 0
    loaded = []
    ck.load(tmp_path / "ck", progress=lambda done, total: loaded.append((done, total)))
    assert loaded and loaded[-1][0] == loaded[-1][1] > 0
    # The end is told once, not once per worker thread that gets there.
    assert seen.count(seen[-1]) == 1 and loaded.count(loaded[-1]) == 1
    async_seen = []
    ck.save_async(tmp_path / "ck2", progress=lambda d, t: async_seen.append((d, t))).wait()
    assert async_seen and async_seen[-1][0] == async_seen[-1][1]


def test_progress_tqdm(tmp_path, ck, capsys):
    pytest.importorskip("tqdm")
    ck.fill(1)
    ck.save(tmp_path / "ck", progress=True)
    ck.load(tmp_path / "ck", progress=True)
    assert "save" in capsys.readouterr().err
    with pytest.raises(TypeError):
        ck.save(tmp_path / "ck3", progress="yes")


# -- communicators -------------------------------------------------------------

def test_rank_and_world_size_are_checked(plans, plan1):
    with pytest.raises(ValueError, match="world_size=2"):
        fm.Checkpointer(plan1, world_size=2, comm="default")
    with pytest.raises(ValueError, match="rank=1"):
        fm.Checkpointer(plan1, rank=1, comm="default")
    with pytest.raises(ValueError, match="not below world_size"):
        fm.Checkpointer(plans("worked-example", 4), rank=4, world_size=4)
    # The plan's world size against the communicator's.
    with pytest.raises(ValueError, match="plan is for 4 ranks"):
        fm.Checkpointer(plans("worked-example", 4))
    with pytest.raises(ValueError, match="unknown communicator"):
        fm.Checkpointer(plan1, comm="nccl")
    with pytest.raises(TypeError, match="comm must be"):
        fm.Checkpointer(plan1, comm=42)
    with pytest.raises(ValueError):
        fm.Checkpointer(plan1, rank=-1)


def test_missing_plan(tmp_path):
    with pytest.raises(fm.CheckpointError):
        fm.Checkpointer(tmp_path / "no.fsdpplan")


def test_torch_group_of_one(tmp_path, plan1):
    import torch.distributed as dist

    from conftest import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        ck = fm.Checkpointer(plan1, rank=0, world_size=1, comm=dist.group.WORLD)
        ck.allocate()
        ck.fill(8)
        ck.save(tmp_path / "ck")
        handle = ck.save_async(tmp_path / "ck2")
        handle.wait()
        ck2 = fm.Checkpointer(plan1, comm=dist.new_group([0]))
        ck2.allocate()
        ck2.load(tmp_path / "ck2")
        ck2.check(8)
    finally:
        dist.destroy_process_group()


def test_mpi_without_launcher_is_a_world_of_one(tmp_path, plan1):
    if not fm.mpi_built:
        with pytest.raises(ValueError, match="MPI"):
            fm.Checkpointer(plan1, comm="mpi")
        return
    # A subprocess: MPI_Init in this process would outlive the test.
    code = ("import fsdp_mlir as fm, sys; ck = fm.Checkpointer(sys.argv[1], comm='mpi'); "
            "ck.allocate(); ck.fill(2); ck.save(sys.argv[2]); ck.check(2); print('ok', ck.world_size)")
    import sys

    out = subprocess.run([sys.executable, "-c", code, plan1, str(tmp_path / "ck")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert out.returncode == 0 and "ok 1" in out.stdout, out.stdout


def test_fsdp_mlir_torch_is_importable():
    import importlib.util

    if importlib.util.find_spec("fsdp_mlir.torch") is None:
        pytest.skip("fsdp_mlir.torch is not in this tree yet")
    assert fm.torch.__name__ == "fsdp_mlir.torch"


# -- live items ------------------------------------------------------------------

def torch_save_bytes(value):
    import io

    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


def torch_load_bytes(data):
    import io

    return torch.load(io.BytesIO(data), weights_only=False)


def some_live_items():
    ema = torch.arange(6, dtype=torch.float32).reshape(3, 2).t()  # not contiguous
    return [
        ("optimizer.param_groups.1.lr", torch_save_bytes(0.05),
         ("optimizer", "param_groups", 1, "lr")),
        ("extra.sched", bytearray(torch_save_bytes({"last_epoch": 3, "lrs": [0.1, 0.2]}))),
        ("extra.ema", ema),
        ("extra.rng", torch.tensor([1, 2, 250], dtype=torch.uint8)),
        ("extra.mask", torch.tensor([[True, False], [False, True]])),
        ("extra.scale", torch.tensor(1.5, dtype=torch.bfloat16)),
        ("extra.position", torch.tensor(123456789012, dtype=torch.int64), ("extra", "position")),
        ("extra.raw", memoryview(torch_save_bytes("text"))),
    ]


def test_live_items_round_trip(tmp_path, ck, plan1):
    assert ck.commit_rank == 0
    ck.fill(31)
    items = some_live_items()
    stats = ck.save(tmp_path / "ck", step=2.0, live_items=items)
    assert stats["items"] > len(items)
    assert os.path.exists(tmp_path / "ck" / "__live_0.distcp")
    assert fm.verify(tmp_path / "ck") is True

    other = fm.Checkpointer(plan1)
    other.allocate()
    result = other.load(tmp_path / "ck")
    other.check(31)
    assert result["step"] == 2.0
    bytes_items, tensor_items = result["bytes_items"], result["tensor_items"]
    # The plan's hyper-parameters and the live bytes items, as saved.
    assert torch_load_bytes(bytes_items["optimizer.param_groups.0.lr"]) == 0.001
    assert torch_load_bytes(bytes_items["optimizer.param_groups.1.lr"]) == 0.05
    assert torch_load_bytes(bytes_items["extra.sched"]) == {"last_epoch": 3, "lrs": [0.1, 0.2]}
    assert torch_load_bytes(bytes_items["extra.raw"]) == "text"
    assert set(tensor_items) == {"extra.ema", "extra.rng", "extra.mask", "extra.scale",
                                 "extra.position"}
    for key, value, *_ in items:
        if isinstance(value, torch.Tensor):
            got = tensor_items[key]
            assert got.device.type == "cpu" and got.is_contiguous(), key
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert torch.equal(got, value), key

    # torch.distributed.checkpoint reads them too (no process group: one rank).
    import torch.distributed.checkpoint as dcp

    state = {"extra": {"ema": torch.zeros(2, 3), "rng": torch.zeros(3, dtype=torch.uint8),
                       "scale": torch.zeros((), dtype=torch.bfloat16),
                       "sched": {}, "raw": None},
             # A non-tensor subtree would be one item: these keys are flat.
             "optimizer.param_groups.0.lr": None, "optimizer.param_groups.1.lr": None}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(tmp_path / "ck"))
    assert torch.equal(state["extra"]["ema"], items[2][1])
    assert torch.equal(state["extra"]["rng"], items[3][1])
    assert state["extra"]["scale"].item() == 1.5
    assert state["extra"]["sched"] == {"last_epoch": 3, "lrs": [0.1, 0.2]}
    assert state["extra"]["raw"] == "text"
    assert state["optimizer.param_groups.0.lr"] == 0.001
    assert state["optimizer.param_groups.1.lr"] == 0.05

    # Without live items the load returns no tensor items.
    ck.save(tmp_path / "plain")
    assert other.load(tmp_path / "plain")["tensor_items"] == {}


def test_live_items_replace_planned_bytes(tmp_path, ck, plan1):
    ck.fill(32)
    groups = [{"lr": 0.0005, "initial_lr": 0.001}, {"lr": 0.01, "initial_lr": 0.02}]
    items = [(f"optimizer.param_groups.{g}.{name}", torch_save_bytes(value),
              ("optimizer", "param_groups", g, name))
             for g, group in enumerate(groups) for name, value in group.items()]
    handle = ck.save_async(tmp_path / "ck", live_items=items, replace_planned_bytes=True)
    items.clear()  # copied at the call
    handle.wait()
    assert fm.verify(tmp_path / "ck") is True
    other = fm.Checkpointer(plan1)
    other.allocate()
    result = other.load(tmp_path / "ck")
    other.check(32)
    loaded = {key: torch_load_bytes(value) for key, value in result["bytes_items"].items()}
    assert loaded == {f"optimizer.param_groups.{g}.{name}": value
                      for g, group in enumerate(groups) for name, value in group.items()}
    assert result["tensor_items"] == {}


def test_live_items_are_checked(tmp_path, ck):
    ck.fill(33)
    archive = torch_save_bytes(1.0)
    type_errors = [
        3, "abc", {"k": archive}, ["k"], [(1, archive)], [("k", 3.0)], [("k", [1, 2])],
        [("k", archive, ("a", 1.5))], [("k", archive, ("a", True))], [("k", archive, "ab")],
    ]
    for bad in type_errors:
        with pytest.raises(TypeError):
            ck.save(tmp_path / "bad", live_items=bad)
    value_errors = {
        "each item must be": [("k",)],
        "must not be empty": [("", archive)],
        "strided": [("extra.s", torch.zeros(2).to_sparse())],
        # From the runtime (the committing rank's items):
        "is given twice": [("extra.a", archive), ("extra.a", archive)],
        "the plan saves this key": [("optimizer.param_groups.0.lr", archive)],
        "complete torch.save archive": [("extra.a", b"not an archive")],
    }
    for message, bad in value_errors.items():
        with pytest.raises(ValueError, match=message):
            ck.save(tmp_path / "bad", live_items=bad)
    assert not os.path.exists(tmp_path / "bad")
    assert not os.path.exists(str(tmp_path / "bad") + ".fsdp-staging")
    # The plan's key is fine once its bytes items are replaced.
    ck.save(tmp_path / "good", live_items=[("optimizer.param_groups.0.lr", archive)],
            replace_planned_bytes=True)
    assert fm.verify(tmp_path / "good") is True


def test_large_live_tensor_items_come_back(tmp_path, ck, plan1):
    """A live tensor item past the 64 MiB that a foreign (PyTorch-written) tensor may hold still
    comes back from the load; the same tensor written by dcp.save is left to torch's own load
    (every rank would read it), not returned."""
    big = torch.arange(21 * 2**20, dtype=torch.int32).reshape(-1, 1024)  # 84 MiB
    ck.fill(33)
    ck.save(tmp_path / "ck", live_items=[("extra.big", big), ("extra.small", big[:2].clone())])
    other = fm.Checkpointer(plan1)
    other.allocate()
    items = other.load(tmp_path / "ck")["tensor_items"]
    other.check(33)
    assert set(items) == {"extra.big", "extra.small"}
    assert items["extra.big"].dtype == torch.int32 and torch.equal(items["extra.big"], big)

    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"extra": {"big": big, "small": big[:2].clone()}},
                 checkpoint_id=str(tmp_path / "foreign"))
    got = other.load(tmp_path / "foreign", only=["extra"])["tensor_items"]
    assert set(got) == {"extra.small"}
    assert torch.equal(got["extra.small"], big[:2])
