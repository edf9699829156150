"""The ``replay`` benchmark: the host's part of execute per warm round, a planned round against
a replayed one, on cuda.

Three workloads, every tensor but ``out`` resident: the per-block paged attention at B64_8K
(upstream's Case2 inputs: 64 sequences of 8,192 tokens, 16,448 tasks a round) and B256_8K
(Case1: 256 sequences, 65,792 tasks), and the unrolled paged attention at Case1 (1,024 tasks).
Three arms per workload, interleaved round by round in one worker (the order rotates every
round): ``planned`` (``w.replay = "off"``: levels, rows and their upload every round),
``plans`` (the kept plan, plain launches) and ``graphs`` (the kept plan as one CUDA graph
launch). Per arm, the medians over the warm rounds of: the host's part of execute (execute
less ``execute_wait_ns``), its parts (``plan_ns``, ``row_upload_ns``, ``launch_ns``), the
wait, and the device's time from events (``device_ns``: with ``SIMPLER_DEVICE_TIMING`` on a
device that times, else 0); the first round of each arm is left out (it plans, or captures).

On the fake libcuda every kernel entry of the two workloads is made a native no-op
(``fake_cuda_register_noop_kernel``), so the device's part is the fake's queue alone and the
host columns are the runtime's own; outputs are not checked (nothing computes them). On a real
GPU the kernels run and the host columns still measure the host.
"""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..testing import fake_cuda, fake_kernels
from ..worker import Worker

if TYPE_CHECKING:
    from .._core import _Replay

#: The arms: their ``Worker.replay`` mode.
ARMS: dict[str, _Replay] = {"planned": "off", "plans": "plans", "graphs": "graphs"}


def _fmt_us(ns: float) -> str:
    return f"{ns / 1e3:.1f} us"


def _noop_kernels() -> list[str]:
    """Makes every kernel entry of the two workloads a native no-op in the fake libcuda; returns
    the entries. The workloads' Python host implementations (:mod:`simpler.testing.fake_kernels`)
    stay in ``fake_cuda.IMPLS`` and come back with the next ``fake_cuda.install()``."""
    entries = sorted(e for e in fake_cuda.IMPLS if e.startswith(("pa_", "pu_")))
    fake_cuda.register_noop(*entries)
    return entries


def bench_replay(quick: bool, platform: str = "cuda", rounds: int | None = None) -> dict[str, Any]:
    """Runs the benchmark (see the module doc); prints the table and returns the medians (ns)
    per workload and arm."""
    from ..workloads import paged_attention as pa
    from ..workloads import paged_attention_unroll as pu

    if platform != "cuda":
        raise ValueError("the replay benchmark runs on cuda (the fake libcuda where no GPU is present)")
    rounds = rounds or (4 if quick else 8)
    fake = fake_kernels.install_if_fake()
    if fake:
        _noop_kernels()
    workloads = [("per-block B64_8K", pa.CALLABLE, "Case2")]
    if not quick:
        workloads += [("per-block B256_8K", pa.CALLABLE, "Case1"), ("unrolled Case1", pu.CALLABLE, "Case1")]
    else:
        workloads += [("unrolled Case2", pu.CALLABLE, "Case2")]
    names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
    figures: dict[str, Any] = {"platform": platform, "fake": fake, "rounds": rounds, "workloads": {}}
    where = "cuda (fake libcuda, no-op kernels)" if fake else "cuda"
    print(
        f"\n== execute's host part per warm round, planned against replayed, on {where} "
        f"(median of {rounds - 1} warm round(s) per arm, arms interleaved) =="
    )
    print(
        f"{'workload':<18} {'arm':<8} {'exec host':>11} {'plan':>11} {'upload':>11} {'launch':>11} "
        f"{'wait':>11} {'device':>11}   {'tasks':>6} {'launches':>8} {'graph':>5}"
    )
    try:
        for label, callable_, case in workloads:
            x = pu.make_inputs(dict(pu._MANUAL)[case])
            rows: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
            last: dict[str, dict[str, int]] = {}
            with Worker("cuda") as w:
                bufs = {}
                try:
                    # make_inputs' named inputs are arrays (only "scale" is a float).
                    for n in names:
                        bufs[n] = w.malloc(cast(np.ndarray, x[n]).nbytes)
                        w.copy_to(bufs[n], cast(np.ndarray, x[n]))
                    args = [
                        bufs[n].tensor(cast(np.ndarray, x[n]).shape, cast(np.ndarray, x[n]).dtype)
                        for n in names
                    ]
                    out = np.zeros_like(x["out"])
                    arms = list(ARMS)
                    for r in range(rounds):
                        for a in arms[r % 3 :] + arms[: r % 3]:
                            w.replay = ARMS[a]
                            rep = w.run(callable_, [*args, out, x["scale"]])
                            p, c = rep.phases, rep.counters
                            rows[a].append(
                                {
                                    "host": p["execute"] - c["execute_wait_ns"],
                                    "plan": c["plan_ns"],
                                    "upload": c["row_upload_ns"],
                                    "launch": c["launch_ns"],
                                    "wait": c["execute_wait_ns"],
                                    "device": c["device_ns"],
                                }
                            )
                            last[a] = {
                                k: int(c[k])
                                for k in ("tasks", "device_launches", "graph_launches", "plan_reuses")
                            }
                    del args
                finally:
                    for b in bufs.values():
                        b.free()
            med = {a: {k: median(v[k] for v in rows[a][1:]) for k in rows[a][0]} for a in ARMS}
            for a in ARMS:
                m, c = med[a], last[a]
                print(
                    f"{label:<18} {a:<8} {_fmt_us(m['host']):>11} {_fmt_us(m['plan']):>11} "
                    f"{_fmt_us(m['upload']):>11} {_fmt_us(m['launch']):>11} {_fmt_us(m['wait']):>11} "
                    f"{_fmt_us(m['device']):>11}   "
                    f"{c['tasks']:>6} {c['device_launches']:>8} {c['graph_launches']:>5}"
                )
            cold = med["planned"]["plan"] + med["planned"]["upload"]
            ratio = med["graphs"]["host"] / med["planned"]["host"] if med["planned"]["host"] else float("inf")
            print(
                f"{'':<18} graphs / planned host part = {ratio:.3f}; "
                f"a planned round's plan + upload = {_fmt_us(cold)}"
            )
            figures["workloads"][label] = {"median_ns": med, "counters": last, "cold_plan_ns": cold}
    finally:
        if fake:
            fake_cuda.install()  # the workloads' host implementations again
    return figures
