"""The ``group`` benchmark: the fixed cost of a device group's round.

Two phases, multiprocessing then Ray (so that an idle Ray on the same cores is not charged to the
other backend), each with its own ``worker.run``; within a phase the arms are open at once and
timed interleaved (each repetition times a batch of calls of every arm in turn, the order rotated
from one repetition to the next), medians over the repetitions. The arms:

* ``worker.run`` — a single-device :meth:`simpler.Worker.run` of an empty callable (no
  arguments, no tasks), in this process: what a round costs without a group;
* ``multiprocessing xN`` — ``group.round(noop)`` on N = 1, 2 and 4 sim devices, ``noop`` a
  module-level function that returns None;
* ``ray xN`` — the same on the ``ray`` backend (a local Ray started when none is up);
* ``ray bare x1`` / ``ray bare xN`` — a bare Ray actor call (a method that returns None) on one
  actor, and on N actors at once (N calls, one ``ray.get``): what Ray itself costs.

Printed per arm: the median time of one round, its ratio to ``worker.run``, and for Ray its ratio
to the bare actor calls. Targets: ``multiprocessing x2`` within 100 us per round; each
``ray xN`` within 2x of a bare Ray actor call. Figures only: nothing asserts them.
"""

from __future__ import annotations

import functools
import importlib.util
import time
import warnings
from collections.abc import Callable as Fn
from statistics import median
from typing import Any

#: The group sizes measured.
SIZES = (1, 2, 4)

#: Targets printed next to the figures.
MP_TARGET_NS = 100_000
RAY_TARGET_RATIO = 2.0


def noop(ctx: Any) -> None:
    """A round's function that does nothing (module-level: the children import it)."""
    return None


class BareActor:
    """A Ray actor with a method that does nothing: the cost of Ray alone."""

    def noop(self) -> None:
        """Returns None."""
        return None


def _bare_calls(ray: Any, actors: list[Any]) -> None:
    """One bare call on each of ``actors`` at once."""
    ray.get([a.noop.remote() for a in actors])


def _fmt_us(ns: float) -> str:
    return f"{ns / 1e3:9.1f} us"


def _time(fn: Fn[[], Any], calls: int) -> float:
    """Nanoseconds per call of ``fn`` over a batch of ``calls``."""
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def _measure(arms: dict[str, Fn[[], Any]], reps: int, calls: int) -> dict[str, float]:
    """Median nanoseconds per call of each arm, interleaved and rotated (after a warm-up)."""
    for fn in arms.values():
        _time(fn, max(calls // 4, 3))
    names = list(arms)
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(reps):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            samples[k].append(_time(arms[k], calls))
    return {k: median(v) for k, v in samples.items()}


def bench_group(quick: bool) -> dict[str, Any]:
    """Runs the arms (see the module docs), prints the table; the figures as a dict."""
    reps = 5 if quick else 15
    calls = 20 if quick else 100
    has_ray = importlib.util.find_spec("ray") is not None
    print(
        f"\n== device groups: the fixed cost of a no-op round (median of {reps} interleaved batches "
        f"of {calls} rounds) =="
    )
    if not has_ray:
        print("ray is not installed (pip install -r requirements/ray.txt): the ray arms are left out")
    # Two phases, each against its own worker.run: a Ray idling on the same cores (its raylet,
    # its workers' polling threads) would be charged to the multiprocessing arms otherwise.
    phases = [_phase("multiprocessing", reps, calls)]
    if has_ray:
        phases.append(_phase("ray", reps, calls))
    return _report(phases)


def _phase(backend: str, reps: int, calls: int) -> dict[str, float]:
    """``worker.run``, ``backend`` on 1, 2 and 4 sim devices and, for ray, the bare actor calls,
    interleaved: median nanoseconds per round of each."""
    from ..group import DeviceGroup
    from ..worker import Callable, Worker

    opened: list[Any] = []
    bare: list[Any] = []
    ray: Any = None  # the module, on the ray backend
    started_ray = False
    if backend == "ray":
        ray = importlib.import_module("ray")
        started_ray = not ray.is_initialized()
    try:
        worker = Worker("sim")
        opened.append(worker)
        empty = Callable(lambda o: None, [], name="empty")
        arms: dict[str, Fn[[], Any]] = {"worker.run": lambda: worker.run(empty, [])}
        for n in SIZES:
            g = DeviceGroup("sim", devices=list(range(n)), backend=backend)
            opened.append(g)
            arms[f"{backend} x{n}"] = functools.partial(g.round, noop)
        if backend == "ray":
            actor_class = ray.remote(BareActor)
            bare = [actor_class.options(max_concurrency=1).remote() for _ in range(max(SIZES))]
            ray.get([a.noop.remote() for a in bare])
            for n in SIZES:
                arms[f"ray bare x{n}"] = functools.partial(_bare_calls, ray, bare[:n])
        return _measure(arms, reps, calls)
    finally:
        for a in bare:
            ray.kill(a)
        for o in reversed(opened):
            o.close()
        if started_ray:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                ray.shutdown()


def _report(phases: list[dict[str, float]]) -> dict[str, Any]:
    """Prints the table (each phase's ratios against its own ``worker.run``) and the targets;
    the figures."""
    print(f"{'arm':<20} {'per round':>12} {'/ worker.run':>13} {'/ bare x1':>10} {'/ bare xN':>10}")
    figures: dict[str, Any] = {"median_ns_per_round": {}, "ratios": {}}
    med: dict[str, float] = {}
    for phase in phases:
        base = phase["worker.run"]
        for arm, ns in phase.items():
            line = f"{arm:<20} {_fmt_us(ns):>12} {ns / base:>12.1f}x"
            if arm.startswith("ray x"):
                fan = arm.split("x")[-1]
                r1, rn = ns / phase["ray bare x1"], ns / phase[f"ray bare x{fan}"]
                figures["ratios"][f"{arm} / bare x1"] = r1
                figures["ratios"][f"{arm} / bare x{fan}"] = rn
                line += f" {r1:>9.2f}x {rn:>9.2f}x"
            print(line)
        backend = "ray" if "ray x1" in phase else "multiprocessing"
        figures["median_ns_per_round"][backend] = phase
        med.update(phase)
    mp2 = med["multiprocessing x2"]
    print(
        f"target: multiprocessing x2 <= {MP_TARGET_NS / 1e3:.0f} us per round: {mp2 / 1e3:.1f} us "
        f"({'met' if mp2 <= MP_TARGET_NS else 'NOT met'})"
    )
    if "ray x1" in med:
        for n in SIZES:
            r = med[f"ray x{n}"] / med[f"ray bare x{n}"]
            print(
                f"target: ray x{n} within {RAY_TARGET_RATIO:.0f}x of a bare Ray actor call "
                f"(x{n}, same fan-out): {r:.2f}x ({'met' if r <= RAY_TARGET_RATIO else 'NOT met'})"
            )
    return figures
