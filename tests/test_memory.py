"""Memory over many cases: 1,000 small cases return every device allocation and keep the
process's resident memory flat.

Each case makes a resident set (a 64 KiB tensor that gets a host mapping, a small control tensor
that gets a mirror), runs two rounds with staged arguments and orchestrator reads, and releases
the set; every 50th case also opens and closes a worker of its own with fresh staging. The
fixtures are large enough that leaking any per-case object that holds them (a resident buffer, a
mirror, a staged copy, a host window) would grow RSS by tens of MiB over the measured cases;
the tolerance is a few MiB of allocator noise after a warm-up. Rust-level leaks are valgrind's
job (`make memcheck`).
"""

from __future__ import annotations

import gc
import os

import numpy as np

import simpler as sp

IN, OUT = sp.IN, sp.OUT
CASES = 1000
WARM_UP = 200
TOLERANCE = 8 << 20  # bytes of RSS growth allowed over the measured cases


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _row(kv, x, out):
    out[...] = x + kv


ROW = sp.Kernel(_row, [IN, IN, OUT])


def _orch(o, ctl, kv, x, out):
    rows = o.get_tensor_data(ctl, 0)  # mirror (8 bytes)
    first = o.get_tensor_data(kv, 0)  # mapping (64 KiB)
    assert float(o.read_tensor(kv)[5]) == first
    for r in range(rows):
        o.submit(ROW, kv.view([256], [256 * r]), x.view([256], [256 * r]), out.view([256], [256 * r]))


CALL = sp.Callable(_orch, [IN, IN, IN, OUT])


def _case(w, i):
    x = np.arange(1024, dtype=np.float32)
    out = np.zeros(1024, np.float32)
    with sp.ResidentTaskArgs(w) as res:
        kv = res.add("kv", np.full(16384, i % 1000, np.float32))
        ctl = res.add("ctl", np.array([4, i], np.int32))
        for _ in range(2):
            r = w.run(CALL, [ctl, kv, x, out])
            assert r.ok
        np.testing.assert_array_equal(out, x + i % 1000)


def test_1000_cases_return_every_allocation_and_keep_rss_flat():
    w = sp.Worker("sim", svm=65536)
    base = None
    for i in range(CASES):
        _case(w, i)
        s = w.stats()
        assert s["live_allocations"] == (1 if w.debug_state()["arena"] else 0)  # only the staging arena
        assert s["live_mappings"] == w.debug_state()["views"]["mapped"] <= 1  # at most the arena's mapping
        if i % 50 == 0:
            with sp.Worker("sim", svm=65536, staging="fresh") as own:
                _case(own, i)
                assert own.stats()["live_allocations"] == 0
        if i == WARM_UP:
            gc.collect()
            base = _rss()
    gc.collect()
    grown = _rss() - base
    s = w.stats()
    assert s["allocs"] == 1 + 2 * CASES  # the arena, then two resident tensors per case
    w.trim_staging()
    assert (w.stats()["live_allocations"], w.stats()["live_mappings"]) == (0, 0)
    w.close()
    assert grown < TOLERANCE, f"RSS grew by {grown / 2**20:.1f} MiB over {CASES - WARM_UP} cases"
