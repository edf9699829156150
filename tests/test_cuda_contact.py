"""What a real CUDA machine does that a lenient fake would hide, on the stricter fake libcuda:
the NVRTC chosen for the driver, writes of another library ordered before the next run, launch
limits, device timing, a fault shared with another holder of the primary context, one module
per image. A ctypes "consumer" stands in for torch: it retains the device's primary context on
its own thread, as torch does, and queues work on CUDA streams through the fake driver."""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _signals import SignalWhen
from test_device_exec import SAXPY, SEEN, saxpy_kernel

import simpler as sp
from simpler.testing import fake_kernels

LEGACY, PER_THREAD, NON_BLOCKING = 1, 2, 1
F32 = np.dtype(np.float32)


class Consumer:
    """Another library on this thread (torch, say): it holds the primary context of device 0
    and queues work on streams of its own, through the fake libcuda."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        v = ctypes.c_void_p
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(v), ctypes.c_int]
        lib.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
        lib.cuCtxSetCurrent.argtypes = [v]
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(v), ctypes.c_uint]
        lib.cuStreamDestroy_v2.argtypes = [v]
        lib.cuStreamSynchronize.argtypes = [v]
        lib.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, v]
        lib.cuMemcpyDtoHAsync_v2.argtypes = [v, ctypes.c_uint64, ctypes.c_size_t, v]
        lib.fake_cuda_hold_stream.argtypes = [v, ctypes.c_int]
        assert lib.cuInit(0) == 0
        self.ctx = v()
        assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), 0) == 0
        assert lib.cuCtxSetCurrent(self.ctx) == 0
        self.streams: list[int] = []
        self.released = False

    def stream(self) -> int:
        s = ctypes.c_void_p()
        assert self.lib.cuStreamCreate(ctypes.byref(s), NON_BLOCKING) == 0
        self.streams.append(s.value)
        return s.value

    def hold(self, stream: int, on: bool) -> None:
        """Holds (or releases) a stream of the fake; callable from any thread (the context is
        made current on it first: a built-in stream is the calling thread's)."""
        assert self.lib.cuCtxSetCurrent(self.ctx) == 0
        assert self.lib.fake_cuda_hold_stream(stream, int(on)) == 0

    def memset(self, addr: int, value: int, n: int, stream: int) -> None:
        assert self.lib.cuMemsetD8Async(addr, value, n, stream) == 0

    def read_async(self, out: np.ndarray, addr: int, stream: int) -> None:
        """Queues a copy of ``out.nbytes`` device bytes at ``addr`` into ``out`` on ``stream``
        (the fake writes ``out`` when the copy runs)."""
        assert self.lib.cuMemcpyDtoHAsync_v2(out.ctypes.data, addr, out.nbytes, stream) == 0

    def sync(self, stream: int) -> None:
        assert self.lib.cuStreamSynchronize(stream) == 0

    def close(self) -> None:
        if self.released:
            return
        self.released = True
        for s in self.streams:
            self.lib.cuStreamDestroy_v2(s)
        assert self.lib.cuDevicePrimaryCtxRelease_v2(0) == 0
        self.lib.cuCtxSetCurrent(None)


@pytest.fixture
def consumer(fake_vendor):
    fake_vendor.use("cuda")
    c = Consumer(fake_vendor.cuda_lib())
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def cuda(fake_vendor):
    SEEN.clear()
    with fake_vendor.worker("cuda", poison=False) as w:
        yield w


@pytest.fixture(autouse=True)
def _no_hang():
    """A test here that waits for a held stream forever fails with tracebacks instead."""
    faulthandler.dump_traceback_later(180, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _queued(log, before: int, stream: int):
    """A condition: since line ``before`` of the fake's call log, the worker queued a wait on its
    stream (``cuStreamWaitEvent <stream>``): it now waits for the held stream (its copies wait
    for its stream, so nothing may be required of it past that point)."""
    wait = f"cuStreamWaitEvent {stream:#x} "
    return lambda: any(line.startswith(wait) for line in log()[before:])


def _release_when(consumer: Consumer, held: int, ready) -> SignalWhen:
    """Releases the ``held`` stream once ``ready()`` says the worker queued its wait for it: if
    the worker never waits (the bug these tests catch), the stream stays held until the block
    ends, so the worker's work runs first and reads the old bytes."""
    return SignalWhen(lambda: consumer.hold(held, False), ready)


# -- exports: a consumer's writes come before the next run ---------------------------------------


def _run_saxpy(w: sp.Worker, x: sp.DeviceTensor, n: int) -> np.ndarray:
    y = np.zeros(n, np.float32)
    k = saxpy_kernel()  # y += 1.0 * x over a zeroed y: a copy on the device
    w.run(sp.Callable(lambda o, x, y: o.submit(k, x, y, 1.0), [sp.IN, sp.INOUT]), [x, y])
    return y


def test_a_write_queued_on_the_legacy_stream_through_an_export_comes_before_the_next_run(
    cuda, consumer, fake_vendor
):
    """torch writes through a DLPack export on its current (legacy default) stream, which is
    still busy when the worker runs: the run waits for it (an event), on the device, so it reads
    the new values. Without that wait the worker's non-blocking stream would read the old ones."""
    n = 256
    buf = cuda.malloc(n * 4)
    cuda.copy_to(buf, np.zeros(n, np.float32))
    x = buf.tensor((n,), "float32")
    capsule = x.__dlpack__(stream=LEGACY)  # the consumer's view: alive until it lets go
    worker_stream = x.__cuda_array_interface__["stream"]
    consumer.hold(LEGACY, True)  # the legacy stream is busy with earlier work
    consumer.memset(buf.ptr, 0x3F, n * 4, LEGACY)  # 0x3F3F3F3F as float32: 0.7470...
    ready = _queued(fake_vendor.cuda_log, len(fake_vendor.cuda_log()), worker_stream)
    try:
        with _release_when(consumer, LEGACY, ready):
            y = _run_saxpy(cuda, x, n)
    finally:
        consumer.hold(LEGACY, False)
    expect = np.full(n, 0x3F3F3F3F, np.uint32).view(np.float32)
    np.testing.assert_array_equal(y, expect)
    del capsule, x
    gc.collect()
    buf.free()


def test_after_the_export_ends_its_last_writes_are_still_waited_for(cuda, consumer, fake_vendor):
    """The consumer let go of its array, but its write is still queued: the next copy waits
    once more; later copies, with no export left, wait for nothing."""
    n = 64
    buf = cuda.malloc(n)
    cuda.copy_to(buf, np.zeros(n, np.uint8))
    t = buf.tensor((n,), "uint8")
    worker_stream = t.__cuda_array_interface__["stream"]
    capsule = t.__dlpack__(stream=LEGACY)
    consumer.hold(LEGACY, True)
    consumer.memset(buf.ptr, 9, n, LEGACY)
    del capsule, t
    gc.collect()
    out = np.empty(n, np.uint8)
    ready = _queued(fake_vendor.cuda_log, len(fake_vendor.cuda_log()), worker_stream)
    try:
        with _release_when(consumer, LEGACY, ready):
            cuda.copy_from(out, buf)
    finally:
        consumer.hold(LEGACY, False)
    assert (out == 9).all()
    before = len(fake_vendor.cuda_log())
    cuda.copy_from(out, buf)
    assert not [line for line in fake_vendor.cuda_log()[before:] if line.startswith("cuStreamWaitEvent")]
    buf.free()


def test_wait_stream_orders_a_side_stream_write_before_the_next_run(cuda, consumer, fake_vendor):
    """A consumer writing from a non-blocking stream of its own is not covered by the legacy
    stream: ``wait_stream`` orders the worker after it (an int handle, or any object with
    ``__cuda_stream__``, ``cuda_stream`` or ``ptr``; an object's 0, its default stream, is the
    legacy one)."""
    n = 128
    buf = cuda.malloc(n * 4)
    cuda.copy_to(buf, np.zeros(n, np.float32))
    x = buf.tensor((n,), "float32")
    worker_stream = x.__cuda_array_interface__["stream"]
    side = consumer.stream()

    class TorchLikeStream:
        cuda_stream = side

    class TorchDefaultStream:
        cuda_stream = 0

    for how, held in ((side, side), (TorchLikeStream(), side), (TorchDefaultStream(), LEGACY)):
        consumer.hold(held, True)
        consumer.memset(buf.ptr, 0x40, n * 4, held)
        before = len(fake_vendor.cuda_log())
        cuda.wait_stream(how)
        ready = _queued(fake_vendor.cuda_log, before, worker_stream)
        try:
            with _release_when(consumer, held, ready):
                y = _run_saxpy(cuda, x, n)
        finally:
            consumer.hold(held, False)
        np.testing.assert_array_equal(y, np.full(n, 0x40404040, np.uint32).view(np.float32))
        cuda.copy_to(buf, np.zeros(n, np.float32))
    with pytest.raises(TypeError, match="a CUDA stream is an int handle"):
        cuda.wait_stream("default")
    with pytest.raises(sp.DeviceError, match="stream 0 is ambiguous"):
        cuda.wait_stream(0)
    del x
    gc.collect()
    buf.free()


def test_an_export_orders_its_consumer_after_work_still_queued_on_the_worker_stream(cuda, consumer):
    """Work is still queued on the worker's stream (held) when a consumer takes the tensor: a
    consumer stream that waits as the protocols ask (DLPack's ``stream``, the interface's
    ``stream``) reads the new bytes; one that does not, reads the old ones. The stale read shows
    the race is real."""
    n = 64
    buf = cuda.malloc(n)
    cuda.copy_to(buf, np.zeros(n, np.uint8))
    t = buf.tensor((n,), "uint8")
    worker_stream = t.__cuda_array_interface__["stream"]
    waiting, cai_reader, unsynced = consumer.stream(), consumer.stream(), consumer.stream()
    lib = consumer.lib
    lib.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    lib.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    lib.cuEventDestroy_v2.argtypes = [ctypes.c_void_p]
    event = ctypes.c_void_p()
    assert lib.cuEventCreate(ctypes.byref(event), 2) == 0
    got = {k: np.full(n, 0xEE, np.uint8) for k in ("dlpack", "cai", "unsynced")}
    consumer.hold(worker_stream, True)
    try:
        consumer.memset(buf.ptr, 5, n, worker_stream)  # queued on the worker's stream
        capsule = t.__dlpack__(stream=waiting)
        consumer.read_async(got["dlpack"], buf.ptr, waiting)
        assert lib.cuEventRecord(event, t.__cuda_array_interface__["stream"]) == 0
        assert lib.cuStreamWaitEvent(cai_reader, event, 0) == 0
        consumer.read_async(got["cai"], buf.ptr, cai_reader)
        consumer.read_async(got["unsynced"], buf.ptr, unsynced)
        consumer.sync(unsynced)  # ran before the queued memset: nobody made it wait
    finally:
        consumer.hold(worker_stream, False)
    consumer.sync(waiting)
    consumer.sync(cai_reader)
    lib.cuEventDestroy_v2(event)
    assert (got["unsynced"] == 0).all(), "the consumer that did not wait read the queued bytes?"
    assert (got["dlpack"] == 5).all() and (got["cai"] == 5).all()
    del capsule, t
    gc.collect()
    buf.free()


# -- a fault shared with another holder of the primary context -----------------------------------


def test_a_fault_stays_while_another_library_holds_the_primary_context(fake_vendor, consumer):
    """A sticky fault poisons the primary context for everyone in the process: with torch still
    holding it, closing every worker does not reset it, and the next worker is refused with the
    reason and the fix; once torch lets go, a new worker works."""
    w = fake_vendor.worker("cuda")
    lib = fake_vendor.cuda_lib()
    lib.fake_cuda_inject.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int32]
    assert lib.fake_cuda_inject(b"cuLaunchKernel", 1, 700) == 0  # the driver's own answer
    k = saxpy_kernel()
    call = sp.Callable(lambda o, x, y: o.submit(k, x, y, 1.0), [sp.IN, sp.INOUT])
    with pytest.raises(sp.DeviceError):
        w.run(call, [np.ones(4, np.float32), np.zeros(4, np.float32)])
    w.close()
    sp.release_sessions()
    try:
        sp.Worker("cuda").close()  # must not open: then the context would stay held by it
    except sp.PlatformUnavailableError as e:
        assert re.search(r"still holds it.*restart the process", str(e)), e
    else:
        pytest.fail("a worker opened on a context still faulted")
    consumer.close()
    with sp.Worker("cuda") as w2:
        w2.free(w2.malloc(64))


# -- launches: limits, modules, binds, timing ------------------------------------------------------


BOUNDED = r"""
struct b_row { float* y; long long n; };
extern "C" __global__ void __launch_bounds__(64) t_bounded(const b_row* rows) {}
"""


def test_a_block_past_the_functions_thread_limit_is_refused_at_submit(cuda):
    code = sp.CudaCode(BOUNDED, entry="t_bounded", launch=sp.Launch(1, 128))
    k = sp.Kernel(lambda y: None, [sp.INOUT], cuda=code, name="bounded")
    with pytest.raises(sp.ArgumentError, match=r"block \[128, 1, 1\] has 128 threads.*at most 64 per block"):
        cuda.run(sp.Callable(lambda o, y: o.submit(k, y), [sp.INOUT]), [np.zeros(4, np.float32)])
    assert cuda.run(sp.Callable(lambda o: None, []), []).ok  # the worker stays usable


def test_dynamic_shared_memory_past_48_kib_is_opted_in_up_to_the_devices_limit(cuda, fake_vendor):
    def kernel(shared: int) -> sp.Kernel:
        launch = sp.Launch(1, 32, shared_bytes=shared, consts=(4,))
        code = sp.CudaCode(SAXPY, entry="t_saxpy", launch=launch, scalars=("float64",))
        return sp.Kernel(lambda x, y, a: None, [sp.IN, sp.INOUT], cuda=code, name=f"saxpy_{shared}")

    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    big = kernel(96 * 1024)
    before = len(fake_vendor.cuda_log())
    cuda.run(sp.Callable(lambda o, x, y: o.submit(big, x, y, 1.0), [sp.IN, sp.INOUT]), [x, y])
    np.testing.assert_array_equal(y, x)
    log = fake_vendor.cuda_log()[before:]
    assert [line for line in log if line.startswith("cuFuncSetAttribute")], log
    too_big = kernel(300 * 1024)
    with pytest.raises(sp.ArgumentError, match=r"307200 bytes of dynamic shared memory.*at most 232448"):
        cuda.run(sp.Callable(lambda o, x, y: o.submit(too_big, x, y, 1.0), [sp.IN, sp.INOUT]), [x, y])


def test_a_batch_of_launches_binds_the_context_once(cuda, fake_vendor):
    """A batch whose tasks form a chain runs as several launches with one context bind (no
    context call between them)."""
    k = saxpy_kernel()
    n = 6
    x = np.ones(4, np.float32)
    y = np.zeros(4, np.float32)

    def orch(o, x, y):  # every task updates y: a chain of 6 levels, 6 launches
        o.submit_many(
            k, x.views([4], np.zeros((n, 1), np.int64)), y.views([4], np.zeros((n, 1), np.int64)), 1.0
        )

    before = len(fake_vendor.cuda_log())
    r = cuda.run(sp.Callable(orch, [sp.IN, sp.INOUT]), [x, y])
    assert r.counters["device_launches"] == n
    np.testing.assert_array_equal(y, n * x)
    log = fake_vendor.cuda_log()[before:]
    launches = [i for i, line in enumerate(log) if line.startswith("cuLaunchKernel")]
    between = log[launches[0] : launches[-1]]
    assert not [line for line in between if line.startswith("cuCtx")], between


def test_device_timing_measures_the_launches_with_events(cuda):
    k = saxpy_kernel()
    call = sp.Callable(lambda o, x, y: o.submit(k, x, y, 1.0), [sp.IN, sp.INOUT])
    x, y = np.ones(64, np.float32), np.zeros(64, np.float32)
    assert cuda.device_timing is False
    r = cuda.run(call, [x, y])
    assert r.counters["device_ns"] == 0
    assert r.counters["execute_wait_ns"] > 0
    cuda.device_timing = True
    r = cuda.run(call, [x, y])
    assert r.counters["device_ns"] > 0
    assert r.counters["device_ns"] <= r.phases["execute"] + r.counters["execute_wait_ns"]


# -- NVRTC for the driver ------------------------------------------------------------------------


_CHOOSE = """if True:
    import json, os, numpy as np, simpler as sp
    from simpler.testing import fake_cuda
    import test_device_exec  # registers the fake's host implementation of t_saxpy
    fake_cuda.install_if_fake()
    os.environ.pop("SIMPLER_NVRTC_LIB", None)  # the search, not the fake's own NVRTC
    info = sp.nvrtc_info(tuple(json.loads({driver!r})), (9, 0))
    y = None
    if info["path"].startswith({site!r}):  # one of the fakes: its code loads on the fake driver
        src = open({src!r}).read()
        code = sp.CudaCode(src, entry="t_saxpy", launch=sp.Launch(1, 32, consts=(4,)), scalars=("float64",))
        k = sp.Kernel(lambda x, y, a: None, [sp.IN, sp.INOUT], cuda=code)
        x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
        with sp.Worker("cuda") as w:
            w.run(sp.Callable(lambda o, x, y: o.submit(k, x, y, 1.0), [sp.IN, sp.INOUT]), [x, y])
        y = y.tolist()
    print(json.dumps({{"info": info, "y": y}}))
"""


def _two_nvrtcs(tmp_path: Path, fake_lib: Path) -> Path:
    """A site folder with two NVRTC wheels' layouts: CUDA 13 (``nvidia/cu13/lib``, first in
    the search) and CUDA 12 (``nvidia/cuda_nvrtc/lib``), both the fake NVRTC."""
    site = tmp_path / "site"
    for sub, name in (("nvidia/cu13/lib", "libnvrtc.so.13"), ("nvidia/cuda_nvrtc/lib", "libnvrtc.so.12")):
        d = site / sub
        d.mkdir(parents=True)
        shutil.copy(fake_lib, d / name)
    return site


@pytest.mark.parametrize(("driver", "chosen"), [((12, 4), "libnvrtc.so.12"), ((13, 0), "libnvrtc.so.13")])
def test_the_newest_nvrtc_the_driver_supports_is_chosen(fake_vendor, tmp_path, driver, chosen):
    """With a CUDA 13 and a CUDA 12 NVRTC on disk (the 13 searched first), a 12.4 driver gets
    the CUDA 12 one (the 13 one's code would not load), a 13.0 driver the newest."""
    fake_vendor.use("cuda")
    site = _two_nvrtcs(tmp_path, fake_vendor.cuda_lib_path)
    src = tmp_path / "saxpy.cu"
    src.write_text(SAXPY)
    env = {k: v for k, v in os.environ.items() if k != "SIMPLER_NVRTC_LIB"}
    env["FAKE_CUDA_DRIVER_VERSION"] = str(driver[0] * 1000 + driver[1] * 10)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *sys.path])
    script = _CHOOSE.format(driver=json.dumps(list(driver)), src=str(src), site=str(site))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    info = got["info"]
    usable = [c for c in info["candidates"] if c["usable"]]
    # The newest usable one is chosen (the real NVRTC wheel of this venv is a candidate too).
    assert tuple(info["version"]) == max(tuple(c["version"]) for c in usable), info["candidates"]
    assert info["version"][0] == driver[0] and Path(info["path"]).name == chosen, info
    assert info["target"] == "sm_90" and info["target_kind"] == "cubin"
    if info["path"].startswith(str(site)):
        assert got["y"] == [1.0] * 4  # compiled by the chosen fake, loaded and run by the driver
    if driver == (12, 4):
        refused = [c for c in info["candidates"] if c["version"][0] == 13]
        assert refused and all(
            "makes code for CUDA 13 drivers, and this driver is CUDA 12.4" in c["why"] for c in refused
        ), info["candidates"]
        assert "also found: NVRTC 13" in info["summary"]


def test_a_device_newer_than_nvrtc_gets_ptx_for_the_newest_architecture_it_knows(
    fake_vendor, monkeypatch, caplog
):
    """A CUDA 12.4 NVRTC knows architectures up to 9.0; on a 12.0 device under a 12.8 driver it
    makes PTX for compute_90, which the driver compiles; the choice is said with a warning."""
    fake_vendor.use("cuda")
    monkeypatch.setenv("FAKE_NVRTC_VERSION", "12.4")
    monkeypatch.setenv("FAKE_CUDA_CC", "12.0")
    monkeypatch.setenv("FAKE_CUDA_DRIVER_VERSION", "12080")
    lib = fake_vendor.cuda_lib()
    lib.fake_cuda_reset()
    try:
        info = sp.nvrtc_info((12, 8), (12, 0))
        assert (info["target"], info["target_kind"]) == ("compute_90", "ptx"), info
        fake_kernels.install_if_fake()
        with caplog.at_level(logging.WARNING, logger="simpler"), sp.Worker("cuda") as w:
            y = np.zeros(4, np.float32)
            k = saxpy_kernel(SAXPY + "\n// for a 12.0 device\n")
            call = sp.Callable(lambda o, x, y: o.submit(k, x, y, 1.0), [sp.IN, sp.INOUT])
            w.run(call, [np.ones(4, np.float32), y])
        np.testing.assert_array_equal(y, 1.0)
        assert any("PTX compute_90" in r.getMessage() for r in caplog.records), caplog.records
        loads = [line for line in fake_vendor.cuda_log() if line.startswith("cuModuleLoadData")]
        assert loads and "arch=compute_90" in loads[-1], loads  # the worker loaded the PTX
    finally:
        monkeypatch.delenv("FAKE_CUDA_CC")
        monkeypatch.delenv("FAKE_CUDA_DRIVER_VERSION")
        monkeypatch.delenv("FAKE_NVRTC_VERSION")
        lib.fake_cuda_reset()


def test_arch_specific_code_compiles_for_sm_90a(cuda, fake_vendor):
    launch = sp.Launch(1, 32, consts=(4,))
    src = SAXPY + "\n// sm_90a\n"
    code = sp.CudaCode(src, entry="t_saxpy", launch=launch, scalars=("float64",), arch_specific=True)
    assert code.arch_specific
    k = sp.Kernel(lambda x, y, a: None, [sp.IN, sp.INOUT], cuda=code)
    before = len(fake_vendor.cuda_log())
    y = np.zeros(4, np.float32)
    call = sp.Callable(lambda o, x, y: o.submit(k, x, y, 1.0), [sp.IN, sp.INOUT])
    cuda.run(call, [np.ones(4, np.float32), y])
    loads = [line for line in fake_vendor.cuda_log()[before:] if line.startswith("cuModuleLoadData")]
    assert loads and "arch=sm_90a" in loads[0], loads
    np.testing.assert_array_equal(y, 1.0)
    with pytest.raises(ValueError, match="arch_specific applies to source"):
        sp.CudaCode(entry="t", launch=sp.Launch(1), ptx="//", arch_specific=True)


# -- the shipped sources, compiled with the real NVRTC -------------------------------------------


def _shipped_sources() -> list[tuple[str, str]]:
    from simpler.tools import benchmarks, device_check
    from simpler.workloads import paged_attention_cuda as pac
    from simpler.workloads import paged_attention_unroll_cuda as puc

    return [
        ("paged_attention", pac.SOURCE),
        ("paged_attention_unroll", puc.SOURCE),
        ("launches_benchmark", benchmarks.LAUNCH_SOURCE),
        ("device_check_nothing", device_check.NOTHING_SOURCE),
    ]


@pytest.mark.parametrize("capability", [(9, 0), (8, 0)], ids=["sm_90", "sm_80"])
def test_the_shipped_cuda_sources_compile_without_errors_or_spills(capability):
    """Every CUDA source the package ships compiles with the real NVRTC (the wheel, no GPU
    needed) for the H200's architecture and an older one, to a cubin, and ptxas reports no
    register spills for any entry."""
    from simpler import _cuda

    if not _cuda.nvrtc_dirs():
        pytest.skip("the nvidia-cuda-nvrtc wheel is not installed (requirements/dev.txt)")
    if os.environ.get("SIMPLER_NVRTC_LIB"):
        pytest.skip("SIMPLER_NVRTC_LIB points the search elsewhere")
    for what, src in _shipped_sources():
        r = sp.compile_cuda(src, capability, name=f"{what}.cu")
        assert (r["kind"], r["target"]) == ("cubin", "sm_{}{}".format(*capability)), r["nvrtc"]
        entries = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)', src))
        assert set(r["kernels"]) == entries, r["log"]
        spills = {e: k for e, k in r["kernels"].items() if k["spill_store_bytes"] or k["spill_load_bytes"]}
        assert not spills, (what, spills)
