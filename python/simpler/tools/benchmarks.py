"""Micro-benchmarks that print figures side by side (never asserted by tests).

``python -m simpler.tools.benchmarks [staging] [views] [bind] [mirrors] [orchestration] [launches]
[graphs] [replay] [lifecycle] [group] [--quick] [--platform P]``

* ``staging`` — per-phase medians of the staged path with the retained arena vs fresh
  malloc/free per run, at three sizes, with the ratio; staged H2D bandwidth next to numpy's
  memcpy bandwidth for the same bytes.
* ``views`` — per-access cost of ``get_tensor_data`` through a mapping, a mirror, and a per-access
  D2H read-through baseline; and of ``read_tensor``.
* ``bind`` — resident bind time for a 4 KiB vs a 1 GiB argument (flat in bytes).
* ``mirrors`` — mirror refresh bandwidth (one bulk D2H into the host copy of a resident tensor)
  at three sizes, on ``--platform`` (default sim); on cuda, page-locked mirrors (the default)
  against pageable ones (``SIMPLER_CUDA_PIN_MIRRORS=0``), the arms interleaved round by round.
* ``orchestration`` — what an orchestration costs per call: a batched submit per task at 1K,
  16K and 64K tasks (records, checks and teardown: orchestrate + cleanup); a single submit with
  the view it takes per task (built in one loop, and apart: every view first, then every
  submit); the fixed overhead of a warm run with 20 resident arguments and
  one empty task; ``get_tensor_data`` against a plain numpy ``int(arr[i, j])`` read, and
  ``read_tensor`` plus numpy indexing against numpy indexing alone; a read that lands inside
  the span of earlier strided writes, after 1K and after 64K tasks. Every comparison runs its
  arms interleaved, repeated, and reports medians.
* ``launches`` — device launches, on ``--platform`` (default sim): a tiny kernel with device
  code (each task adds a scalar to one float32 element) run as N single ``submit`` calls (N
  launches on cuda) against one ``submit_many`` of N tasks (one launch), N = 1024 and 16384
  (256 and 2048 with ``--quick``), the arms interleaved round by round; per task the
  orchestrate and execute phases (median of the warm rounds, the cold first round apart), tasks
  and launches per second, the ratios, and the counters that show where the tasks ran
  (``device_launches``, ``device_tasks``, ``host_path_tasks``). On sim the kernel's numpy
  reference runs; on cuda its CUDA code (through the fake libcuda's host implementation when
  that is the driver). Every element is checked afterwards.
* ``graphs`` — paged attention's two graphs on the same inputs (upstream's Case1: 256 sequences of
  8,192 tokens; ``--quick``: Case2, 64 sequences), every tensor but ``out`` resident, their rounds
  interleaved, on ``--platform``: per warm round the host's cost of each graph — orchestrate (the
  Python orchestration and its submits), the host's part of execute (launch planning, the rows'
  upload and the launch calls: execute less the wait for the device, ``execute_wait_ns``) and
  the argument path — with tasks, submits and launches per round, and the ratios; then execute
  split into ``plan_ns``, ``row_upload_ns``, ``launch_ns`` and ``execute_wait_ns``. The unrolled
  graph makes 1,024 tasks a round at Case1, the per-block one 65,792; outputs are checked against
  the golden after the rounds.
* ``replay`` — on cuda (the fake libcuda with no-op kernels where no GPU is present): the host's
  part of execute per warm round, a planned round (``replay="off"``) against a reused plan with
  plain launches and one replayed as a CUDA graph, arms interleaved, for the per-block paged
  attention at B64_8K and B256_8K and the unrolled one at Case1 (``simpler.tools.bench_replay``).
* ``lifecycle`` — ten workers opened and closed in a row on ``--platform`` (ascend or cuda):
  one shared vendor session against a session given back after every worker, with the fake
  vendor libraries' modeled lifecycle cost (``simpler.tools.bench_lifecycle``).
* ``group`` — the fixed cost of a device group's round: a no-op ``group.round`` on 1, 2 and 4 sim
  devices on each backend, against a single-device ``Worker.run`` of an empty callable, and for
  Ray against a bare Ray actor call, the arms interleaved (``simpler.tools.bench_group``; the ray
  arms need ray installed).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping
from statistics import median
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from ..testing import fake_cuda, fake_kernels
from ..worker import ArgDirection, Callable, CudaCode, Kernel, Launch, Worker, device_code_stats
from .bench_group import bench_group
from .bench_lifecycle import bench_lifecycle
from .bench_replay import bench_replay

if TYPE_CHECKING:
    from .._core import _Platform

IN, OUT, INOUT = ArgDirection.IN, ArgDirection.OUT, ArgDirection.INOUT


def _fmt_ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:8.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:8.2f} us"
    return f"{ns:8.0f} ns"


def _noop_kernel(*arrays: np.ndarray) -> None:
    pass


_NOOP_IN = Kernel(_noop_kernel, [IN])


def _submit_noop_in(o, t) -> None:
    o.submit(_NOOP_IN, t)


def bench_staging(quick: bool) -> None:
    """Arena vs fresh staging, and staged H2D bandwidth vs memcpy."""
    sizes = [4 << 10, 4 << 20] + ([] if quick else [256 << 20])
    rounds = 5 if quick else 11
    touch = Kernel(_noop_kernel, [IN, OUT])
    call = Callable(lambda o, x, y: o.submit(touch, x, y), [IN, OUT], name="stage")
    print("\n== staged path: retained arena vs fresh malloc/free per run (median of warm runs) ==")
    cols = ("bind", "copy_back", "cleanup", "dispatch")
    print(f"{'size':>10} {'mode':>6} " + " ".join(f"{c:>12}" for c in cols) + f" {'mallocs':>8}")
    for size in sizes:
        n = size // 4
        x = np.random.default_rng(0).random(n, dtype=np.float32)
        y = np.zeros(n, np.float32)
        res = {}
        for mode in ("arena", "fresh"):
            # No poison fill, so `fresh` pays for the allocation, not for sim's debugging aid.
            with Worker("sim", staging=mode, poison=False) as w:
                reps = [w.run(call, [x, y]) for _ in range(rounds)][1:]
            ph = {k: median([r.phases[k] for r in reps]) for k in ("bind", "copy_back", "cleanup")}
            disp = median([r.dispatch_ns for r in reps])
            mallocs = reps[-1].counters["device_mallocs"]
            res[mode] = disp
            print(
                f"{size:>10} {mode:>6} {_fmt_ns(ph['bind']):>12} {_fmt_ns(ph['copy_back']):>12} "
                f"{_fmt_ns(ph['cleanup']):>12} {_fmt_ns(disp):>12} {mallocs:>8}"
            )
        print(f"{'':>10} {'ratio':>6} arena/fresh dispatch = {res['arena'] / res['fresh']:.2f}x")
    print("\n== staged H2D bandwidth vs numpy memcpy of the same bytes ==")
    for size in sizes[1:] or sizes:
        n = size // 4
        x = np.random.default_rng(1).random(n, dtype=np.float32)
        dst = np.empty_like(x)
        np.copyto(dst, x)  # first touch outside the timing
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            np.copyto(dst, x)
        memcpy = (time.perf_counter_ns() - t0) / rounds
        c = Callable(_submit_noop_in, [IN], name="h2d")
        with Worker("sim") as w:
            reps = [w.run(c, [x]) for _ in range(rounds)][1:]
        bind = median([r.phases["bind"] for r in reps])
        print(  # bytes per ns == GB/s
            f"{size:>10} B: staged bind {size / bind:6.2f} GB/s   numpy memcpy {size / memcpy:6.2f} GB/s"
            f"   ratio {memcpy / bind:.2f}x"
        )


def bench_views(quick: bool) -> None:
    """Per-access cost of orchestrator reads through mapping, mirror and read-through."""
    n_reads = 4096 if quick else 16384
    table = np.arange(n_reads, dtype=np.int32).reshape(-1, 256)
    rows = table.shape[0]

    def reads(o, t):
        for i in range(rows):
            for j in range(256):
                o.get_tensor_data(t, (i, j))

    def read_whole(o, t):
        for _ in range(100):
            o.read_tensor(t)

    print(f"\n== host views: {n_reads} get_tensor_data reads of a resident ({rows}, 256) int32 table ==")
    results = {}
    for svm in ("always", "never"):
        with Worker("sim", svm=svm) as w:
            buf = w.malloc(table.nbytes)
            w.copy_to(buf, table)
            t = buf.tensor(table.shape, "int32")
            reps = [w.run(Callable(reads, [IN]), [t]) for _ in range(4)]
            warm = median([r.phases["orchestrate"] for r in reps[1:]]) / n_reads
            first = reps[0].phases["orchestrate"] / n_reads
            rt = [w.run(Callable(read_whole, [IN]), [t]) for _ in range(3)]
            rt_ns = median([r.phases["orchestrate"] for r in rt]) / 100
            w.free(buf)
            kind = "mapping" if svm == "always" else "mirror"
            results[kind] = warm
            print(
                f"{kind:>12}: {_fmt_ns(warm)} per read (warm)   first run {_fmt_ns(first)} per read"
                f"   read_tensor {_fmt_ns(rt_ns)}"
            )
    with Worker("sim") as w:
        buf = w.malloc(table.nbytes)
        w.copy_to(buf, table)
        one = np.empty(1, np.int32)
        t0 = time.perf_counter_ns()
        for k in range(n_reads):
            w.copy_from(one, buf, offset=4 * k)
        through = (time.perf_counter_ns() - t0) / n_reads
        w.free(buf)
    print(f"{'read-through':>12}: {_fmt_ns(through)} per read (one 4-byte D2H each; sim memcpy, no PCIe)")
    print(
        f"{'ratio':>12}: mirror/mapping {results['mirror'] / results['mapping']:.2f}x, "
        f"read-through/mirror {through / results['mirror']:.2f}x "
        "(a small aclrtMemcpy D2H on an Ascend A2/A3 card takes ~9.5 us: docs/benchmarks.md)"
    )


def bench_bind(quick: bool) -> None:
    """Resident bind cost is flat in bytes: runs over the two sizes are interleaved, so drift of a
    shared machine hits both alike."""
    big = (64 << 20) if quick else (1 << 30)
    runs = 101
    print(f"\n== resident bind: 4 KiB vs {big >> 20} MiB argument (median of {runs} interleaved runs) ==")
    nop = Kernel(_noop_kernel, [IN])
    c = Callable(lambda o, t: o.submit(nop, t), [IN], name="bind")
    with Worker("sim", poison=False) as w:
        bufs = {size: w.malloc(size) for size in (4096, big)}
        tensors = {size: b.tensor((size // 4,), "float32") for size, b in bufs.items()}
        samples: dict[int, list[int]] = {size: [] for size in bufs}
        for i in range(runs + 1):
            for size, t in tensors.items():
                r = w.run(c, [t])
                if i:  # the first (cold) run of each is left out
                    samples[size].append(r.phases["bind"])
        for b in bufs.values():
            w.free(b)
    out = {size: median(v) for size, v in samples.items()}
    for size, ns in out.items():
        print(f"{size:>12} B: bind {_fmt_ns(ns)}")
    print(f"{'ratio':>12}: {out[big] / out[4096]:.2f}x (target <= 1.5x)")


def _empty_kernel() -> None:
    pass


def _noop_row(*arrays: np.ndarray) -> None:
    pass


_EMPTY = Kernel(_empty_kernel, [])
_ROW_OUT = Kernel(_noop_row, [OUT])


K = TypeVar("K")


def _interleaved(arms: Mapping[K, Any], reps: int) -> dict[K, list[float]]:
    """Runs each arm (a function returning one sample) ``reps`` times, round robin."""
    out: dict[K, list[float]] = {k: [] for k in arms}
    for _ in range(reps):
        for k, f in arms.items():
            out[k].append(f())
    return out


def bench_orchestration(quick: bool) -> None:
    """Per-call costs of an orchestration (see the module doc)."""
    reps = 3 if quick else 7
    sizes = [1024, 16384] if quick else [1024, 16384, 65536]
    print("\n== orchestration: batched submit, per task (orchestrate + cleanup, median) ==")
    with Worker("sim", poison=False) as w:
        buf = w.malloc(max(sizes) * 16 * 4)
        t = buf.tensor((max(sizes), 16), "float32")

        def batched(n: int):
            offsets = np.zeros((n, 2), np.int64)
            offsets[:, 0] = np.arange(n)

            def orch(o, t):
                o.submit_many(_ROW_OUT, t.views([1, 16], offsets))

            c = Callable(orch, [INOUT], name=f"batched{n}")

            def one() -> float:
                r = w.run(c, [t])
                assert r.counters["tasks"] == n
                return (r.phases["orchestrate"] + r.phases["cleanup"]) / n

            return one

        # res and med are keyed by task count here and by arm name below.
        res: dict[Any, list[float]] = _interleaved({n: batched(n) for n in sizes}, reps)
        med: dict[Any, float] = {n: median(v) for n, v in res.items()}
        for n in sizes:
            print(f"{n:>8} tasks: {_fmt_ns(med[n])} per task   (target <= 300 ns)")
        print(
            f"{'ratio':>14}: {max(sizes)} / 1024 tasks = {med[max(sizes)] / med[1024]:.2f}x (target <= 1.2x)"
        )

        print("\n== orchestration: single submit with the view it takes, per task (16384 tasks, median) ==")
        n = 16384
        times: dict[str, list[float]] = {"both": [], "view": [], "submit": []}

        def each(o, t):
            # The common form: every task's view built where it is submitted.
            t0 = time.perf_counter_ns()
            for i in range(n):
                o.submit(_ROW_OUT, t.view([1, 16], [i, 0]))
            times["both"].append((time.perf_counter_ns() - t0) / n)

        def apart(o, t):
            # The two costs apart: every view built first (all held at once), then submitted.
            t0 = time.perf_counter_ns()
            views = [t.view([1, 16], [i, 0]) for i in range(n)]
            t1 = time.perf_counter_ns()
            for v in views:
                o.submit(_ROW_OUT, v)
            t2 = time.perf_counter_ns()
            times["view"].append((t1 - t0) / n)
            times["submit"].append((t2 - t1) / n)

        calls = {k: Callable(f, [INOUT], name=f"single_{k}") for k, f in (("each", each), ("apart", apart))}
        teardown = []
        for _ in range(reps):  # the two forms interleaved
            for c in calls.values():
                r = w.run(c, [t])
                teardown.append(r.phases["cleanup"] / n)
        print(f"   submit + its view {_fmt_ns(median(times['both']))}   (one loop; target <= 300 ns)")
        print(
            f"   apart: view {_fmt_ns(median(times['view']))}   submit {_fmt_ns(median(times['submit']))}"
            f"   (16384 views held at once)   teardown {_fmt_ns(median(teardown))}"
        )
        w.free(buf)

    print("\n== orchestration: warm run, 20 resident arguments, one empty task (median) ==")
    with Worker("sim") as w:
        arrays = [np.full(256, i, np.float32) for i in range(20)]
        from ..args import ResidentTaskArgs

        with ResidentTaskArgs(w) as resident:
            for i, a in enumerate(arrays):
                resident.add(f"a{i}", a)
            args = resident.build_args(expected_count=20)
            c = Callable(lambda o, *ts: o.submit(_EMPTY), [IN] * 20, name="fixed")
            w.run(c, args)
            walls, disp = [], []
            for _ in range(51 if not quick else 11):
                t0 = time.perf_counter_ns()
                r = w.run(c, args)
                walls.append(time.perf_counter_ns() - t0)
                disp.append(r.dispatch_ns)
            print(
                f"   Worker.run wall {_fmt_ns(median(walls))}   dispatch path {_fmt_ns(median(disp))}"
                "   (target <= 5 us)"
            )

    print("\n== orchestration: reads of a (64, 256) int32 table, per read (median) ==")
    table = np.arange(64 * 256, dtype=np.int32).reshape(64, 256)
    rows, cols = table.shape
    nreads = rows * cols
    with Worker("sim", svm="never") as w:
        buf = w.malloc(table.nbytes)
        w.copy_to(buf, table)
        t = buf.tensor(table.shape, "int32")
        got: dict[str, float] = {}

        def elementwise(o, t):
            t0 = time.perf_counter_ns()
            for i in range(rows):
                for j in range(cols):
                    int(o.get_tensor_data(t, (i, j)))
            got["v"] = (time.perf_counter_ns() - t0) / nreads

        def bulk(o, t):
            t0 = time.perf_counter_ns()
            a = o.read_tensor(t)
            for i in range(rows):
                for j in range(cols):
                    int(a[i, j])
            got["v"] = (time.perf_counter_ns() - t0) / nreads

        def plain() -> float:
            t0 = time.perf_counter_ns()
            for i in range(rows):
                for j in range(cols):
                    int(table[i, j])
            return (time.perf_counter_ns() - t0) / nreads

        def via(fn):
            c = Callable(fn, [IN])

            def one() -> float:
                w.run(c, [t])
                return got["v"]

            return one

        via(elementwise)()  # the view is established once, outside the samples
        res = _interleaved(
            {"numpy": plain, "get_tensor_data": via(elementwise), "read_tensor": via(bulk)}, reps
        )
        med = {k: median(v) for k, v in res.items()}
        for k, v in med.items():
            print(f"{k:>16}: {_fmt_ns(v)} per read")
        elem, bulk_ratio = med["get_tensor_data"] / med["numpy"], med["read_tensor"] / med["numpy"]
        print(
            f"{'ratio':>16}: get_tensor_data / numpy = {elem:.2f}x (target <= 1.2x); "
            f"read_tensor + indexing / numpy = {bulk_ratio:.2f}x (target <= 1.0x)"
        )
        w.free(buf)

    print("\n== orchestration: a read inside the span of earlier strided writes (median) ==")
    with Worker("sim", poison=False) as w:
        n_max = 65536 if not quick else 16384
        buf = w.malloc(n_max * 2 * 4)
        t = buf.tensor((n_max, 2), "int32")
        per_read: dict[int, float] = {}

        def after(n: int):
            offsets = np.zeros((n, 2), np.int64)
            offsets[:, 0] = np.arange(n)

            def orch(o, t):
                even = t.view([n, 1], [0, 0])
                o.submit_many(_ROW_OUT, even.views([1, 1], offsets))  # writes column 0 of n rows
                k = 2000
                t0 = time.perf_counter_ns()
                for i in range(k):
                    # Column 1 of the first 1,000 rows: never written, and the same bytes after
                    # 1K and after 64K tasks, so only the size of the history differs.
                    o.get_tensor_data(t, ((i * 7919) % 1000, 1))
                per_read[n] = (time.perf_counter_ns() - t0) / k

            c = Callable(orch, [INOUT], name=f"after{n}")

            def one() -> float:
                w.run(c, [t])
                return per_read[n]

            return one

        small = 1024
        res = _interleaved({small: after(small), n_max: after(n_max)}, reps)
        med = {k: median(v) for k, v in res.items()}
        for k, v in med.items():
            print(f"{k:>8} tasks: {_fmt_ns(v)} per read")
        print(f"{'ratio':>14}: {n_max} / {small} tasks = {med[n_max] / med[small]:.2f}x (target <= 2x)")
        w.free(buf)


def _mirror_worker(platform: _Platform, pinned: bool) -> Worker:
    """A worker whose resident tensors are mirrored (sim: ``svm="never"``; cuda: always)."""
    if platform == "sim":
        return Worker("sim", svm="never", poison=False)
    if platform != "cuda":
        return Worker(platform, poison=False)
    import os

    saved = os.environ.get("SIMPLER_CUDA_PIN_MIRRORS")
    os.environ["SIMPLER_CUDA_PIN_MIRRORS"] = "1" if pinned else "0"
    try:
        return Worker("cuda", poison=False)
    finally:
        if saved is None:
            del os.environ["SIMPLER_CUDA_PIN_MIRRORS"]
        else:
            os.environ["SIMPLER_CUDA_PIN_MIRRORS"] = saved


def bench_mirrors(quick: bool, platform: _Platform = "sim") -> None:
    """Mirror refresh bandwidth: a kernel writes a resident tensor, the orchestrator reads one
    element of it in the next run, so the mirror refreshes (one bulk D2H) once per run."""
    sizes = [4 << 20, 64 << 20] + ([] if quick else [256 << 20])
    rounds = 5 if quick else 9
    arms = ["pinned", "pageable"] if platform == "cuda" else ["mirror"]
    touch = Kernel(lambda t: t.__setitem__(0, t[0]), [INOUT], name="touch")

    def orch(o, t):
        o.get_tensor_data(t, 0)  # refreshes the mirror the previous run's kernel made stale
        o.submit(touch, t)

    call = Callable(orch, [INOUT])
    # The one-time "established a host mirror of N bytes" warnings are expected here.
    logging.getLogger("simpler").setLevel(logging.ERROR)
    print(f"\n== mirror refresh bandwidth on {platform} (median of {rounds - 1} warm runs, interleaved) ==")
    workers = {arm: _mirror_worker(platform, arm == "pinned") for arm in arms}
    try:
        for size in sizes:
            bufs = {arm: w.malloc(size) for arm, w in workers.items()}
            ts = {arm: b.tensor((size // 4,), "int32") for arm, b in bufs.items()}
            gbps: dict[str, list[float]] = {arm: [] for arm in arms}
            for r in range(rounds):
                for arm in arms if r % 2 == 0 else arms[::-1]:
                    rep = workers[arm].run(call, [ts[arm]])
                    moved = rep.counters["mirror_refresh_bytes"]
                    if r > 0 and moved:
                        gbps[arm].append(moved / rep.phases["orchestrate"])
            line = ", ".join(f"{arm} {median(v):6.2f} GB/s" for arm, v in gbps.items() if v)
            if len(arms) == 2 and gbps["pinned"] and gbps["pageable"]:
                line += f"   pinned/pageable {median(gbps['pinned']) / median(gbps['pageable']):.2f}x"
            print(f"{size >> 20:>6} MiB: {line}")
            for arm, w in workers.items():
                w.free(bufs[arm])
        if platform == "cuda":
            s = workers["pinned"].stats()
            print(f"{'':>10}pinned worker: {s['pins']} mirror(s) page-locked, {s['unpins']} unlocked")
    finally:
        for w in workers.values():
            w.close()


# -- launches --------------------------------------------------------------------------------------

#: The device entry of the ``launches`` benchmark's kernel.
LAUNCH_ENTRY = "simpler_bench_add"

#: Its CUDA C++ source: self-contained (no ``#include``), one entry in the simpler ABI — one
#: parameter, the task rows; a launch over n tasks has grid (1, 1, n), task = ``blockIdx.z``; a
#: row is the task view's first-element address, then the ``float64`` scalar.
LAUNCH_SOURCE = r"""
/* simpler: the `launches` benchmark kernel (simpler.tools.benchmarks) */
struct simpler_bench_add_row {
    float* x;     /* the task's view: one float32 element */
    double value; /* the task's scalar ("float64") */
};

extern "C" __global__ void simpler_bench_add(const simpler_bench_add_row* rows) {
    const simpler_bench_add_row& r = rows[blockIdx.z];
    if (blockIdx.x == 0 && threadIdx.x == 0) r.x[0] += (float)r.value;
}
"""


def _bench_add(x: np.ndarray, value: float) -> None:
    """The reference (what runs on sim): ``x[0] += value`` in float32."""
    x[...] += np.float32(value)


#: The benchmark's kernel: one INOUT float32 view of one element, one ``float64`` scalar.
LAUNCH_KERNEL = Kernel(
    _bench_add,
    [(INOUT, "float32")],
    name="bench_add",
    cuda=CudaCode(LAUNCH_SOURCE, entry=LAUNCH_ENTRY, launch=Launch(1, 32), scalars=("float64",)),
)


@fake_cuda.host_impl(LAUNCH_ENTRY)
def _bench_add_host(launch: fake_cuda.Launch) -> None:
    """The fake libcuda's ``simpler_bench_add``, vectorised over the launch's rows: one
    translation of the span the tasks touch and one fancy-indexed add (a task per row)."""
    rows = launch.rows(2)
    if len(rows) == 0:
        return
    addrs = rows[:, 0]
    values = np.ascontiguousarray(rows[:, 1]).view(np.float64).astype(np.float32)
    if np.unique(addrs).size != addrs.size:
        raise fake_cuda.LaunchRace(f"{launch.entry}: two tasks of one launch add to the same element")
    lo = int(addrs.min())
    offsets = addrs - np.uint64(lo)
    if np.all(offsets % np.uint64(4) == 0):
        count = int(offsets.max()) // 4 + 1
        span = launch.array(lo, (count,), np.float32)
        span[(offsets // np.uint64(4)).astype(np.intp)] += values
        return
    for addr, value in zip(addrs, values):  # unaligned views: one element at a time
        launch.array(int(addr), (1,), np.float32)[0] += value


#: ``launches``: the task counts N, and the arms.
LAUNCH_SIZES = (1024, 16384)
LAUNCH_SIZES_QUICK = (256, 2048)
LAUNCH_ARMS = ("single", "submit_many")


def _launch_callable(arm: str, n: int) -> Callable:
    """N single submits (a view each) or one ``submit_many`` of N tasks, each task adding 0.5
    to its own element of the first N."""
    if arm == "single":

        def single(o, x):
            for i in range(n):
                o.submit(LAUNCH_KERNEL, x.view([1], [i]), 0.5)

        return Callable(single, [INOUT], name=f"launches_single_{n}")
    offsets = np.arange(n, dtype=np.int64).reshape(n, 1)

    def many(o, x):
        o.submit_many(LAUNCH_KERNEL, x.views([1], offsets), 0.5)

    return Callable(many, [INOUT], name=f"launches_many_{n}")


def _si(v: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:6.2f} {unit}"
    return f"{v:6.1f}  "


def bench_launches(quick: bool, platform: _Platform = "sim", rounds: int | None = None) -> dict[str, Any]:
    """N single submits vs one ``submit_many`` of N tasks of a device kernel (see the module
    doc); prints the tables and returns the figures: per ``(N, arm)`` the warm medians and the
    cold round per task (ns), tasks and launches per second, the last round's counters; the
    single/submit_many ratios per N; whether every element came out right (``verified``)."""
    sizes = LAUNCH_SIZES_QUICK if quick else LAUNCH_SIZES
    rounds = rounds or (3 if quick else 7)
    fake = False
    if platform == "cuda":
        fake = fake_kernels.install_if_fake()  # CI's GPU-less machines: the fake runs the launches
    where = f"{platform} (fake libcuda)" if fake else platform
    calls = {(n, arm): _launch_callable(arm, n) for n in sizes for arm in LAUNCH_ARMS}
    samples: dict[tuple[int, str], list[tuple[float, float]]] = {k: [] for k in calls}
    counters: dict[tuple[int, str], dict[str, int]] = {}
    with Worker(platform, poison=False) as w:
        cap = max(sizes)
        buf = w.malloc(cap * 4)
        try:
            w.copy_to(buf, np.zeros(cap, np.float32))
            x = buf.tensor((cap,), "float32")
            expected = np.zeros(cap, np.float32)
            for r in range(rounds):
                for n in sizes:
                    order = LAUNCH_ARMS if r % 2 == 0 else LAUNCH_ARMS[::-1]
                    for arm in order:
                        rep = w.run(calls[n, arm], [x])
                        expected[:n] += np.float32(0.5)
                        c = rep.counters
                        if c["tasks"] != n:
                            raise AssertionError(f"launches {arm} {n}: {c['tasks']} tasks ran, not {n}")
                        samples[n, arm].append((rep.phases["orchestrate"] / n, rep.phases["execute"] / n))
                        counters[n, arm] = {
                            k: int(c[k])
                            for k in ("tasks", "device_launches", "device_tasks", "host_path_tasks")
                        }
            got = np.empty(cap, np.float32)
            w.copy_from(got, buf)
            del x
        finally:
            buf.free()
    wrong = int(np.count_nonzero(got != expected))
    print(
        f"\n== launches on {where}: N single submits vs one submit_many of N tasks "
        f"(per task; median of {rounds - 1} warm round(s), interleaved; cold = round 1) =="
    )
    head = (
        f"{'N':>7} {'arm':<12} {'orchestrate':>12} {'execute':>12} {'total':>12} {'tasks/s':>10} "
        f"{'launches/s':>11} {'cold total':>12}   device_launches device_tasks host_path_tasks"
    )
    print(head)
    figures: dict[str, Any] = {"platform": platform, "fake": fake, "rounds": rounds, "results": []}
    ratios: dict[str, float] = {}
    for n in sizes:
        med: dict[str, tuple[float, float]] = {}
        for arm in LAUNCH_ARMS:
            s = samples[n, arm]
            warm = s[1:] or s
            orch, exe = median(v[0] for v in warm), median(v[1] for v in warm)
            med[arm] = (orch, exe)
            total = orch + exe
            c = counters[n, arm]
            tasks_s = 1e9 / total if total else float("inf")
            launches_s = c["device_launches"] / (total * n) * 1e9 if total else 0.0
            cold = sum(s[0])
            print(
                f"{n:>7} {arm:<12} {_fmt_ns(orch):>12} {_fmt_ns(exe):>12} {_fmt_ns(total):>12} "
                f"{_si(tasks_s):>10} {_si(launches_s) if launches_s else '-':>11} {_fmt_ns(cold):>12}   "
                f"{c['device_launches']:>15} {c['device_tasks']:>12} {c['host_path_tasks']:>15}"
            )
            figures["results"].append(
                {
                    "n": n,
                    "arm": arm,
                    "orchestrate_ns_per_task": orch,
                    "execute_ns_per_task": exe,
                    "total_ns_per_task": total,
                    "cold_orchestrate_ns_per_task": s[0][0],
                    "cold_execute_ns_per_task": s[0][1],
                    "tasks_per_s": tasks_s,
                    "launches_per_s": launches_s,
                    **c,
                }
            )
        (so, se), (mo, me) = med["single"], med["submit_many"]
        r_o = so / mo if mo else float("inf")
        r_e = se / me if me else float("inf")
        r_t = (so + se) / (mo + me) if mo + me else float("inf")
        ratios.update({f"orchestrate_{n}": r_o, f"execute_{n}": r_e, f"total_{n}": r_t})
        print(
            f"{n:>7} {'single/many':<12} {r_o:>11.2f}x {r_e:>11.2f}x {r_t:>11.2f}x"
            f"   (tasks/s: submit_many / single = {r_t:.2f}x)"
        )
    figures["ratios"] = ratios
    figures["verified"] = wrong == 0
    if platform == "cuda":
        figures["device_code"] = dict(device_code_stats())
        print(f"device code: {figures['device_code']} (NVRTC compiles / cache hits in this process)")
    print(
        f"checked: every element of the {max(sizes)} got 0.5 per task that viewed it: "
        + ("yes" if wrong == 0 else f"NO, {wrong} element(s) differ")
    )
    if wrong:
        raise AssertionError(f"launches: {wrong} element(s) differ from the expected sums")
    return figures


def bench_graphs(quick: bool, platform: _Platform = "sim", rounds: int | None = None) -> dict[str, Any]:
    """The per-block and the unrolled paged attention on the same inputs (see the module doc);
    prints the table and returns per graph the warm medians (ns) and the last round's counters."""
    from ..workloads import paged_attention as pa
    from ..workloads import paged_attention_unroll as pu

    rounds = rounds or (3 if quick else 5)
    fake = fake_kernels.install_if_fake() if platform == "cuda" else False
    where = f"{platform} (fake libcuda)" if fake else platform
    case = "Case2" if quick else "Case1"
    x = pu.make_inputs(dict(pu._MANUAL)[case])
    names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
    graphs = {"per-block": pa.CALLABLE, "unrolled": pu.CALLABLE}
    rows: dict[str, list[dict[str, float]]] = {g: [] for g in graphs}
    counters: dict[str, dict[str, int]] = {}
    outs = {g: np.zeros_like(x["out"]) for g in graphs}
    with Worker(platform) as w:
        bufs = {}
        try:
            # make_inputs' named inputs are arrays (only "scale" is a float).
            for n in names:
                bufs[n] = w.malloc(cast(np.ndarray, x[n]).nbytes)
                w.copy_to(bufs[n], cast(np.ndarray, x[n]))
            args = [bufs[n].tensor(cast(np.ndarray, x[n]).shape, cast(np.ndarray, x[n]).dtype) for n in names]
            for r in range(rounds):
                order = list(graphs) if r % 2 == 0 else list(graphs)[::-1]
                for g in order:
                    rep = w.run(graphs[g], [*args, outs[g], x["scale"]])
                    p, c = rep.phases, rep.counters
                    host_exec = p["execute"] - c["execute_wait_ns"]
                    rows[g].append(
                        {
                            "orchestrate": p["orchestrate"],
                            "execute_host": host_exec,
                            "plan": c["plan_ns"],
                            "upload": c["row_upload_ns"],
                            "launch": c["launch_ns"],
                            "wait": c["execute_wait_ns"],
                            "args": p["bind"] + p["copy_back"] + p["cleanup"],
                            "host": p["orchestrate"] + host_exec + p["bind"] + p["copy_back"] + p["cleanup"],
                            "execute": p["execute"],
                        }
                    )
                    counters[g] = {
                        k: int(c[k]) for k in ("tasks", "submits", "device_launches", "host_path_tasks")
                    }
            del args
        finally:
            for b in bufs.values():
                b.free()
    # The five names fill the first five parameters; mypy cannot count a starred generator.
    golden = pa.golden_paged_attention(*(x[n] for n in names), x["scale"])  # type: ignore[call-arg]
    ok = {g: bool(np.allclose(o, golden, rtol=1e-3, atol=1e-3)) for g, o in outs.items()}
    print(
        f"\n== paged attention's graphs on {where}, upstream's {case} inputs, resident "
        f"(median of {rounds - 1} warm round(s), interleaved; host = orchestrate + execute's host part "
        "+ bind/copy_back/cleanup) =="
    )
    print(
        f"{'graph':<10} {'orchestrate':>12} {'exec host':>12} {'args':>12} {'host':>12} {'execute':>12}"
        f"   {'tasks':>6} {'submits':>7} {'launches':>8} golden"
    )
    split = "\n".join(
        f"  {g:<10} plan {_fmt_ns(median(v['plan'] for v in rows[g][1:] or rows[g])):>10}"
        f"   upload {_fmt_ns(median(v['upload'] for v in rows[g][1:] or rows[g])):>10}"
        f"   launch {_fmt_ns(median(v['launch'] for v in rows[g][1:] or rows[g])):>10}"
        f"   wait {_fmt_ns(median(v['wait'] for v in rows[g][1:] or rows[g])):>10}"
        for g in graphs
    )
    figures: dict[str, Any] = {
        "platform": platform,
        "fake": fake,
        "case": case,
        "rounds": rounds,
        "graphs": {},
    }
    med: dict[str, dict[str, float]] = {}
    for g in graphs:
        warm = rows[g][1:] or rows[g]
        med[g] = {k: median(v[k] for v in warm) for k in warm[0]}
        c = counters[g]
        print(
            f"{g:<10} {_fmt_ns(med[g]['orchestrate']):>12} {_fmt_ns(med[g]['execute_host']):>12} "
            f"{_fmt_ns(med[g]['args']):>12} {_fmt_ns(med[g]['host']):>12} {_fmt_ns(med[g]['execute']):>12}   "
            f"{c['tasks']:>6} {c['submits']:>7} {c['device_launches']:>8} {'yes' if ok[g] else 'NO'}"
        )
        figures["graphs"][g] = {**med[g], **c, "golden": ok[g]}
    print(
        "execute, split (medians): the host's planning, row upload and launch calls; the wait for the device"
    )
    print(split)
    ratio = med["unrolled"]["host"] / med["per-block"]["host"] if med["per-block"]["host"] else float("inf")
    print(f"host cost per warm round: unrolled / per-block = {ratio:.3f}")
    figures["host_ratio"] = ratio
    if not all(ok.values()):
        raise AssertionError(f"graphs: golden failed for {[g for g, v in ok.items() if not v]}")
    return figures


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simpler.tools.benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("which", nargs="*", help=f"{', '.join(BENCHES)} (default: all)")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    p.add_argument(
        "--platform",
        default="sim",
        help="platform of the mirrors, launches, graphs and lifecycle benchmarks (default sim)",
    )
    return p


#: The benchmarks, by name.
BENCHES = (
    "staging",
    "views",
    "bind",
    "mirrors",
    "orchestration",
    "launches",
    "graphs",
    "replay",
    "lifecycle",
    "group",
)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m simpler.tools.benchmarks``."""
    p = _parser()
    a = p.parse_args(argv)
    unknown = sorted(set(a.which) - set(BENCHES))
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(BENCHES)})")
    benches = {
        "staging": bench_staging,
        "views": bench_views,
        "bind": bench_bind,
        "mirrors": lambda quick: bench_mirrors(quick, a.platform),
        "orchestration": bench_orchestration,
        "launches": lambda quick: bench_launches(quick, a.platform),
        "graphs": lambda quick: bench_graphs(quick, a.platform),
        "replay": lambda quick: bench_replay(quick, "cuda"),
        "lifecycle": lambda quick: bench_lifecycle(quick, a.platform),
        "group": bench_group,
    }
    for name in a.which or BENCHES:
        benches[name](a.quick)


if __name__ == "__main__":
    main()
