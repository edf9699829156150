"""The ``lifecycle`` benchmark: ten workers opened and closed in a row on a vendor platform.

Two arms, interleaved round by round in one process:

* ``shared`` — the workers share the process's vendor session on the device (what a pytest
  suite with one worker per test does now): the device is opened once, and given back once,
  at the end (``release_sessions``, which the exit hook calls);
* ``per worker`` — the session is given back after every close (``release_sessions`` after each
  worker), which is what every close did before sessions were shared: each worker pays the
  runtime's initialization, the device open, the device teardown and the finalize.

Per arm: the measured wall time of the ten open/close cycles, the sessions opened, and, when the
platform's library is one of the fake vendor libraries (``make test`` links them under
``target/``), the lifecycle events the fake counted and their modeled cost (the fakes price
``aclInit``, the device open, its teardown and the finalize's device-log flush wait; nothing
sleeps). On a real card the measured column is the cost.
"""

from __future__ import annotations

import ctypes
import os
import time
from statistics import median
from typing import TYPE_CHECKING, Any

from ..worker import Worker, release_sessions, session_stats

if TYPE_CHECKING:
    from .._core import _Platform

#: How many workers one round opens and closes.
WORKERS = 10


def _fake_lifecycle(platform: str) -> Any:
    """The fake library's lifecycle counter for ``platform``, or None (not a fake)."""
    if platform == "ascend":
        d = os.environ.get("SIMPLER_ASCEND_LIB_DIR", "")
        path, name, n = os.path.join(d.split(":")[0], "libascend_hal.so"), "fake_ascend_lifecycle", 4
    else:
        path, name, n = os.environ.get("SIMPLER_CUDA_LIB", ""), "fake_cuda_lifecycle", 3
    try:
        fn = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64)]

    def read() -> tuple[int, list[int]]:
        out = (ctypes.c_uint64 * n)()
        return int(fn(out)), list(out)

    return read


def _round(platform: _Platform, per_worker: bool) -> tuple[float, int]:
    """One arm's ten workers; (seconds, sessions opened)."""
    opened = session_stats()["opened"]
    t0 = time.perf_counter()
    for _ in range(WORKERS):
        with Worker(platform) as w:
            w.free(w.malloc(64))
        if per_worker:
            release_sessions()
    release_sessions()  # the exit, for the shared arm
    return time.perf_counter() - t0, session_stats()["opened"] - opened


def bench_lifecycle(quick: bool, platform: _Platform = "ascend") -> dict[str, Any]:
    """Prints both arms side by side (see the module docs); returns the figures."""
    if platform not in ("ascend", "cuda"):
        print(f"lifecycle: a vendor platform (ascend or cuda), not {platform!r}")
        return {}
    # One worker first: its open loads the library (and preloads its dependencies), so that the
    # fake's counters can be read from here.
    with Worker(platform):
        pass
    fake = _fake_lifecycle(platform)
    rounds = 3 if quick else 7
    arms = {"shared": False, "per worker": True}
    wall: dict[str, list[float]] = {a: [] for a in arms}
    sessions: dict[str, int] = {}
    modeled: dict[str, int] = {}
    events: dict[str, list[int]] = {}
    release_sessions()
    for _ in range(rounds):
        for arm, per_worker in arms.items():
            before = fake() if fake else None
            secs, opened = _round(platform, per_worker)
            wall[arm].append(secs)
            sessions[arm] = opened
            if fake and before:
                after = fake()
                modeled[arm] = after[0] - before[0]
                events[arm] = [a - b for a, b in zip(after[1], before[1])]
    names = (
        "ACL inits, device opens, resets, finalizes"
        if platform == "ascend"
        else "inits, contexts created, destroyed"
    )
    print(
        f"lifecycle: {WORKERS} workers opened and closed in a row on {platform} "
        f"({rounds} rounds, interleaved)"
    )
    print(f"  {'arm':<12} {'measured (median)':>18} {'sessions':>9} {'modeled':>12}  events ({names})")
    for arm in arms:
        m = f"{modeled[arm] / 1e9:10.2f} s" if arm in modeled else f"{'-':>12}"
        ev = events.get(arm, "-")
        print(f"  {arm:<12} {median(wall[arm]) * 1e3:15.2f} ms {sessions[arm]:>9} {m}  {ev}")
    if modeled.get("shared"):
        print(f"  modeled per worker / shared: {modeled['per worker'] / modeled['shared']:.1f}x")
    print(f"  measured per worker / shared: {median(wall['per worker']) / median(wall['shared']):.2f}x")
    return {"wall": wall, "sessions": sessions, "modeled": modeled, "events": events}
