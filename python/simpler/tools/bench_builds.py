"""Two builds of simpler side by side: the orchestration figures of each, in one interleaved run.

``python -m simpler.tools.bench_builds BEFORE AFTER [--rounds N] [--tasks N]``

``BEFORE`` and ``AFTER`` are folders that each hold a ``simpler`` package with its native module
built (``python/`` of a checkout after ``make build``, or a copy of it kept before a change).
Each build runs in a process of its own (started with the folder first on ``PYTHONPATH``) and
stays warm; the driver asks them for one round at a time, alternating which goes first, so a
drift of the machine hits both alike. A round measures, on sim:

* ``submit+view``: one run whose orchestration submits N single tasks, each over the view it
  takes (``orch.submit(kernel, t.view([1, 16], [i, 0]))``), per task (the loop, timed inside the
  orchestration; the tasks then execute, outside the figure);
* ``warm run``: ``Worker.run`` of a callable with 20 resident arguments that submits one empty
  task, wall time from the call to its return (median of 51 warm runs), and its dispatch path;
* ``get_tensor_data``: 16,384 reads ``int(orch.get_tensor_data(t, (i, j)))`` of a resident
  (64, 256) int32 table (a host mirror), per read, against ``int(arr[i, j])`` on a numpy array
  timed right before it in the same process, and their ratio.
* ``group x2 round``: ``DeviceGroup("sim", devices=[0, 1]).round(noop)`` on the multiprocessing
  backend, ``noop`` the group benchmark's function that returns None: the fixed cost of a round
  fanned out to two device processes (median of 201 rounds).

The child code uses only the public API both builds share. Prints every round and then, per
figure, the median and the best (min) over the rounds of each build, and after / before (a stall
of a shared machine only makes a round slower, so the best round is the steadier figure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from statistics import median

#: What each build's process runs: reads a command per line (``round`` or ``quit``), answers one
#: JSON line per round.
CHILD = r"""
import json, sys, time
from statistics import median
import numpy as np
import simpler
from simpler.args import ResidentTaskArgs
from simpler.group import DeviceGroup
from simpler.tools.bench_group import noop
from simpler.worker import ArgDirection, Callable, Kernel, Worker

IN, OUT, INOUT = ArgDirection.IN, ArgDirection.OUT, ArgDirection.INOUT
N = int(sys.argv[1])


def _noop(*arrays):
    pass


def _empty():
    pass


ROW_OUT = Kernel(_noop, [OUT])
EMPTY = Kernel(_empty, [])
got = {}


def submit_view(o, t):
    t0 = time.perf_counter_ns()
    for i in range(N):
        o.submit(ROW_OUT, t.view([1, 16], [i, 0]))
    got["submit_view"] = (time.perf_counter_ns() - t0) / N


TABLE = np.arange(64 * 256, dtype=np.int32).reshape(64, 256)


# The two read loops, written as the `orchestration` benchmark writes them (closures over the
# table and its shape).
def table_loops(table, rows, cols, nreads):
    def reads(o, t):
        t0 = time.perf_counter_ns()
        for i in range(rows):
            for j in range(cols):
                int(o.get_tensor_data(t, (i, j)))
        got["get"] = (time.perf_counter_ns() - t0) / nreads

    def plain():
        t0 = time.perf_counter_ns()
        for i in range(rows):
            for j in range(cols):
                int(table[i, j])
        return (time.perf_counter_ns() - t0) / nreads

    return reads, plain


reads, plain = table_loops(TABLE, 64, 256, TABLE.size)
w = Worker("sim", poison=False, svm="never")
buf = w.malloc(N * 16 * 4)
row_t = buf.tensor((N, 16), "float32")
tbuf = w.malloc(TABLE.nbytes)
w.copy_to(tbuf, TABLE)
table = tbuf.tensor(TABLE.shape, "int32")
res = ResidentTaskArgs(w)
for k in range(20):
    res.add(f"a{k}", np.full(256, k, np.float32))
args = res.build_args(expected_count=20)
c_submit = Callable(submit_view, [INOUT], name="submit_view")
c_reads = Callable(reads, [IN], name="reads")
c_fixed = Callable(lambda o, *ts: o.submit(EMPTY), [IN] * 20, name="fixed")
w.run(c_reads, [table])  # the host view is established once, outside the rounds
w.run(c_fixed, args)
group = DeviceGroup("sim", devices=[0, 1], backend="multiprocessing")
group.round(noop)
print(json.dumps({"simpler": simpler.__file__}), flush=True)
for line in sys.stdin:
    if line.strip() != "round":
        break
    w.run(c_submit, [row_t])
    walls, disp = [], []
    for _ in range(51):
        t0 = time.perf_counter_ns()
        r = w.run(c_fixed, args)
        walls.append(time.perf_counter_ns() - t0)
        disp.append(r.dispatch_ns)
    numpy_ns = plain()
    w.run(c_reads, [table])
    fan = []
    for _ in range(201):
        t0 = time.perf_counter_ns()
        group.round(noop)
        fan.append(time.perf_counter_ns() - t0)
    out = {
        "submit_view_ns": got["submit_view"],
        "warm_run_ns": median(walls),
        "warm_dispatch_ns": median(disp),
        "numpy_read_ns": numpy_ns,
        "get_ns": got["get"],
        "get_ratio": got["get"] / numpy_ns,
        "group_round_ns": median(fan),
    }
    print(json.dumps(out), flush=True)
group.close()
res.release()
w.free(buf)
w.free(tbuf)
w.close()
"""

#: The figures a round reports, with how each is printed.
FIGURES = (
    ("submit_view_ns", "submit+view per task", "ns"),
    ("warm_run_ns", "warm run wall", "us"),
    ("warm_dispatch_ns", "warm run dispatch", "us"),
    ("numpy_read_ns", "numpy int(arr[i, j])", "ns"),
    ("get_ns", "get_tensor_data", "ns"),
    ("get_ratio", "get_tensor_data / numpy", "x"),
    ("group_round_ns", "group x2 round", "us"),
)


def _fmt(v: float, unit: str) -> str:
    if unit == "us":
        return f"{v / 1e3:8.2f} us"
    if unit == "x":
        return f"{v:8.2f} x "
    return f"{v:8.0f} ns"


class _Build:
    """One build's process."""

    def __init__(self, label: str, folder: str, tasks: int) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.abspath(folder)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.label = label
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tasks)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.where = self._read()["simpler"]

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.label} build's process ended (exit {self.proc.wait()})")
        return json.loads(line)

    def round(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        self.proc.wait()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simpler.tools.bench_builds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("before", help="folder holding the first build's simpler package")
    p.add_argument("after", help="folder holding the second build's simpler package")
    p.add_argument("--rounds", type=int, default=11, help="rounds per build (default 11)")
    p.add_argument("--tasks", type=int, default=16384, help="single submits per round (default 16384)")
    return p


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m simpler.tools.bench_builds``."""
    a = _parser().parse_args(argv)
    builds = [_Build("before", a.before, a.tasks), _Build("after", a.after, a.tasks)]
    try:
        for b in builds:
            print(f"{b.label:>6}: {b.where}")
        samples: dict[str, list[dict]] = {b.label: [] for b in builds}
        head = " ".join(f"{label:>24}" for _, label, _ in FIGURES)
        print(f"\n{'round':>5} {'build':>6} {head}")
        for r in range(a.rounds):
            order = builds if r % 2 == 0 else builds[::-1]
            for b in order:
                s = b.round()
                samples[b.label].append(s)
                row = " ".join(f"{_fmt(s[k], u):>24}" for k, _, u in FIGURES)
                print(f"{r + 1:>5} {b.label:>6} {row}", flush=True)
        for name, pick in (("median", median), ("best (min)", min)):
            print(f"\n== {name} of {a.rounds} interleaved rounds per build ==")
            print(f"{'figure':>24} {'before':>12} {'after':>12} {'after/before':>13}")
            for k, label, unit in FIGURES:
                m = {lab: pick(s[k] for s in v) for lab, v in samples.items()}
                if k == "get_ratio" and pick is min:
                    # The best read over the best numpy read (a stall in either arm of one
                    # round would make a ratio of that round the "best").
                    m = {
                        lab: min(s["get_ns"] for s in v) / min(s["numpy_read_ns"] for s in v)
                        for lab, v in samples.items()
                    }
                ratio = m["after"] / m["before"] if m["before"] else float("nan")
                print(
                    f"{label:>24} {_fmt(m['before'], unit):>12} {_fmt(m['after'], unit):>12} {ratio:12.2f}x"
                )
    finally:
        for b in builds:
            b.close()


if __name__ == "__main__":
    main()
