"""The device check's export check: consumers read a device tensor while the work that writes it
is still queued on the worker's stream, so that a read that does not wait as the protocols ask
sees stale bytes, and the reads that do wait never do.

Each iteration, deterministically on a GPU and on the fake libcuda alike:

1. the worker's stream is *gated*: on a GPU a host function (``cuLaunchHostFunc``) that blocks
   until the check opens the gate; on the fake libcuda the stream is held
   (``fake_cuda_hold_stream``). Nothing queued behind the gate can run;
2. a chain of memsets is queued behind it, each with the next value, the last one ``ROUNDS``;
3. each consumer queues its read of the buffer's last byte on a non-blocking stream of its own,
   through the driver (``ctypes``), into page-locked host memory (a read into pageable memory
   would block the host until it ran):

   * ``dlpack``: after ``__dlpack__(stream=s)``, which makes that stream wait for the worker's;
   * ``cai``: after an event on the ``stream`` of ``__cuda_array_interface__`` that the
     consumer's stream waits for, as CAI v3 asks of a consumer;
   * ``unsynced``: no wait at all;
   * with torch on a real GPU, ``torch.from_dlpack`` under a side stream (torch asks for the
     capsule on its current stream) and a copy of the last element there;

4. the unsynchronized read is waited for: it ran before the memsets, so it must be stale (or the
   check proved nothing, and fails saying so); then the gate opens, and every read that waited
   must see ``ROUNDS``.

The consumer binds the device's primary context on the calling thread, as torch does (another
holder of the context), and gives everything back on every path.
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
_EVENT_DISABLE_TIMING = 2
_PAGE = 4096
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


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
        lib.cuMemHostRegister_v2.argtypes = [v, sz, ctypes.c_uint]
        lib.cuMemHostUnregister.argtypes = [v]
        self.fake = hasattr(lib, "fake_cuda_hold_stream")
        if self.fake:
            lib.fake_cuda_hold_stream.argtypes = [v, i]
        else:
            lib.cuLaunchHostFunc.argtypes = [v, _HOST_FN, v]

    def ok(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed with CUDA error {code}")


class _Gate:
    """Keeps the work queued on a stream from running until :meth:`open` (see the module docs).
    Opening twice is harmless; :meth:`open` must run on every path once :meth:`close` did."""

    def __init__(self, d: _Driver, stream: int) -> None:
        self.d, self.stream = d, stream
        self.event = threading.Event()
        self.closed = False
        # Kept alive as long as the driver may call it.
        self.fn = _HOST_FN(lambda _user: self.event.wait())

    def close(self) -> None:
        if self.d.fake:
            self.d.ok(self.d.lib.fake_cuda_hold_stream(self.stream, 1), "fake_cuda_hold_stream")
        else:
            self.event.clear()
            self.d.ok(self.d.lib.cuLaunchHostFunc(self.stream, self.fn, None), "cuLaunchHostFunc")
        self.closed = True

    def open(self) -> None:
        if not self.closed:
            return
        self.closed = False
        if self.d.fake:
            self.d.lib.fake_cuda_hold_stream(self.stream, 0)
        else:
            self.event.set()


def run_export_check(worker: Any, iterations: int, nbytes: int, use_torch: bool) -> dict[str, Any]:
    """Runs the check on ``worker`` (a cuda worker): ``iterations`` times, ``ROUNDS`` memsets of
    ``nbytes`` queued behind a gate, each consumer's read queued, then the gate opened; returns
    the figures. Raises ``AssertionError`` when a waiting consumer read stale bytes, or when the
    read that does not wait never did (the race never happened)."""
    d = _Driver(os.environ.get("SIMPLER_CUDA_LIB"))
    lib = d.lib
    arms = ["dlpack", "cai", "unsynced"] + (["torch_from_dlpack"] if use_torch else [])
    stale = dict.fromkeys(arms, 0)
    cleanup: list[tuple[str, Any]] = []  # (what, undo), undone last first on every path
    errors: list[str] = []
    held: dict[str, Any] = {}  # what keeps an export alive: dropped before the buffer is freed
    gate: _Gate | None = None
    try:
        d.ok(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        d.ok(lib.cuDeviceGet(ctypes.byref(dev), worker.device_id), "cuDeviceGet")
        ctx, prev = ctypes.c_void_p(), ctypes.c_void_p()
        d.ok(lib.cuCtxGetCurrent(ctypes.byref(prev)), "cuCtxGetCurrent")
        d.ok(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        cleanup.append(("cuDevicePrimaryCtxRelease_v2", lambda: lib.cuDevicePrimaryCtxRelease_v2(dev)))
        d.ok(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        cleanup.append(("cuCtxSetCurrent", lambda: lib.cuCtxSetCurrent(prev)))
        streams = []
        for _ in range(3):
            s = ctypes.c_void_p()
            d.ok(lib.cuStreamCreate(ctypes.byref(s), _NON_BLOCKING), "cuStreamCreate")
            cleanup.append(("cuStreamDestroy_v2", lambda s=s.value: lib.cuStreamDestroy_v2(s)))
            streams.append(s.value)
        waiting, cai_reader, unsynced = streams
        e = ctypes.c_void_p()
        d.ok(lib.cuEventCreate(ctypes.byref(e), _EVENT_DISABLE_TIMING), "cuEventCreate")
        cleanup.append(("cuEventDestroy_v2", lambda e=e.value: lib.cuEventDestroy_v2(e)))
        # One page each for the three reads, page-locked once.
        raw = np.zeros(4 * _PAGE, np.uint8)
        start = (-raw.ctypes.data) % _PAGE
        host = raw[start : start + 3 * _PAGE]
        d.ok(lib.cuMemHostRegister_v2(host.ctypes.data, host.nbytes, 0), "cuMemHostRegister_v2")
        cleanup.append(("cuMemHostUnregister", lambda: lib.cuMemHostUnregister(host.ctypes.data)))
        slot = {"dlpack": 0, "cai": _PAGE, "unsynced": 2 * _PAGE}
        if use_torch:
            import torch

            side = torch.cuda.Stream()
        buf = worker.malloc(nbytes)
        cleanup.append(("free", buf.free))
        cleanup.append(("waiting for the worker's stream", lambda: worker.copy_from(host[:1], buf)))
        tail = min(nbytes, _PAGE)

        def read(arm: str, stream: int | None) -> None:
            dst = host.ctypes.data + slot[arm]
            d.ok(lib.cuMemcpyDtoHAsync_v2(dst, buf.ptr + nbytes - 1, 1, stream), "cuMemcpyDtoHAsync_v2")

        for _ in range(iterations):
            # The last bytes start at 0 (the copy waits for the worker's stream).
            worker.copy_to(buf, np.zeros(tail, np.uint8), offset=nbytes - tail)
            host[:] = 0
            held["t"] = t = buf.tensor((nbytes,), "uint8")
            wstream = t.__cuda_array_interface__["stream"]
            gate = _Gate(d, wstream)
            gate.close()
            for r in range(1, ROUNDS + 1):
                d.ok(lib.cuMemsetD8Async(buf.ptr, r, nbytes, wstream), "cuMemsetD8Async")
            held["capsule"] = t.__dlpack__(stream=waiting)
            read("dlpack", waiting)
            d.ok(lib.cuEventRecord(e.value, t.__cuda_array_interface__["stream"]), "cuEventRecord")
            d.ok(lib.cuStreamWaitEvent(cai_reader, e.value, 0), "cuStreamWaitEvent")
            read("cai", cai_reader)
            read("unsynced", unsynced)
            if use_torch:
                with torch.cuda.stream(side):
                    x = torch.from_dlpack(t)  # torch asks for the capsule on its current stream
                    held["x"], held["last"] = x, x[-1:].clone()
            d.ok(lib.cuStreamSynchronize(unsynced), "cuStreamSynchronize")
            if host[slot["unsynced"]] != ROUNDS:
                stale["unsynced"] += 1
            gate.open()
            for st in (waiting, cai_reader):
                d.ok(lib.cuStreamSynchronize(st), "cuStreamSynchronize")
            for arm in ("dlpack", "cai"):
                if host[slot[arm]] != ROUNDS:
                    stale[arm] += 1
            if use_torch:
                side.synchronize()
                if int(held["last"].item()) != ROUNDS:
                    stale["torch_from_dlpack"] += 1
            held.clear()
            t = x = None
            gc.collect()
    finally:
        if gate is not None:
            gate.open()
        held.clear()
        t = x = None
        gc.collect()
        for what, undo in reversed(cleanup):
            try:
                undo()
            except Exception as ex:  # every step is tried; the first error of the check stays
                errors.append(f"{what}: {ex}")
    if errors:
        raise RuntimeError("the export check could not give back what it took: " + "; ".join(errors))
    figures: dict[str, Any] = {
        "iterations": iterations,
        "bytes": nbytes,
        "memsets_queued": ROUNDS,
        "gate": "held stream (fake libcuda)" if d.fake else "cuLaunchHostFunc",
    }
    figures.update({f"stale_reads.{a}": k for a, k in stale.items()})
    judged = {a: k for a, k in stale.items() if a != "unsynced"}
    if any(judged.values()):
        raise AssertionError(
            f"stale reads through an export while work was queued (of {iterations}): {judged}"
        )
    if stale["unsynced"] != iterations:
        raise AssertionError(
            f"the read that does not wait saw the queued bytes in {iterations - stale['unsynced']} of "
            f"{iterations} iterations although they were gated: the check proved nothing there"
        )
    return figures
