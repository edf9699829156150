"""The device checks of the driver, through the public API (``driver.*``): the device opens;
workers opened and closed on threads, and one worker used from threads; copies from pageable
memory; mirror refreshes into page-locked vs pageable mirrors; the poison memset; errors that
name the call; the process's vendor session; a resident set round trip through a device kernel.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable as Fn
from statistics import median
from typing import Any

import numpy as np
import pytest

from ...args import ResidentTaskArgs
from ...errors import ArgumentError, DeviceError
from ...worker import ArgDirection, Callable, CudaCode, Kernel, Launch
from .common import (
    NOTHING_ENTRY,
    NOTHING_SOURCE,
    Context,
    Figures,
    gb_per_s,
    need_cuda,
    pattern,
    run_threads,
)

IN_, OUT_, INOUT_ = ArgDirection.IN, ArgDirection.OUT, ArgDirection.INOUT


@pytest.mark.device_check("driver.open")
def test_open(ctx: Context, figures: Figures) -> None:
    """The device opens (a worker), allocates, copies and closes; it runs whatever ``--only``
    says."""
    with ctx.worker() as w:
        buf = w.malloc(4096)
        data = pattern(4096, 0)
        back = np.empty_like(data)
        w.copy_to(buf, data)
        w.copy_from(back, buf)
        buf.free()
        if not np.array_equal(back, data):
            raise AssertionError("4 KiB copied there and back came back different")
        figures.update(device_id=w.device_id, worker=repr(w))


@pytest.mark.device_check("driver.open_close_threads")
def test_open_close_threads(ctx: Context, figures: Figures) -> None:
    """Workers opened and closed on 4 threads at once (each copies 1 MiB there and back); then
    one worker opened here and used from 4 threads (copies at once, runs of a device kernel one
    at a time: a worker runs one call at a time) and closed here."""
    threads, cycles = 4, (3 if ctx.quick else 10)
    barrier = threading.Barrier(threads)
    per_cycle: list[float] = []

    def own_worker(k: int) -> None:
        data = pattern(1 << 20, k)
        back = np.empty_like(data)
        for c in range(cycles):
            barrier.wait(timeout=120)  # every thread opens at the same moment
            t0 = time.perf_counter()
            with ctx.worker() as w:
                buf = w.malloc(data.nbytes)
                w.copy_to(buf, data)
                w.copy_from(back, buf)
                buf.free()
            per_cycle.append(time.perf_counter() - t0)
            if not np.array_equal(back, data):
                raise AssertionError(f"cycle {c}: the copy came back different")

    run_threads(threads, own_worker, barrier)

    from ..benchmarks import LAUNCH_KERNEL

    n, runs = 1024, 5
    offsets = np.arange(n, dtype=np.int64).reshape(n, 1)
    call = Callable(lambda o, x: o.submit_many(LAUNCH_KERNEL, x.views([1], offsets), 0.5), [INOUT_])
    run_lock = threading.Lock()
    device_tasks: list[int] = []
    with ctx.worker() as shared:

        def use_shared(k: int) -> None:
            data = pattern(1 << 20, 10 + k)
            back = np.empty_like(data)
            buf = shared.malloc(data.nbytes)
            try:
                shared.copy_to(buf, data)
                shared.copy_from(back, buf)
                if not np.array_equal(back, data):
                    raise AssertionError("a copy on the shared worker came back different")
                shared.copy_to(buf, np.zeros(n, np.float32))
                x = buf.tensor((n,), "float32")
                for _ in range(runs):
                    with run_lock:
                        rep = shared.run(call, [x])
                    device_tasks.append(rep.counters["device_tasks"])
                got = np.empty(n, np.float32)
                shared.copy_from(got, buf)
                if not np.all(got == np.float32(0.5 * runs)):
                    raise AssertionError(f"the kernel's sums on the shared worker are {got[:4]}...")
                del x
            finally:
                buf.free()

        run_threads(threads, use_shared)
    if ctx.cuda and device_tasks != [n] * (threads * runs):
        raise AssertionError(f"runs on the shared worker ran {sorted(set(device_tasks))} tasks on the device")
    figures.update(
        threads=threads,
        cycles=cycles,
        open_copy_close_ms_median=round(median(per_cycle) * 1e3, 3),
        open_copy_close_ms_max=round(max(per_cycle) * 1e3, 3),
        shared_worker_runs=threads * runs,
    )


@pytest.mark.device_check("driver.copies_pageable")
def test_copies_pageable(ctx: Context, figures: Figures) -> None:
    """``copy_to`` / ``copy_from`` of one large buffer from pageable numpy memory: bandwidth, and
    the bytes come back."""
    size = (16 << 20) if ctx.quick else (256 << 20)
    reps = 3 if ctx.quick else 5
    data = pattern(size, 1)
    back = np.empty_like(data)
    tiny = np.empty(8, np.uint8)
    with ctx.worker(poison=False) as w:
        buf = w.malloc(size)
        try:
            w.copy_to(buf, data)  # first touch outside the timing
            w.copy_from(back, buf)
            if not np.array_equal(back, data):
                raise AssertionError(f"{size} bytes copied there and back came back different")
            h2d, d2h = [], []
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                w.copy_to(buf, data)
                w.copy_from(tiny, buf)  # ordered after the upload: its end is the upload's end
                h2d.append(time.perf_counter_ns() - t0)
                t0 = time.perf_counter_ns()
                w.copy_from(back, buf)
                d2h.append(time.perf_counter_ns() - t0)
            if not np.array_equal(back, data):
                raise AssertionError("the timed copies came back different")
            # A copy at an offset lands there.
            w.copy_to(buf, data[:4096], offset=size - 4096)
            w.copy_from(back[:4096], buf, offset=size - 4096)
            if not np.array_equal(back[:4096], data[:4096]):
                raise AssertionError("a copy at an offset came back different")
        finally:
            buf.free()
        stats = w.stats()
    figures.update(
        bytes=size,
        h2d_pageable_GBps=gb_per_s(size, median(h2d)),
        h2d_pageable_GBps_best=gb_per_s(size, min(h2d)),
        d2h_pageable_GBps=gb_per_s(size, median(d2h)),
        d2h_pageable_GBps_best=gb_per_s(size, min(d2h)),
        h2d_calls=stats["h2d_calls"],
        d2h_calls=stats["d2h_calls"],
    )


@pytest.mark.device_check("driver.mirror_refresh_pinned_vs_pageable")
def test_mirror_refresh_pinned_vs_pageable(ctx: Context, figures: Figures) -> None:
    """Mirror refreshes (one D2H into the host mirror of a resident tensor) into page-locked
    mirrors vs pageable ones, the arms interleaved; the mirror holds the device's bytes."""
    from ..benchmarks import _mirror_worker

    need_cuda(ctx)
    size = (16 << 20) if ctx.quick else (256 << 20)
    rounds = 4 if ctx.quick else 7
    n = size // 4
    arms = ("pinned", "pageable")
    seen: dict[str, int] = {}

    def orch(o, t):
        a = o.read_tensor(t)  # refreshes the mirror the copy before the run left stale
        seen["first"], seen["last"] = int(a[0]), int(a[-1])

    call = Callable(orch, [INOUT_], name="mirror_refresh")
    logging.getLogger("simpler").setLevel(logging.ERROR)  # "established a host mirror" notes
    workers = {arm: _mirror_worker("cuda", arm == "pinned") for arm in arms}
    gbps: dict[str, list[float]] = {arm: [] for arm in arms}
    try:
        bufs = {arm: w.malloc(size) for arm, w in workers.items()}
        tensors = {}
        for arm, w in workers.items():
            w.copy_to(bufs[arm], np.arange(n, dtype=np.int32))
            tensors[arm] = bufs[arm].tensor((n,), "int32")
        for r in range(rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                # A copy into the buffer (its first element, unchanged) makes its mirror stale.
                workers[arm].copy_to(bufs[arm], np.zeros(1, np.int32))
                rep = workers[arm].run(call, [tensors[arm]])
                if (seen["first"], seen["last"]) != (0, n - 1):
                    raise AssertionError(f"{arm} mirror reads {seen} after round {r + 1}, not (0, {n - 1})")
                moved = rep.counters["mirror_refresh_bytes"]
                if r > 0:
                    if moved != size:
                        raise AssertionError(f"{arm}: round {r + 1} refreshed {moved} bytes, not {size}")
                    gbps[arm].append(moved / rep.phases["orchestrate"])
        pins = {arm: w.stats()["pins"] for arm, w in workers.items()}
        tensors.clear()
        for arm, w in workers.items():
            w.free(bufs[arm])
    finally:
        for w in workers.values():
            w.close()
    if pins["pinned"] < 1 or pins["pageable"] != 0:
        raise AssertionError(
            f"page-locked mirrors: pinned worker {pins['pinned']}, pageable {pins['pageable']}"
        )
    pinned, pageable = median(gbps["pinned"]), median(gbps["pageable"])
    figures.update(
        bytes=size,
        refresh_pinned_GBps=round(pinned, 3),
        refresh_pageable_GBps=round(pageable, 3),
        pinned_over_pageable=round(pinned / pageable, 3) if pageable else float("nan"),
        pins_pinned_worker=pins["pinned"],
    )


def _noop(*arrays: Any) -> None:
    pass


@pytest.mark.device_check("driver.poison_memset")
def test_poison_memset(ctx: Context, figures: Figures) -> None:
    """A staged OUT tensor that a kernel never writes reads back as the poison byte 0xA5, with a
    host-path kernel and (cuda) with a device kernel."""
    kernels = {"host": Kernel(_noop, [(OUT_, "float32")], name="writes_nothing")}
    if ctx.cuda:
        code = CudaCode(NOTHING_SOURCE, entry=NOTHING_ENTRY, launch=Launch(1, 1))
        kernels["device"] = Kernel(_noop, [(OUT_, "float32")], name="writes_nothing_dev", cuda=code)
    with ctx.worker() as w:
        for kind, k in kernels.items():
            call = Callable(lambda o, out, k=k: o.submit(k, out), [OUT_], name=f"poison_{kind}")
            out = np.zeros(4096, np.float32)
            rep = w.run(call, [out])
            c = rep.counters
            bad = int(np.count_nonzero(out.view(np.uint8) != 0xA5))
            if bad:
                raise AssertionError(f"{kind} kernel: {bad} of {out.nbytes} bytes are not the poison 0xA5")
            if c["poisoned_bytes"] < out.nbytes:
                raise AssertionError(f"{kind} kernel: poisoned_bytes {c['poisoned_bytes']} < {out.nbytes}")
            if kind == "device" and (c["device_tasks"], c["host_path_tasks"]) != (1, 0):
                raise AssertionError(
                    f"device kernel ran as {c['device_tasks']} device / {c['host_path_tasks']} host"
                )
            figures[f"{kind}_poisoned_bytes"] = c["poisoned_bytes"]
        figures["memset_calls"] = w.stats()["memset_calls"]
    if figures["memset_calls"] < 1 and ctx.platform != "sim":
        raise AssertionError("no device memset was counted")


@pytest.mark.device_check("driver.errors")
def test_errors(ctx: Context, figures: Figures) -> None:
    """Errors name the call: a copy past an allocation (``copy_to`` / ``copy_from``), an injected
    ``h2d`` fault in a copy and in a run (a ``DeviceError`` naming the phase and tensor); the
    worker works afterwards."""

    def expect(
        what: str, exc: tuple[type[BaseException], ...], words: tuple[str, ...], fn: Fn[[], Any]
    ) -> str:
        try:
            fn()
        except exc as e:
            msg = str(e)
            missing = [wd for wd in words if wd not in msg]
            if missing:
                raise AssertionError(f"{what}: the error does not name {missing}: {msg}") from e
            return f"{type(e).__name__}: {msg}"
        raise AssertionError(f"{what}: no error was raised")

    add = Kernel(_add_one, [(INOUT_, "float32")], name="add_one")
    call = Callable(lambda o, x: o.submit(add, x), [INOUT_], name="errors")
    with ctx.worker() as w:
        buf = w.malloc(4096)
        big = np.zeros(8192, np.uint8)
        figures["copy_to_past_end"] = expect(
            "copy_to past the end", (ArgumentError, DeviceError), ("copy_to",), lambda: w.copy_to(buf, big)
        )
        figures["copy_from_past_end"] = expect(
            "copy_from past the end",
            (ArgumentError, DeviceError),
            ("copy_from",),
            lambda: w.copy_from(big, buf),
        )
        figures["copy_at_offset_past_end"] = expect(
            "copy_to at an offset past the end",
            (ArgumentError, DeviceError),
            ("copy_to",),
            lambda: w.copy_to(buf, big[:128], offset=4000),
        )
        w.inject_fault("h2d")
        figures["injected_h2d_copy"] = expect(
            "an injected h2d fault", (DeviceError,), ("h2d",), lambda: w.copy_to(buf, big[:1024])
        )
        data = pattern(4096, 3)
        back = np.empty_like(data)
        w.copy_to(buf, data)
        w.copy_from(back, buf)
        if not np.array_equal(back, data):
            raise AssertionError("after the injected fault a copy came back different")
        x = np.zeros(16, np.float32)
        w.inject_fault("h2d")
        figures["injected_h2d_run"] = expect(
            "an injected h2d fault in a run", (DeviceError,), ("bind", "h2d"), lambda: w.run(call, [x])
        )
        rep = w.run(call, [x])
        if not (rep.ok and np.all(x == 1.0)):
            raise AssertionError(f"after the failed run the next run gave {x[:4]} (ok={rep.ok})")
        buf.free()
        figures["live_allocations_after"] = w.stats()["live_allocations"]


@pytest.mark.device_check("driver.sessions")
def test_sessions(ctx: Context, figures: Figures) -> None:
    """The process's vendor session: 10 workers opened and closed in a row open the device once
    (timed, against the same 10 with the session given back after each, as every close did
    before sessions were shared), and the current context of this thread after the session was
    given back and the device opened again (the same primary context object, or not)."""
    from ...worker import release_sessions, session_stats

    release_sessions()
    arms: dict[str, list[float]] = {"shared": [], "per_worker": []}
    opened: dict[str, int] = {}
    for _ in range(1 if ctx.quick else 3):
        for arm in arms:
            before = session_stats()["opened"]
            t0 = time.perf_counter()
            for _ in range(10):
                with ctx.worker() as w:
                    w.free(w.malloc(64))
                if arm == "per_worker":
                    release_sessions()
            release_sessions()
            arms[arm].append(time.perf_counter() - t0)
            opened[arm] = session_stats()["opened"] - before
    if opened["shared"] != 1:
        raise AssertionError(f"10 workers opened {opened['shared']} sessions, not 1")
    figures.update(
        {
            "ten_workers_shared_ms": round(median(arms["shared"]) * 1e3, 3),
            "ten_workers_per_worker_ms": round(median(arms["per_worker"]) * 1e3, 3),
            "sessions_opened": opened,
        }
    )
    if ctx.cuda:
        lib = ctypes.CDLL(os.environ.get("SIMPLER_CUDA_LIB") or "libcuda.so.1")
        get = lib.cuCtxGetCurrent
        get.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        cur = ctypes.c_void_p()
        seen = []
        for _ in range(2):
            with ctx.worker() as w:
                w.free(w.malloc(64))
            get(ctypes.byref(cur))
            seen.append(cur.value or 0)
            release_sessions()
        get(ctypes.byref(cur))
        figures["context_after_close_and_reopen"] = [hex(c) for c in seen]
        figures["same_context_object"] = seen[0] == seen[1]
        figures["context_after_release"] = hex(cur.value or 0)


def _add_one(x: np.ndarray) -> None:
    x += np.float32(1.0)


@pytest.mark.device_check("driver.resident_round_trip")
def test_resident_round_trip(ctx: Context, figures: Figures) -> None:
    """A resident set: uploaded once, a device kernel adds to it in place round after round
    (batched submits), read back through a copy and through the orchestrator's host view."""
    from ..benchmarks import LAUNCH_KERNEL

    n, rounds = 4096, 5
    offsets = np.arange(n, dtype=np.int64).reshape(n, 1)
    seen: dict[str, np.ndarray] = {}

    def orch(o, x, y):
        seen["x"] = np.array(o.read_tensor(x))
        o.submit_many(LAUNCH_KERNEL, x.views([1], offsets), 0.5)

    call = Callable(orch, [INOUT_, IN_], name="resident_round_trip")
    host = np.arange(n, dtype=np.float32)
    other = pattern(n * 4, 4).view(np.float32)
    with ctx.worker() as w, ResidentTaskArgs(w) as res:
        x = res.add("x", host, direction=INOUT_)
        y = res.add("y", other)
        for r in range(rounds):
            rep = w.run(call, [x, y])
            if not np.array_equal(seen["x"], host + np.float32(0.5 * r)):
                raise AssertionError(f"round {r + 1}: the orchestrator's view of x is not the device's state")
            c = rep.counters
            if c["staged_bytes"] != 0:
                raise AssertionError(
                    f"round {r + 1}: {c['staged_bytes']} bytes staged for resident arguments"
                )
        got = np.empty_like(host)
        w.copy_from(got, x)
        if not np.array_equal(got, host + np.float32(0.5 * rounds)):
            raise AssertionError("x after the rounds is not host + 0.5 per round")
        got_y = np.empty_like(other)
        w.copy_from(got_y, y)
        if not np.array_equal(got_y.view(np.uint8), other.view(np.uint8)):
            raise AssertionError("the resident IN tensor came back different")
        figures.update(
            {
                "rounds": rounds,
                "device_tasks": c["device_tasks"],
                "device_launches": c["device_launches"],
                "host_path_tasks": c["host_path_tasks"],
                "mirror_refreshes": c["mirror_refreshes"],
            }
        )
        del x, y
    if ctx.cuda and (figures["host_path_tasks"], figures["device_tasks"]) != (0, n):
        raise AssertionError(
            f"tasks ran {figures['device_tasks']} on the device, {figures['host_path_tasks']} on the host"
        )
