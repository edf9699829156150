"""`make demo`: one callable run three ways on the sim platform, with the counters side by side.

The callable is data dependent: its orchestration reads a control tensor (`lens`) to decide how
many tasks to submit, and each task scales one row of a large `weights` tensor into `out`.

* staged      — every argument host-staged (arena slices, H2D every round, copy-back of `out`);
* bulk        — `weights` resident (uploaded once), `lens` and `out` staged;
* all         — `weights` and `lens` resident; `lens` reached through a host view.
"""

from __future__ import annotations

import numpy as np

import simpler as sp

ROWS, COLS, ROUNDS = 64, 16384, 5


def scale_row(w_row, out_row, factor):
    out_row[...] = w_row * factor


SCALE = sp.Kernel(scale_row, [sp.IN, sp.OUT])


def orchestrate(o, weights, lens, out, factor):
    n = o.get_tensor_data(lens, 0)
    for r in range(n):
        o.submit(SCALE, weights.view([1, COLS], [r, 0]), out.view([1, COLS], [r, 0]), factor)


CALL = sp.Callable(orchestrate, [sp.IN, sp.IN, sp.OUT], name="scale_rows")


def main() -> None:
    rng = np.random.default_rng(0)
    weights = rng.random((ROWS, COLS), dtype=np.float32)
    lens = np.array([ROWS // 2], dtype=np.int32)
    expect = np.zeros((ROWS, COLS), np.float32)
    expect[: ROWS // 2] = weights[: ROWS // 2] * 2.0
    mib = weights.nbytes >> 20
    print(f"simpler demo: {ROWS}x{COLS} float32 weights ({mib} MiB), {ROUNDS} rounds, sim")
    header = f"{'arm':>8} {'dispatch(us)':>13} {'staged_B':>10} {'back_B':>10} {'mallocs':>8} {'views':>6}"
    print(header)
    base = None
    for arm in ("staged", "bulk", "all"):
        with sp.Worker("sim", svm=4096) as w, sp.ResidentTaskArgs(w) as res:
            wt = res.add("weights", weights) if arm != "staged" else weights
            lt = res.add("lens", lens) if arm == "all" else lens
            reports = []
            for _ in range(ROUNDS):
                out = np.zeros((ROWS, COLS), np.float32)
                reports.append(w.run(CALL, [wt, lt, out, 2.0]))
                np.testing.assert_allclose(out[: ROWS // 2], expect[: ROWS // 2])
            warm = reports[1:]
            disp = float(np.median([r.dispatch_ns for r in warm])) / 1e3
            base = base or disp
            c = warm[-1].counters
            views = sum(r.counters["views_mapped"] + r.counters["views_mirrored"] for r in reports)
            mallocs = sum(r.counters["device_mallocs"] for r in warm)
            print(
                f"{arm:>8} {disp:>13.1f} {c['staged_bytes']:>10} {c['copied_back_bytes']:>10} "
                f"{mallocs:>8} {views:>6}   ({disp / base:.2f}x staged)"
            )
            if arm == "all":
                print(f"lens host view: {w.host_view_info(lt)}; driver counters: {w.stats()}")
    print("golden: all arms match the numpy reference")


if __name__ == "__main__":
    main()
