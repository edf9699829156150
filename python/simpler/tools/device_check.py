"""Checks of a vendor platform on a machine with a real device, from an installed package.

``python -m simpler.tools.device_check --out DIR [--platform cuda] [--quick] [--only TEXT]``
``python -m simpler.tools.device_check --preflight [--platform cuda]``

What ``make device-check`` (``.ci/device-check``) runs on a GPU machine, which has no Rust
toolchain and no package registry: the wheel built elsewhere, installed with ``pip --no-deps
--target`` (with the wheels ``make device-wheels`` carries, such as ``ml_dtypes``), and this
module, in one process.

``--preflight`` prints what the run would stand on and exits (:mod:`simpler.tools.preflight`):
the interpreter, the packages (numpy, ml_dtypes, torch, cupy, triton, the NVRTC wheels and their
``libnvrtc`` files), the CUDA driver (the library and ``cuDriverGetVersion``), the device (name,
compute capability, SMs, memory, clocks) and the NVRTC the runtime would compile with. Every
normal run prints the same lines first, before any check, and records the facts in its ``run``
line. When something required is missing (numpy; on cuda the driver library, a ``cuInit`` that
fails, no device) the preflight stops with one line on stderr saying what is missing and how to
get it, exit status 2; without ``ml_dtypes`` the bfloat16 checks (paged attention, bench) are
skipped with that reason and the others run.

Every check is named and timed; a failure is recorded (with its traceback on stdout) and the
next check runs. ``DIR/device_check.jsonl`` gets one JSON line per check (``kind: "check"``:
``name``, ``status`` — passed, failed or skipped —, ``ok`` (not failed), ``seconds``,
``figures``, ``error``, ``skip_reason``) and per figure (``kind: "figure"``: ``check``, ``name``,
``value``), after a ``kind: "run"`` line (versions, driver, host, and the preflight's facts under
``preflight``) and before a ``kind: "summary"`` line. The bench's round records also go to
``DIR/bench_<case>.jsonl`` (``simpler report`` re-prints them). Exit status 1 when a check
failed, else 0.

The checks (``--platform cuda``, the default):

* ``driver.*`` — through the public API: the device opens (when it does not, every other check
  is skipped with that reason); workers opened and closed on 4 threads at once, and one worker
  used from 4 threads; ``copy_to`` / ``copy_from`` of 256 MiB (16 MiB with ``--quick``) from
  pageable memory, GB/s; mirror refreshes into page-locked vs pageable mirrors
  (``SIMPLER_CUDA_PIN_MIRRORS=1`` / ``0``), GB/s; the poison memset (a staged OUT tensor a kernel
  never writes reads back 0xA5, for a host-path kernel and for a device kernel); errors (a copy
  past an allocation is an ``ArgumentError`` / ``DeviceError`` naming the call, an injected
  ``h2d`` fault a ``DeviceError``, in a copy and in a run, and the worker works afterwards); a
  resident set round trip through a device kernel.
* ``paged_attention.*`` — the shipped workload's Small1 / Small2 cases, all three arms, golden
  checked, with the batched orchestration and with the per-task one; on cuda every task runs on
  the device (``host_path_tasks == 0``, ``device_tasks == tasks``).
* ``paged_attention_unroll.*`` — the unrolled workload's CaseVarSeq4 / CaseTwoGroups cases, all
  three arms, golden checked, every task on the device on cuda.
* ``bench.paged_attention_unroll[Case1]`` and ``[Case2]`` (``--quick``: CaseVarSeq4,
  CaseTwoGroups), then ``bench.paged_attention[B64_8K]`` and ``[B256_8K]`` (``--quick``: Small1,
  Small2) — the bench's
  three arms interleaved (:func:`simpler.tools.bench.bench_records`, golden checked): per-phase
  warm medians per arm, the dispatch ratios bulk/staged and all/bulk, execute ms per round; then
  the model's error: the same case priced on sim (2 rounds) under the cost model of the device's
  platform (``h200`` on cuda, ``ascend-a3`` on ascend), printed beside the measured phases (every
  phase, the dispatch path and the round) with the ratio measured / modeled, figures
  ``model.<arm>.<row>.<model>`` (``docs/cost-model.md`` keeps them per platform).
* ``bench.replay`` — warm rounds planned against replayed (:mod:`simpler.tools.bench_replay`),
  with the device's time from events: the host's part of execute, its planning and the device
  time per workload and arm, and each workload's cold plan.
* ``decode.overlap`` — the decode driver's device mode (``examples/decode``) with each step
  waited for and left pending, interleaved: tokens per second of each and their ratio, outputs
  bit for bit the same.
* ``export.queued_work`` — a consumer reads a :class:`~simpler.DeviceTensor` while the memsets
  that write it are still queued on the worker's stream (:mod:`simpler.tools.export_check`; on the
  fake libcuda the stream is held instead): through DLPack (a capsule for the consumer's stream),
  through ``__cuda_array_interface__`` (the consumer waits for its ``stream``, as CAI v3 asks), and
  with torch on a real GPU through ``torch.from_dlpack`` under a side stream: every such read sees
  the new bytes. A read that does not wait is counted; it must have seen stale bytes at least
  once, or the race never happened and the check fails for proving nothing.
* ``compile.kernel_resources`` — every shipped CUDA source compiled for the device's
  architecture with the NVRTC chosen for its driver (:func:`simpler.compile_cuda`): registers,
  stack and spills per entry from ptxas' report; a spill fails the check.
* ``launches`` — the ``launches`` benchmark (:func:`simpler.tools.benchmarks.bench_launches`):
  N single submits vs one ``submit_many``, per task; on cuda one launch per single submit and one
  per ``submit_many``, every task on the device.

On CI's fake libcuda (``simpler.testing.fake_cuda``; ``.ci/device-check --dry-run``) the fake's
host kernels are installed first and what needs a real GPU is skipped with the reason. On other
platforms (``ascend``, ``sim``) the CUDA-only checks are skipped.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import logging
import os
import platform as _platform
import sys
import threading
import time
import traceback
from collections.abc import Callable as Fn
from pathlib import Path
from statistics import median
from typing import IO, TYPE_CHECKING, Any

# What ``import simpler`` has loaded already (the package needs numpy and its native module to
# import at all: a missing numpy stops there, with one line, see simpler/__init__.py): these
# imports cannot fail here. What could (the workloads, the bench, the benchmarks, the reports,
# torch) is imported inside the checks that use it, after the preflight.
import numpy as np

from .. import __version__
from .._arrays import np_dtype
from ..args import ResidentTaskArgs
from ..errors import ArgumentError, DeviceError, PlatformUnavailableError
from ..testing import fake_cuda
from ..testing.running import run_case
from ..worker import ArgDirection, Callable, CudaCode, Kernel, Launch, Worker
from . import preflight

if TYPE_CHECKING:
    from .._core import _Platform

__all__ = ["CHECKS", "Context", "Skip", "main", "run_checks"]

IN_, OUT_, INOUT_ = ArgDirection.IN, ArgDirection.OUT, ArgDirection.INOUT


class Skip(Exception):
    """A check that does not apply here: recorded as skipped, with this reason."""


class Context:
    """What every check gets: the platform, ``--quick``, whether the driver is the fake, the
    output folder, and the preflight's facts (:func:`simpler.tools.preflight.run`)."""

    def __init__(
        self, platform: _Platform, quick: bool, fake: bool, out: Path, facts: dict[str, Any] | None = None
    ) -> None:
        self.platform = platform
        self.quick = quick
        self.fake = fake
        self.out = out
        self.facts = facts or {}

    @property
    def cuda(self) -> bool:
        """Whether the platform is cuda."""
        return self.platform == "cuda"

    def worker(self, **options: Any) -> Worker:
        """A new worker on the platform."""
        return Worker(self.platform, **options)


Figures = dict[str, Any]
Check = Fn[[Context], Figures]


def _need_cuda(ctx: Context) -> None:
    if not ctx.cuda:
        raise Skip(f"a cuda check (platform {ctx.platform})")


def _need_bfloat16() -> None:
    """Skips a check whose tensors are bfloat16 when ``ml_dtypes`` is missing, with the error
    that names the fix."""
    try:
        np_dtype("bfloat16")
    except ImportError as e:
        raise Skip(
            f"ml_dtypes is missing and bfloat16 needs it: pip install ml-dtypes, or carry its wheel "
            f"here with make device-wheels ({e})"
        ) from None


def _gbps(nbytes: float, ns: float) -> float:
    return round(nbytes / ns, 3) if ns > 0 else float("nan")  # bytes per ns == GB/s


def _pattern(nbytes: int, seed: int) -> np.ndarray:
    """``nbytes`` (a multiple of 8) of distinct-looking bytes, made fast."""
    words = np.arange(nbytes // 8, dtype=np.uint64)
    words *= np.uint64(0x9E3779B97F4A7C15)
    words ^= np.uint64((seed * 0x5851F42D4C957F2D + 1) & 0xFFFF_FFFF_FFFF_FFFF)
    return words.view(np.uint8)


# -- a: the driver, through the public API ------------------------------------------------------------


def check_open(ctx: Context) -> Figures:
    """The device opens (a worker), allocates, copies and closes; when it does not, the other
    checks are skipped."""
    with ctx.worker() as w:
        buf = w.malloc(4096)
        data = _pattern(4096, 0)
        back = np.empty_like(data)
        w.copy_to(buf, data)
        w.copy_from(back, buf)
        buf.free()
        if not np.array_equal(back, data):
            raise AssertionError("4 KiB copied there and back came back different")
        return {"device_id": w.device_id, "worker": repr(w)}


def _threads(n: int, body: Fn[[int], None], barrier: threading.Barrier | None = None) -> None:
    """Runs ``body(k)`` on ``n`` threads; raises what they raised, one line each."""
    errors: list[str] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        try:
            body(k)
        except BaseException as e:
            with lock:
                errors.append(f"thread {k}: {type(e).__name__}: {e}")
            if barrier is not None:
                barrier.abort()

    ts = [threading.Thread(target=run, args=(k,), name=f"device-check-{k}") for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise AssertionError("; ".join(sorted(errors)))


def check_open_close_threads(ctx: Context) -> Figures:
    """Workers opened and closed on 4 threads at once (each copies 1 MiB there and back); then
    one worker opened here and used from 4 threads (copies at once, runs of a device kernel one
    at a time: a worker runs one call at a time) and closed here."""
    threads, cycles = 4, (3 if ctx.quick else 10)
    barrier = threading.Barrier(threads)
    per_cycle: list[float] = []

    def own_worker(k: int) -> None:
        data = _pattern(1 << 20, k)
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

    _threads(threads, own_worker, barrier)

    from .benchmarks import LAUNCH_KERNEL

    n, runs = 1024, 5
    offsets = np.arange(n, dtype=np.int64).reshape(n, 1)
    call = Callable(lambda o, x: o.submit_many(LAUNCH_KERNEL, x.views([1], offsets), 0.5), [INOUT_])
    run_lock = threading.Lock()
    device_tasks: list[int] = []
    with ctx.worker() as shared:

        def use_shared(k: int) -> None:
            data = _pattern(1 << 20, 10 + k)
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

        _threads(threads, use_shared)
    if ctx.cuda and device_tasks != [n] * (threads * runs):
        raise AssertionError(f"runs on the shared worker ran {sorted(set(device_tasks))} tasks on the device")
    return {
        "threads": threads,
        "cycles": cycles,
        "open_copy_close_ms_median": round(median(per_cycle) * 1e3, 3),
        "open_copy_close_ms_max": round(max(per_cycle) * 1e3, 3),
        "shared_worker_runs": threads * runs,
    }


def check_sessions(ctx: Context) -> Figures:
    """The process's vendor session: 10 workers opened and closed in a row open the device once
    (timed, against the same 10 with the session given back after each, as every close did
    before sessions were shared), and the current context of this thread after the session was
    given back and the device opened again (the same primary context object, or not)."""
    from ..worker import release_sessions, session_stats

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
    figures: Figures = {
        "ten_workers_shared_ms": round(median(arms["shared"]) * 1e3, 3),
        "ten_workers_per_worker_ms": round(median(arms["per_worker"]) * 1e3, 3),
        "sessions_opened": opened,
    }
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
    return figures


def check_copies(ctx: Context) -> Figures:
    """``copy_to`` / ``copy_from`` of one large buffer from pageable numpy memory: bandwidth, and
    the bytes come back."""
    size = (16 << 20) if ctx.quick else (256 << 20)
    reps = 3 if ctx.quick else 5
    data = _pattern(size, 1)
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
    return {
        "bytes": size,
        "h2d_pageable_GBps": _gbps(size, median(h2d)),
        "h2d_pageable_GBps_best": _gbps(size, min(h2d)),
        "d2h_pageable_GBps": _gbps(size, median(d2h)),
        "d2h_pageable_GBps_best": _gbps(size, min(d2h)),
        "h2d_calls": stats["h2d_calls"],
        "d2h_calls": stats["d2h_calls"],
    }


def check_mirror_pinning(ctx: Context) -> Figures:
    """Mirror refreshes (one D2H into the host mirror of a resident tensor) into page-locked
    mirrors vs pageable ones, the arms interleaved; the mirror holds the device's bytes."""
    from .benchmarks import _mirror_worker

    _need_cuda(ctx)
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
    return {
        "bytes": size,
        "refresh_pinned_GBps": round(pinned, 3),
        "refresh_pageable_GBps": round(pageable, 3),
        "pinned_over_pageable": round(pinned / pageable, 3) if pageable else float("nan"),
        "pins_pinned_worker": pins["pinned"],
    }


def _noop(*arrays: Any) -> None:
    pass


#: A device entry that writes nothing (the poison check's device kernel).
NOTHING_ENTRY = "simpler_check_nothing"
NOTHING_SOURCE = """
/* simpler device-check: writes nothing (simpler.tools.device_check) */
extern "C" __global__ void simpler_check_nothing(const unsigned long long* rows) {}
"""


def _register_fake_impls() -> None:
    if NOTHING_ENTRY not in fake_cuda.IMPLS:
        fake_cuda.host_impl(NOTHING_ENTRY)(lambda launch: None)


def check_poison(ctx: Context) -> Figures:
    """A staged OUT tensor that a kernel never writes reads back as the poison byte 0xA5, with a
    host-path kernel and (cuda) with a device kernel."""
    kernels = {"host": Kernel(_noop, [(OUT_, "float32")], name="writes_nothing")}
    if ctx.cuda:
        code = CudaCode(NOTHING_SOURCE, entry=NOTHING_ENTRY, launch=Launch(1, 1))
        kernels["device"] = Kernel(_noop, [(OUT_, "float32")], name="writes_nothing_dev", cuda=code)
    figures: Figures = {}
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
    return figures


def check_errors(ctx: Context) -> Figures:
    """Errors name the call: a copy past an allocation (``copy_to`` / ``copy_from``), an injected
    ``h2d`` fault in a copy and in a run (a ``DeviceError`` naming the phase and tensor); the
    worker works afterwards."""
    figures: Figures = {}

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
        data = _pattern(4096, 3)
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
    return figures


def _add_one(x: np.ndarray) -> None:
    x += np.float32(1.0)


def check_resident_round_trip(ctx: Context) -> Figures:
    """A resident set: uploaded once, a device kernel adds to it in place round after round
    (batched submits), read back through a copy and through the orchestrator's host view."""
    from .benchmarks import LAUNCH_KERNEL

    n, rounds = 4096, 5
    offsets = np.arange(n, dtype=np.int64).reshape(n, 1)
    seen: dict[str, np.ndarray] = {}

    def orch(o, x, y):
        seen["x"] = np.array(o.read_tensor(x))
        o.submit_many(LAUNCH_KERNEL, x.views([1], offsets), 0.5)

    call = Callable(orch, [INOUT_, IN_], name="resident_round_trip")
    host = np.arange(n, dtype=np.float32)
    other = _pattern(n * 4, 4).view(np.float32)
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
        figures = {
            "rounds": rounds,
            "device_tasks": c["device_tasks"],
            "device_launches": c["device_launches"],
            "host_path_tasks": c["host_path_tasks"],
            "mirror_refreshes": c["mirror_refreshes"],
        }
        del x, y
    if ctx.cuda and (figures["host_path_tasks"], figures["device_tasks"]) != (0, n):
        raise AssertionError(
            f"tasks ran {figures['device_tasks']} on the device, {figures['host_path_tasks']} on the host"
        )
    return figures


# -- b: the shipped workload's cases on the platform, golden checked -----------------------------------


def _case_check(case_name: str, per_task: bool = False, unrolled: bool = False) -> Check:
    def check(ctx: Context) -> Figures:
        _need_bfloat16()
        from ..workloads import paged_attention as pa
        from ..workloads import paged_attention_unroll as pu

        cls: type = pu.PagedAttentionUnroll if unrolled else pa.PagedAttention
        if per_task:

            class PerTask(pa.PagedAttention):
                CALLABLE = pa.CALLABLE_PER_TASK

            cls = PerTask
        rounds = 3
        reports = run_case(cls, case_name, ctx.platform, rounds)
        figures: Figures = {"rounds": rounds, "warm_rounds": max(rounds - 1, 1)}
        for r, rep in enumerate(reports, 1):
            c = rep.counters
            if not rep.ok:
                raise AssertionError(f"round {r}: the run did not succeed")
            if ctx.cuda and (c["host_path_tasks"] != 0 or c["device_tasks"] != c["tasks"]):
                raise AssertionError(
                    f"round {r}: {c['tasks']} tasks, {c['device_tasks']} on the device, "
                    f"{c['host_path_tasks']} on the host path"
                )
        c = reports[-1].counters
        figures.update(
            tasks=c["tasks"],
            submits=c["submits"],
            device_launches=c["device_launches"],
            device_tasks=c["device_tasks"],
            host_path_tasks=c["host_path_tasks"],
            execute_us_median=round(median(rep.phases["execute"] for rep in reports[1:]) / 1e3, 3),
        )
        return figures

    return check


# -- c: the bench's three arms -------------------------------------------------------------------------


def _bench_check(case: str, workload: str = "paged_attention") -> Check:
    def check(ctx: Context) -> Figures:
        _need_bfloat16()
        from .bench import BenchOptions, bench_records
        from .report import format_tables

        rounds = 3 if ctx.quick else 5
        opts = BenchOptions(workload=workload, rounds=rounds, platform=ctx.platform, cases=[case])
        # The device's part of execute, timed with events around each batch of launches.
        before = os.environ.get("SIMPLER_DEVICE_TIMING")
        os.environ["SIMPLER_DEVICE_TIMING"] = "1"
        try:
            records, failures = bench_records(opts, progress=False)
        finally:
            if before is None:
                os.environ.pop("SIMPLER_DEVICE_TIMING", None)
            else:
                os.environ["SIMPLER_DEVICE_TIMING"] = before
        if records:
            with open(ctx.out / f"bench_{workload}_{case}.jsonl", "w", encoding="utf-8") as f:
                for rec in records:
                    f.write(json.dumps(rec, sort_keys=True) + "\n")
            print(format_tables(records))
        if failures:
            raise AssertionError("; ".join(failures))
        by_arm: dict[str, list[dict[str, Any]]] = {}
        for rec in records:
            by_arm.setdefault(rec["arm"], []).append(rec)
        figures: Figures = {"rounds": rounds, "warm_rounds": max(rounds - 1, 1)}
        dispatch: dict[str, float] = {}
        for arm, recs in by_arm.items():
            recs.sort(key=lambda r: r["round"])
            warm = recs[1:] or recs
            for rec in recs:
                c = rec["counters"]
                if ctx.cuda and (c["host_path_tasks"] != 0 or c["device_tasks"] != c["tasks"]):
                    raise AssertionError(
                        f"{arm} round {rec['round']}: {c['tasks']} tasks, {c['device_tasks']} on the "
                        f"device, {c['host_path_tasks']} on the host path"
                    )
            for phase in warm[0]["phases"]:
                figures[f"{arm}.{phase}_ms"] = round(median(r["phases"][phase] for r in warm) / 1e6, 4)
            dispatch[arm] = median(r["dispatch_ns"] for r in warm)
            figures[f"{arm}.dispatch_ms"] = round(dispatch[arm] / 1e6, 4)
            figures[f"{arm}.execute_ms_per_round"] = [round(r["phases"]["execute"] / 1e6, 4) for r in recs]
            # Execute split as measured: the device's part (events), the host's wait for it, and
            # the rest, the host's own work (planning, row upload, launch calls).
            wait = median(r["counters"]["execute_wait_ns"] for r in warm)
            figures[f"{arm}.device_ms"] = round(median(r["counters"]["device_ns"] for r in warm) / 1e6, 4)
            figures[f"{arm}.execute_wait_ms"] = round(wait / 1e6, 4)
            figures[f"{arm}.execute_host_ms"] = round(
                median(r["phases"]["execute"] - r["counters"]["execute_wait_ns"] for r in warm) / 1e6, 4
            )
            figures[f"{arm}.bytes_per_round"] = warm[-1]["bytes_moved"]
            figures[f"{arm}.tasks"] = warm[-1]["counters"]["tasks"]
            figures[f"{arm}.device_launches"] = warm[-1]["counters"]["device_launches"]
        if "Residency_staged" in dispatch and "Residency_bulk" in dispatch:
            figures["dispatch_ratio_bulk_over_staged"] = round(
                dispatch["Residency_bulk"] / dispatch["Residency_staged"], 4
            )
        if "Residency_bulk" in dispatch and "Residency_all" in dispatch:
            figures["dispatch_ratio_all_over_bulk"] = round(
                dispatch["Residency_all"] / dispatch["Residency_bulk"], 4
            )
        figures.update(_model_error(ctx, case, records, workload))
        return figures

    return check


# The cost model that stands for each platform's device (the driver's `CostModel::for_platform`):
# the device's measured phases are compared with this model only.
PLATFORM_MODEL = {"cuda": "h200", "ascend": "ascend-a3"}

# Rounds of the priced sim run: its modeled phases do not vary from one warm round to the next,
# so one cold and one warm round say all (they run while the device is held).
MODEL_ROUNDS = 2


def _model_error(
    ctx: Context, case: str, measured: list[dict[str, Any]], workload: str = "paged_attention"
) -> Figures:
    """The model's error: the same case priced on sim (golden skipped: the device run checked
    it) under the model of the device's platform (:data:`PLATFORM_MODEL`), printed beside the
    device's measured phases with the ratio measured / modeled; the ratios become figures
    ``model.<arm>.<row>.<model>``. Nothing on a platform without a model (sim)."""
    from .bench import BenchOptions, bench_records
    from .report import format_model_comparison, model_comparison

    model = PLATFORM_MODEL.get(ctx.platform)
    if model is None:
        return {}
    opts = BenchOptions(
        workload=workload,
        rounds=MODEL_ROUNDS,
        platform="sim",
        cases=[case],
        skip_golden=True,
        worker_options={"model": model},
    )
    modeled, failures = bench_records(opts, progress=False)
    if failures:
        raise AssertionError("; ".join(failures))
    print(format_model_comparison(measured, modeled, measured_on=ctx.platform))
    return {
        f"model.{r['arm']}.{r['row']}.{m}": round(ratio, 4)
        for r in model_comparison(measured, modeled)
        for m, ratio in r["ratio"].items()
        if ratio is not None
    }


# -- d: exports while work is still queued --------------------------------------------------------------


def check_replay(ctx: Context) -> Figures:
    """Warm rounds planned against replayed (``python -m simpler.tools.benchmarks replay``),
    with the device's time from events: per workload and arm, the medians of the host's part
    of execute, its planning, and the device time (ns)."""
    _need_cuda(ctx)
    _need_bfloat16()  # the paged attention's inputs
    from .bench_replay import bench_replay

    before = os.environ.get("SIMPLER_DEVICE_TIMING")
    os.environ["SIMPLER_DEVICE_TIMING"] = "1"
    try:
        got = bench_replay(ctx.quick, ctx.platform)
    finally:
        if before is None:
            os.environ.pop("SIMPLER_DEVICE_TIMING", None)
        else:
            os.environ["SIMPLER_DEVICE_TIMING"] = before
    figures: Figures = {"rounds": got["rounds"]}
    for label, w in got["workloads"].items():
        key = label.replace(" ", "_")
        for arm, m in w["median_ns"].items():
            figures[f"{key}.{arm}.exec_host_us"] = round(m["host"] / 1e3, 2)
            figures[f"{key}.{arm}.plan_us"] = round(m["plan"] / 1e3, 2)
            figures[f"{key}.{arm}.device_us"] = round(m["device"] / 1e3, 2)
        figures[f"{key}.cold_plan_us"] = round(w["cold_plan_ns"] / 1e3, 2)
    return figures


def check_decode_overlap(ctx: Context) -> Figures:
    """The decode driver's device mode with each step waited for and left pending
    (``w.run(..., wait=False)``), interleaved: tokens per second of each (medians), and the
    outputs of the two arms bit for bit."""
    _need_cuda(ctx)
    # The driver is an example: in a checkout beside this package, or in the working directory
    # (an installed wheel run from the repository).
    roots = (Path(__file__).resolve().parents[3], Path.cwd())
    found = [r / "examples" / "decode" for r in roots if (r / "examples" / "decode" / "decode.py").exists()]
    if not found:
        raise Skip("examples/decode/decode.py is neither beside this package nor in the working directory")
    examples = found[0]
    cfg_args = {
        "layers": 2 if ctx.quick else 8,
        "hidden": 64 if ctx.quick else 512,
        "heads": 8,
        "kv_heads": 2,
    }
    rounds = 4 if ctx.quick else 32
    arms: dict[bool, list[Any]] = {True: [], False: []}
    # The driver imports its kernels' device code from beside it, while it runs.
    sys.path.insert(0, str(examples))
    try:
        from decode import DecodeConfig, run_decode  # type: ignore[import-not-found]  # an example

        cfg = DecodeConfig(**cfg_args)
        for i in range(2 if ctx.quick else 4):
            for wait in (True, False) if i % 2 == 0 else (False, True):
                arms[wait].append(run_decode(cfg, "device", rounds, ctx.platform, wait=wait))
    finally:
        sys.path.remove(str(examples))
    bad = [r for rs in arms.values() for r in rs if r.golden_ok is False]
    if bad:
        raise AssertionError(f"decode golden failed: {bad[0].golden_errors}")
    if any(not np.array_equal(a.out, b.out) for a, b in zip(arms[True], arms[False])):
        raise AssertionError("a pending step gave other outputs than a waited one")
    waited = median(r.tokens_per_s for r in arms[True])
    pending = median(r.tokens_per_s for r in arms[False])
    return {
        "rounds": rounds,
        "waited_tokens_per_s": round(waited, 2),
        "pending_tokens_per_s": round(pending, 2),
        "pending_over_waited": round(pending / waited, 4),
        "device_launches_per_step": arms[False][0].reports[-1].counters["device_launches"],
    }


def check_export_queued(ctx: Context) -> Figures:
    """A consumer reads a device tensor while the work that writes it is still queued on the
    worker's stream (:mod:`simpler.tools.export_check`): the reads that wait as DLPack and the
    CUDA Array Interface ask see the new bytes, every time; a read that does not wait must have
    seen stale bytes at least once, or the check proved nothing. With torch on a real GPU,
    ``torch.from_dlpack`` under a side stream is judged too."""
    from . import export_check

    _need_cuda(ctx)
    use_torch = False
    if not ctx.fake:
        try:
            import torch

            use_torch = bool(torch.cuda.is_available())
        except ImportError:
            use_torch = False
    nbytes = (16 << 20) if ctx.quick else (256 << 20)
    iterations = 5 if ctx.quick else 50
    with ctx.worker() as w:
        figures = export_check.run_export_check(w, iterations, nbytes, use_torch)
    figures["torch"] = use_torch
    return figures


# -- the shipped kernels' resources ------------------------------------------------------------------


def _shipped_cuda_sources() -> list[tuple[str, str]]:
    """Every CUDA source the package ships, by name."""
    from .benchmarks import LAUNCH_SOURCE

    sources = [("launches_benchmark", LAUNCH_SOURCE), ("device_check_nothing", NOTHING_SOURCE)]
    try:
        from ..workloads import paged_attention_cuda as pac
        from ..workloads import paged_attention_unroll_cuda as puc

        sources[:0] = [("paged_attention", pac.SOURCE), ("paged_attention_unroll", puc.SOURCE)]
    except ImportError:  # pragma: no cover - the workloads import without ml_dtypes
        pass
    return sources


def check_kernel_resources(ctx: Context) -> Figures:
    """Every shipped CUDA source compiled for this device's architecture with the NVRTC the
    runtime chose for its driver (:func:`simpler.compile_cuda`): registers, stack and spills per
    entry, from ptxas' report in the compile log. A spill fails the check."""
    from .. import compile_cuda

    _need_cuda(ctx)
    device = ctx.facts.get("device") or {}
    cc = tuple(device.get("capability") or ())
    if len(cc) != 2:
        raise Skip("the preflight could not read the device's compute capability")
    driver = (ctx.facts.get("nvrtc") or {}).get("driver")
    figures: Figures = {}
    spills = []
    for what, src in _shipped_cuda_sources():
        r = compile_cuda(src, cc, name=f"{what}.cu", driver=tuple(driver) if driver else None)
        figures[f"{what}.target"] = r["target"]
        figures[f"{what}.nvrtc"] = r["nvrtc"]
        if not r["kernels"]:
            if r["kind"] == "cubin" and not ctx.fake:
                raise AssertionError(
                    f"{what}: the compile log of the {r['target']} cubin has no ptxas report "
                    f"(--ptxas-options=-v) from {r['nvrtc']}"
                )
            # PTX is compiled by the driver, not ptxas; the fake NVRTC runs no ptxas.
            figures[f"{what}.resources"] = f"not reported ({r['kind']} from this NVRTC)"
        for entry, k in r["kernels"].items():
            for key in ("registers", "stack_bytes", "spill_store_bytes", "spill_load_bytes"):
                figures[f"{what}.{entry}.{key}"] = k[key]
            if k["spill_store_bytes"] or k["spill_load_bytes"]:
                stored, loaded = k["spill_store_bytes"], k["spill_load_bytes"]
                spills.append(f"{entry} ({stored} B stored, {loaded} B loaded)")
    if spills:
        raise AssertionError("register spills: " + ", ".join(spills))
    return figures


# -- e: the launches benchmark ---------------------------------------------------------------------------


def check_launches(ctx: Context) -> Figures:
    """The ``launches`` benchmark; on cuda: a launch per single submit, one per ``submit_many``,
    every task on the device, every element right."""
    from .benchmarks import bench_launches

    figs = bench_launches(ctx.quick, ctx.platform)
    out: Figures = {"verified": figs["verified"]}
    problems = []
    for r in figs["results"]:
        key = f"{r['arm']}.{r['n']}"
        for k in ("orchestrate_ns_per_task", "execute_ns_per_task", "tasks_per_s", "launches_per_s"):
            out[f"{key}.{k}"] = round(r[k], 3)
        for k in ("device_launches", "device_tasks", "host_path_tasks"):
            out[f"{key}.{k}"] = r[k]
        if ctx.cuda:
            launches = r["n"] if r["arm"] == "single" else -(-r["n"] // 65535)
            if (r["device_launches"], r["device_tasks"], r["host_path_tasks"]) != (launches, r["n"], 0):
                problems.append(
                    f"{key}: {r['device_launches']} launches, {r['device_tasks']} device tasks, "
                    f"{r['host_path_tasks']} host-path tasks (expected {launches}, {r['n']}, 0)"
                )
    out.update({f"ratio_single_over_many.{k}": round(v, 3) for k, v in figs["ratios"].items()})
    if "device_code" in figs:
        out.update({f"device_code.{k}": v for k, v in figs["device_code"].items()})
    if problems:
        raise AssertionError("; ".join(problems))
    return out


# -- the list, and running it -------------------------------------------------------------------------


def _checks(quick: bool) -> list[tuple[str, Check]]:
    checks: list[tuple[str, Check]] = [
        ("driver.open", check_open),
        ("driver.open_close_threads", check_open_close_threads),
        ("driver.copies_pageable", check_copies),
        ("driver.mirror_refresh_pinned_vs_pageable", check_mirror_pinning),
        ("driver.poison_memset", check_poison),
        ("driver.errors", check_errors),
        ("driver.sessions", check_sessions),
        ("driver.resident_round_trip", check_resident_round_trip),
    ]
    for base in ("Small1", "Small2"):
        for arm in ("Residency_staged", "Residency_bulk", "Residency_all"):
            checks.append((f"paged_attention.{base}_{arm}", _case_check(f"{base}_{arm}")))
    checks.append(
        ("paged_attention.per_task.Small1_Residency_all", _case_check("Small1_Residency_all", True))
    )
    for base in ("CaseVarSeq4", "CaseTwoGroups"):
        for arm in ("Residency_staged", "Residency_bulk", "Residency_all"):
            name = f"paged_attention_unroll.{base}_{arm}"
            checks.append((name, _case_check(f"{base}_{arm}", unrolled=True)))
    # The unrolled graph leads (upstream's Case1 and Case2, event-timed); the per-block graph follows.
    for case in ("CaseVarSeq4", "CaseTwoGroups") if quick else ("Case1", "Case2"):
        checks.append((f"bench.paged_attention_unroll[{case}]", _bench_check(case, "paged_attention_unroll")))
    for case in ("Small1", "Small2") if quick else ("B64_8K", "B256_8K"):
        checks.append((f"bench.paged_attention[{case}]", _bench_check(case)))
    checks.append(("bench.replay", check_replay))
    checks.append(("decode.overlap", check_decode_overlap))
    checks.append(("export.queued_work", check_export_queued))
    checks.append(("compile.kernel_resources", check_kernel_resources))
    checks.append(("launches", check_launches))
    return checks


#: The names of the checks, in order (``--quick`` replaces the bench's cases with small ones).
CHECKS = tuple(name for name, _ in _checks(False))


def _driver_info(platform: str) -> dict[str, Any]:
    """What the run line records about the driver (best effort)."""
    info: dict[str, Any] = {}
    for mod in ("torch", "cupy", "triton", "pytest"):
        info[f"has_{mod}"] = importlib.util.find_spec(mod) is not None
    if platform == "cuda":
        from .._cuda import nvrtc_dirs

        info["SIMPLER_CUDA_LIB"] = os.environ.get("SIMPLER_CUDA_LIB")
        info["SIMPLER_NVRTC_LIB"] = os.environ.get("SIMPLER_NVRTC_LIB")
        info["CUDA_HOME"] = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        info["nvrtc_wheel_dirs"] = nvrtc_dirs()
        try:
            import ctypes

            lib = ctypes.CDLL(os.environ.get("SIMPLER_CUDA_LIB") or "libcuda.so.1")
            v = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
                info["cuda_driver_version"] = v.value
        except (OSError, AttributeError):
            pass
    return info


def _write(f: IO[str], rec: dict[str, Any]) -> None:
    f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
    f.flush()


def _fmt_fig(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt_fig(x) for x in v) + "]"
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def run_checks(
    platform: _Platform,
    out: Path,
    quick: bool = False,
    only: list[str] | None = None,
    facts: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], Path]:
    """Runs the checks (those whose name contains one of ``only``, else all); returns one
    record per check and the path of the JSON lines written. ``facts`` are the preflight's
    (:func:`simpler.tools.preflight.run`), recorded in the run line; without them the preflight
    runs here first (and raises :class:`~simpler.tools.preflight.PreflightError` when something
    required is missing)."""
    import simpler  # where it was imported from, for the run line

    if facts is None:
        facts = preflight.run(platform, before_nvrtc=_fake_first(platform))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "device_check.jsonl"
    fake = False
    if platform == "cuda":
        _register_fake_impls()
        fake = _install_if_fake()  # CI: the fake's host kernels run the launches
    ctx = Context(platform, quick, fake, out, facts)
    meta = {
        "kind": "run",
        "platform": platform,
        "fake_driver": fake,
        "quick": quick,
        "simpler": __version__,
        "simpler_path": str(Path(simpler.__file__).parent),
        "python": _platform.python_version(),
        "numpy": np.__version__,
        "host": _platform.node(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **_driver_info(platform),
        "preflight": facts,
    }
    print(
        f"device-check: platform {platform}{' (fake libcuda)' if fake else ''}, simpler {__version__} "
        f"from {meta['simpler_path']}, python {meta['python']}, numpy {np.__version__}"
    )
    context = _figure_context(facts)
    results: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    with open(path, "w", encoding="utf-8") as f:
        _write(f, meta)
        for name, fn in _checks(quick):
            if only and name != "driver.open" and not any(o in name for o in only):
                continue
            print(f"\n== device-check: {name} ==", flush=True)
            t0 = time.perf_counter()
            rec: dict[str, Any] = {
                "kind": "check",
                "name": name,
                "figures": {},
                "error": None,
                "skip_reason": None,
            }
            try:
                rec["figures"] = fn(ctx) or {}
                rec["status"] = "passed"
            except Skip as e:
                rec["status"], rec["skip_reason"] = "skipped", str(e)
            except Exception as e:
                rec["status"] = "failed"
                rec["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc(file=sys.stdout)
            rec["seconds"] = round(time.perf_counter() - t0, 3)
            rec["ok"] = rec["status"] != "failed"
            sys.stdout.flush()
            _write(f, rec)
            for k, v in rec["figures"].items():
                _write(f, {"kind": "figure", "check": name, "name": k, "value": v, **context})
            word = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[rec["status"]]
            why = _short(rec["error"] or rec["skip_reason"] or "")
            print(f"{word} {name} ({rec['seconds']:.1f} s){': ' + why if why else ''}")
            for k, v in rec["figures"].items():
                print(f"     {k} = {_fmt_fig(v)}")
            results.append(rec)
        counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "skipped")}
        _write(f, {"kind": "summary", **counts, "seconds": round(time.perf_counter() - t_all, 3)})
    return results, path


def _figure_context(facts: dict[str, Any]) -> dict[str, Any]:
    """What every figure line records of where it was measured: the device (name, compute
    capability, clocks where readable), the driver and the NVRTC, from the preflight's facts."""
    device = facts.get("device") or {}
    driver = facts.get("driver") or {}
    nvrtc = facts.get("nvrtc") or {}
    return {
        "device": device.get("name"),
        "capability": device.get("capability"),
        "clock_khz": device.get("clock_khz"),
        "memory_clock_khz": device.get("memory_clock_khz"),
        "driver_version": driver.get("version"),
        "nvrtc": (
            f"{nvrtc['version'][0]}.{nvrtc['version'][1]} {nvrtc.get('path')}"
            if nvrtc.get("version")
            else None
        ),
    }


def _short(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut at ``limit`` characters (the whole is in the JSON)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _summary(results: list[dict[str, Any]], path: Path, seconds: float) -> str:
    lines = ["", "== device-check: summary =="]
    for r in results:
        word = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[r["status"]]
        why = _short(r["error"] or r["skip_reason"] or "")
        lines.append(f"{word}  {r['seconds']:7.1f} s  {r['name']}{'  (' + why + ')' if why else ''}")
    counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "skipped")}
    lines.append(
        f"device-check: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"in {seconds:.1f} s; JSON lines in {path}"
    )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simpler.tools.device_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", metavar="DIR", help="folder for device_check.jsonl (made if missing; not with --preflight)"
    )
    p.add_argument(
        "--preflight",
        action="store_true",
        help="print the interpreter, packages, driver, device and NVRTC choice, then exit",
    )
    p.add_argument("--platform", default="cuda", choices=("cuda", "ascend", "sim"), help="default cuda")
    p.add_argument("--quick", action="store_true", help="small sizes, the Small cases in the bench")
    p.add_argument("--only", action="append", metavar="TEXT", help="only the checks whose name contains TEXT")
    return p


def _fake_first(platform: str) -> Fn[[], object] | None:
    """What runs before the preflight's NVRTC choice: on cuda, the fake libcuda's set-up (its
    host kernels, and NVRTC pointed at the fake's own), so the choice printed is the one the
    checks get; nothing on a real driver."""
    return _install_if_fake if platform == "cuda" else None


def _install_if_fake() -> bool:
    """On the fake libcuda: the shipped workloads' host kernels, registered (they import the
    workloads, which load after the preflight)."""
    from ..testing import fake_kernels

    return fake_kernels.install_if_fake()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m simpler.tools.device_check``; returns the exit status (2 when
    the preflight finds something required missing)."""
    p = _parser()
    a = p.parse_args(argv)
    if not a.out and not a.preflight:
        p.error("--out DIR is required (except with --preflight)")
    try:
        facts = preflight.run(a.platform, before_nvrtc=_fake_first(a.platform))
    except preflight.NoDevice as e:
        print(f"device-check: skipped: {e}", flush=True)
        return 0
    except preflight.PreflightError as e:
        print(f"device-check: preflight: {e}", file=sys.stderr, flush=True)
        return 2
    if a.preflight:
        return 0
    try:
        Worker(a.platform).close()
    except PlatformUnavailableError as e:
        print(f"device-check: skipped: {e}")
        return 0
    except Exception:
        pass  # the device does not open: the first check (driver.open) records why
    t0 = time.perf_counter()
    results, path = run_checks(a.platform, Path(a.out).resolve(), a.quick, a.only, facts)
    print(_summary(results, path, time.perf_counter() - t0))
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
