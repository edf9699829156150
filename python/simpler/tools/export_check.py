"""The device check's export check: a consumer reads a device tensor while the work that writes it
is still queued on the worker's stream, so that a read that does not wait as the protocols ask
would see stale bytes, and the reads that do wait never do.

The producer queues, on the worker's stream, a chain of memsets over a large buffer, each with
the next value (``1, 2, ... ROUNDS``), the last one ``ROUNDS``; on a GPU that keeps the stream
busy for a millisecond or more (on the fake libcuda the worker's stream is held instead, so the
queued work cannot run until it is released). Right after queueing, each consumer reads the
buffer's last bytes on a non-blocking stream of its own, through the driver (``ctypes``):

* ``dlpack``: the capsule made for the consumer's stream (``__dlpack__(stream=s)``), which makes
  that stream wait for the worker's; must read ``ROUNDS``;
* ``cai``: the ``stream`` of ``__cuda_array_interface__``, an event on it that the consumer's
  stream waits for, as CAI v3 asks of a consumer; must read ``ROUNDS``;
* ``unsynced``: no wait at all; reads whatever is there, which is stale while the queued work
  runs. It is counted, not judged, but the check needs it to have seen stale bytes at least once:
  otherwise the race never happened and the check proved nothing (it fails, saying so);
* with torch on a real GPU: ``torch.from_dlpack`` under a side stream (torch asks for the capsule
  on its current stream), judged like ``dlpack``.

The consumer binds the device's primary context on the calling thread, as torch does (another
holder of the context, released at the end).
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from typing import Any

import numpy as np

__all__ = ["ROUNDS", "run_export_check"]

#: The memsets queued per iteration; the last writes this value.
ROUNDS = 16
_NON_BLOCKING = 1


class _Driver:
    """The driver calls the consumer makes (the public ``cuda.h`` signatures)."""

    def __init__(self, path: str | None) -> None:
        self.lib = lib = ctypes.CDLL(path or "libcuda.so.1")
        v, i, u64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(i), i]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(v), i]
        lib.cuDevicePrimaryCtxRelease_v2.argtypes = [i]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(v)]
        lib.cuCtxSetCurrent.argtypes = [v]
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(v), ctypes.c_uint]
        lib.cuStreamDestroy_v2.argtypes = [v]
        lib.cuStreamSynchronize.argtypes = [v]
        lib.cuStreamWaitEvent.argtypes = [v, v, ctypes.c_uint]
        lib.cuEventCreate.argtypes = [ctypes.POINTER(v), ctypes.c_uint]
        lib.cuEventRecord.argtypes = [v, v]
        lib.cuEventDestroy_v2.argtypes = [v]
        lib.cuMemsetD8Async.argtypes = [u64, ctypes.c_ubyte, sz, v]
        lib.cuMemcpyDtoHAsync_v2.argtypes = [v, u64, sz, v]
        self.fake = hasattr(lib, "fake_cuda_hold_stream")
        if self.fake:
            lib.fake_cuda_hold_stream.argtypes = [v, i]

    def ok(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed with CUDA error {code}")


def _read_tail(d: _Driver, addr: int, n: int, stream: int) -> int:
    """The last byte of ``[addr, addr + n)`` read on ``stream`` (waits for that stream)."""
    out = np.zeros(1, np.uint8)
    d.ok(d.lib.cuMemcpyDtoHAsync_v2(out.ctypes.data, addr + n - 1, 1, stream), "cuMemcpyDtoHAsync_v2")
    d.ok(d.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
    return int(out[0])


def run_export_check(worker: Any, iterations: int, nbytes: int, use_torch: bool) -> dict[str, Any]:
    """Runs the check on ``worker`` (a cuda worker): ``iterations`` times, ``ROUNDS`` memsets of
    ``nbytes`` queued, then each consumer reads; returns the figures. Raises ``AssertionError``
    when a waiting consumer read stale bytes, or when no unsynchronized read ever did."""
    d = _Driver(os.environ.get("SIMPLER_CUDA_LIB"))
    lib = d.lib
    d.ok(lib.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    d.ok(lib.cuDeviceGet(ctypes.byref(dev), worker.device_id), "cuDeviceGet")
    ctx, prev = ctypes.c_void_p(), ctypes.c_void_p()
    d.ok(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    d.ok(lib.cuCtxGetCurrent(ctypes.byref(prev)), "cuCtxGetCurrent")
    d.ok(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    streams: list[int] = []
    events: list[int] = []
    arms = ["dlpack", "cai", "unsynced"]
    torch = None
    if use_torch:
        import torch as _torch

        torch, side = _torch, _torch.cuda.Stream()
        arms.append("torch_from_dlpack")
    stale = dict.fromkeys(arms, 0)
    buf = worker.malloc(nbytes)
    try:
        for _ in range(3):
            s = ctypes.c_void_p()
            d.ok(lib.cuStreamCreate(ctypes.byref(s), _NON_BLOCKING), "cuStreamCreate")
            streams.append(s.value)
        e = ctypes.c_void_p()
        d.ok(lib.cuEventCreate(ctypes.byref(e), 2), "cuEventCreate")  # CU_EVENT_DISABLE_TIMING
        events.append(e.value)
        waiting, cai_reader, unsynced = streams
        tail = min(nbytes, 4096)
        for it in range(iterations):
            # The last bytes start at 0 (the copy waits for the worker's stream).
            worker.copy_to(buf, np.zeros(tail, np.uint8), offset=nbytes - tail)
            t = buf.tensor((nbytes,), "uint8")
            wstream = t.__cuda_array_interface__["stream"]
            release = None
            if d.fake:
                d.ok(lib.fake_cuda_hold_stream(wstream, 1), "fake_cuda_hold_stream")
            try:
                for r in range(1, ROUNDS + 1):
                    d.ok(lib.cuMemsetD8Async(buf.ptr, r, nbytes, wstream), "cuMemsetD8Async")
                capsule = t.__dlpack__(stream=waiting)
                cai_stream = t.__cuda_array_interface__["stream"]
                # Read first through the consumer that does not wait: the race.
                if _read_tail(d, buf.ptr, nbytes, unsynced) != ROUNDS:
                    stale["unsynced"] += 1
                if d.fake:
                    release = threading.Timer(0.05, lib.fake_cuda_hold_stream, (wstream, 0))
                    release.start()
                if _read_tail(d, buf.ptr, nbytes, waiting) != ROUNDS:
                    stale["dlpack"] += 1
                d.ok(lib.cuEventRecord(events[0], cai_stream), "cuEventRecord")
                d.ok(lib.cuStreamWaitEvent(cai_reader, events[0], 0), "cuStreamWaitEvent")
                if _read_tail(d, buf.ptr, nbytes, cai_reader) != ROUNDS:
                    stale["cai"] += 1
                del capsule
            finally:
                if release is not None:
                    release.cancel()
                    release.join()
                if d.fake:
                    lib.fake_cuda_hold_stream(wstream, 0)
            if torch is not None and not d.fake:
                for r in range(1, ROUNDS + 1):
                    value = (r + it) % 251 + 1
                    d.ok(lib.cuMemsetD8Async(buf.ptr, value, nbytes, wstream), "cuMemsetD8Async")
                want = (ROUNDS + it) % 251 + 1
                with torch.cuda.stream(side):
                    x = torch.from_dlpack(t)  # torch asks for the capsule on its current stream
                    last = x[-1:].clone()
                side.synchronize()
                if int(last.item()) != want:
                    stale["torch_from_dlpack"] += 1
                del x, last
            del t
            gc.collect()
    finally:
        gc.collect()
        worker.copy_from(np.empty(1, np.uint8), buf)  # waits for the worker's stream
        buf.free()
        for s in streams:
            lib.cuStreamDestroy_v2(s)
        for e in events:
            lib.cuEventDestroy_v2(e)
        lib.cuCtxSetCurrent(prev)
        lib.cuDevicePrimaryCtxRelease_v2(dev)
    figures: dict[str, Any] = {
        "iterations": iterations,
        "bytes": nbytes,
        "memsets_queued": ROUNDS,
        "fake_driver": d.fake,
    }
    figures.update({f"stale_reads.{a}": k for a, k in stale.items()})
    judged = {a: k for a, k in stale.items() if a != "unsynced"}
    if any(judged.values()):
        raise AssertionError(
            f"stale reads through an export while work was queued (of {iterations}): {judged}"
        )
    if stale["unsynced"] == 0:
        raise AssertionError(
            f"the read that does not wait never saw stale bytes in {iterations} iterations: the "
            "queued work finished before it, so this check proved nothing (raise the size)"
        )
    return figures
