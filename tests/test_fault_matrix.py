"""The fault-injection matrix: every driver operation x every phase that calls it x its
first / middle / last call in that phase.

The matrix is derived, not hand-listed. A reference scenario (user buffers, a resident set, two
runs mixing mirrors, mappings, staged copies, push-backs, a mirror refresh, scratch tensors and
arena growth, then release, free and close) runs once per configuration; the driver's call log
labels every call with the phase of the worker that made it. Each (phase, op) pair
that occurs becomes a row; its first, middle and last call become cells. A cell replays the
scenario with exactly that call failing and checks:

* the error names the phase, the operation and the injected code (``DeviceError.phase/.op/.code``
  and the message); a fault during ``close`` is logged, since close never raises;
* nothing leaks: the live allocations are exactly the arena, the scratch pool, the caller's own
  buffers and — when a free or unmap failed — the one orphan that close retries; live mappings
  and host views belong to those allocations only;
* no double free: replaying the call log, every successful free or unmap matches a live
  allocation or mapping (and on sim, whose addresses are never reused, each address is freed
  successfully at most once);
* the worker then runs a clean case correctly, and close releases everything, the orphan
  included, without error.

Configurations: sim with the arena and with fresh staging (``svm=65536``: small allocations are
mirrored, large ones mapped), and the ascend platform over the fake vendor library, where kernels
run over host copies so execute makes driver calls too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT
CODE = 507_901  # the injected code: unique, so the failing call is unambiguous in the log
OPS = ("alloc", "free", "h2d", "d2h", "map", "unmap", "memset")
POISON = 0xA5  # what never-written memory holds, on every platform
LIBS = Path(__file__).resolve().parents[1] / "target" / "fake-ascend-libs"
ASCEND_ENV = {"SIMPLER_ASCEND_LIB_DIR": str(LIBS), "FAKE_ASCEND_MAP": "min:65536"}


@contextlib.contextmanager
def _platform_env(platform):
    """The environment the ascend platform needs (the fake vendor library), restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*ASCEND_ENV, "ASCEND_RT_VISIBLE_DEVICES")}
    if platform == "ascend":
        os.environ.update(ASCEND_ENV)
        os.environ.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _worker(platform, staging):
    """A worker of the configuration (sim maps allocations of 64 KiB and more)."""
    opts = {"svm": 65536} if platform == "sim" else {}
    return sp.Worker(platform, staging=staging, **opts)


# ---- the reference scenario -------------------------------------------------------------------


def _k_first(x, table, tmp):
    tmp[...] = x + table


def _k_second(tmp, state, acc, out):
    state += 1
    acc += tmp
    out[...] = tmp * 2


K_FIRST = sp.Kernel(_k_first, [IN, IN, OUT])
K_SECOND = sp.Kernel(_k_second, [IN, INOUT, INOUT, OUT])
SMALL = 16  # elements of the small staged tensors
BIG = 16384  # float32 elements: 64 KiB, mapped under svm=65536 / FAKE_ASCEND_MAP=min:65536


def _orchestrate(o, lens, state, table, ctrl, big, x, acc, out, spare):
    assert o.get_tensor_data(lens, 0) == 3  # resident, small: mirror (refused map + fill)
    s = o.get_tensor_data(state, 0)  # resident INOUT mirror: refreshed in round 2
    o.set_tensor_data(state, 1, s + 10)  # mirror write: pushed to the device at once
    assert o.get_tensor_data(table, 3) == 3.0  # resident, large: mapping
    c = o.get_tensor_data(ctrl, 0)  # user buffer mirror: stale after copy_to
    o.set_tensor_data(ctrl, 1, c + 1)
    assert o.get_tensor_data(big, 5) == 5.0  # user buffer, large: mapping
    o.set_tensor_data(x, 0, 1.5)  # staged IN: arena mapping, or staged copy + push-back
    assert o.get_tensor_data(acc, 0) == 0.0  # staged INOUT, large
    tmp = o.scratch([SMALL], "float32", name="tmp")  # scratch pool: allocated once
    probe = o.scratch([4], "int32", name="probe")
    # Never written in this run: poison, every run (the pool is reused from the first run on).
    assert o.get_tensor_data(probe, 3) == np.frombuffer(bytes([POISON] * 4), np.int32)[0]
    o.set_tensor_data(probe, 0, 2)  # maps the scratch chunk
    o.submit(K_FIRST, x, table.view([SMALL], [0]), tmp)
    o.submit(K_SECOND, tmp, state, acc.view([SMALL], [0]), out)


CALL = sp.Callable(_orchestrate, [IN, INOUT, IN, IN, IN, IN, INOUT, OUT, OUT])


def _scenario(w):
    """Buffers, a resident set, two runs (the second grows the arena), release, free, close."""
    ctrl_buf = w.malloc(16)
    w.copy_to(ctrl_buf, np.arange(4, dtype=np.int32))
    big_buf = w.malloc(BIG * 4)
    w.copy_to(big_buf, np.arange(BIG, dtype=np.float32))
    ctrl = ctrl_buf.tensor((4,), "int32")
    big = big_buf.tensor((BIG,), "float32")
    table_host = np.arange(BIG, dtype=np.float32)
    with sp.ResidentTaskArgs(w) as res:
        lens = res.add("lens", np.array([3, 0, 0, 0], np.int32))
        state = res.add("state", np.zeros(4, np.int32), INOUT)
        table = res.add("table", table_host)
        for rnd, n_acc in enumerate((BIG, 2 * BIG)):
            x = np.full(SMALL, rnd + 1, np.float32)
            acc = np.zeros(n_acc, np.float32)
            out = np.zeros(SMALL, np.float32)
            spare = np.zeros(SMALL, np.float32)  # staged OUT that no task writes
            w.run(CALL, [lens, state, table, ctrl, big, x, acc, out, spare])
            assert (spare.view(np.uint8) == POISON).all()  # never-written memory shows, every run
            tmp = x.copy()
            tmp[0] = 1.5
            tmp += table_host[:SMALL]
            np.testing.assert_array_equal(out, tmp * 2)
            np.testing.assert_array_equal(acc[:SMALL], tmp)
            np.testing.assert_array_equal(x, rnd + 1)  # the caller's IN array is never written
            if rnd == 0:
                w.copy_to(ctrl_buf, np.full(4, 7, np.int32))  # makes the ctrl mirror stale
        got = np.zeros(4, np.int32)
        w.copy_from(got, state.buffer)
        np.testing.assert_array_equal(got, [2, 12, 2, 2])
    w.free(big_buf)
    got = np.zeros(4, np.int32)
    w.copy_from(got, ctrl_buf)
    np.testing.assert_array_equal(got, [7, 8, 7, 7])
    w.close()


def _add(x, y, out):
    out[...] = x + y


ADD = sp.Kernel(_add, [IN, IN, OUT])


def _orch_add(o, x, y, out):
    assert o.get_tensor_data(x, 1) == 1.0
    o.submit(ADD, x, y, out)


ADD_CALL = sp.Callable(_orch_add, [IN, IN, OUT])


def _clean_case(w):
    """A small correct case: one resident input, staged input and output, two rounds."""
    x = np.arange(8, dtype=np.float32)
    y = x * 3
    out = np.zeros(8, np.float32)
    with sp.ResidentTaskArgs(w) as res:
        rx = res.add("clean_x", x)
        for _ in range(2):
            out[:] = -1
            r = w.run(ADD_CALL, [rx, y, out])
            np.testing.assert_array_equal(out, x + y)
            assert r.ok


# ---- call-log bookkeeping -------------------------------------------------------------------


def _replay(log, unique_addresses):
    """Live allocations and mappings after ``log``; fails on any double free or unmatched unmap.

    Drivers reuse addresses (the fake vendor library does, as real runtimes do), so an
    allocation is named by its address and generation: the how-many-th successful alloc that
    returned that address. ``freed`` counts successful frees per ``(address, generation)``.
    """
    live, maps, freed, gens = {}, set(), Counter(), Counter()
    for i, (op, addr, nbytes, code, _phase) in enumerate(log):
        if code != 0:
            continue
        if op == "alloc":
            assert addr not in live, f"call {i}: alloc returned live address {addr:#x}"
            gens[addr] += 1
            live[addr] = nbytes
        elif op == "free":
            assert addr in live, f"call {i}: free of {addr:#x}, which is not live (double free?)"
            assert addr not in maps, f"call {i}: free of {addr:#x} while it is mapped"
            del live[addr]
            freed[addr, gens[addr]] += 1
        elif op == "map":
            assert addr in live and addr not in maps, f"call {i}: map of {addr:#x}"
            maps.add(addr)
        elif op == "unmap":
            assert addr in maps, f"call {i}: unmap of {addr:#x}, which is not mapped"
            maps.remove(addr)
    if unique_addresses:
        reused = {hex(a): n for a, n in gens.items() if n > 1}
        assert not reused, f"addresses allocated more than once: {reused}"
    return live, maps, freed


def _generation_at(log, index, addr):
    """The generation of the allocation at ``addr`` when call ``index`` was made."""
    return sum(1 for op, a, _n, code, _p in log[:index] if op == "alloc" and code == 0 and a == addr)


def _phase_at(log, index):
    """The phase of call-log entry ``index``, as the runtime labelled it."""
    phase = log[index][4]
    assert phase, f"driver call {index} was made outside every phase"
    return phase


def _phase_calls(log):
    """{(phase, op): [global ordinal of the call among calls of op, ...]} from the call log."""
    ordinal = Counter()
    rows = {}
    for i, (op, *_rest) in enumerate(log):
        ordinal[op] += 1
        rows.setdefault((_phase_at(log, i), op), []).append(ordinal[op])
    return rows


CONFIGS = [("sim", "arena"), ("sim", "fresh"), ("ascend", "arena"), ("ascend", "fresh")]


def _ascend_missing():
    return None if (LIBS / "libascend_hal.so").exists() else f"fake vendor library not linked under {LIBS}"


_DERIVED = {}


def _derive(platform, staging):
    """Runs the reference scenario once and returns its (phase, op) rows."""
    key = (platform, staging)
    if key not in _DERIVED:
        with _platform_env(platform):
            w = _worker(platform, staging)
            _scenario(w)
        log = w.call_log()
        _DERIVED[key] = (_phase_calls(log), log)
    return _DERIVED[key][0]


def _cells():
    cells = []
    for platform, staging in CONFIGS:
        if platform == "ascend" and _ascend_missing():
            cells.append(
                pytest.param(
                    (platform, staging, "-", "-", "-", 0),
                    id=f"{platform}-{staging}",
                    marks=pytest.mark.skip(reason=_ascend_missing()),
                )
            )
            continue
        for (phase, op), ordinals in sorted(_derive(platform, staging).items()):
            n = len(ordinals)
            picks = {}
            for pos, k in (("first", 0), ("middle", (n - 1) // 2), ("last", n - 1)):
                picks.setdefault(k, pos)
            for k, pos in picks.items():
                cell = (platform, staging, phase, op, pos, ordinals[k])
                cells.append(pytest.param(cell, id=f"{platform}-{staging}-{phase}-{op}-{pos}"))
    return cells


CELLS = _cells()


def test_the_derived_matrix_covers_every_operation_and_phase():
    """Every driver call of the reference is attributed; the rows span every op and phase."""
    for platform, staging in CONFIGS:
        if platform == "ascend" and _ascend_missing():
            continue
        rows = _derive(platform, staging)
        _, log = _DERIVED[(platform, staging)]
        for i in range(len(log)):
            _phase_at(log, i)
        assert all(c[3] in (0, 0xFFFE) for c in log), "the reference scenario must not fail"
        assert {op for _, op in rows} == set(OPS), (platform, staging, sorted(rows))
        phases = {p for p, _ in rows}
        want = {"buffer", "resident_add", "bind", "orchestrate", "copy_back", "release", "close"}
        if staging == "fresh":
            want.add("cleanup")
        if platform != "sim":
            want.add("execute")  # kernels run over host copies
        assert want <= phases, (platform, staging, sorted(rows))
        assert platform != "sim" or "execute" not in phases  # sim kernels see device memory
        # The sub-steps of orchestrate all occur: view establishment (map, mirror fill),
        # refresh (d2h in round 2), push-back (h2d), scratch allocation.
        assert {op for p, op in rows if p == "orchestrate"} >= {"map", "d2h", "h2d", "alloc"}
    assert len(CELLS) >= 60


def _expected_live(w, fault):
    """What may stay live: the arena, the scratch pool, the caller's buffers, and the orphan."""
    log = w.call_log()
    keep = set()
    arena = w.debug_state()["arena"]
    if arena:
        keep.add(arena[0])
    _, _, freed = _replay(log, False)
    for i, (op, addr, _n, code, _phase) in enumerate(log):
        if op == "alloc" and code == 0:
            phase = _phase_at(log, i)
            gen = _generation_at(log, i + 1, addr)
            if phase == "orchestrate" or (phase == "buffer" and not freed[addr, gen]):
                keep.add(addr)  # a scratch pool chunk / a buffer the caller still owns
    if fault[0] in ("free", "unmap"):
        keep.add(fault[1])  # the allocation whose free or unmap failed: kept for close to retry
    return keep


def _check_no_leak(w, fault, unique):
    live, maps, _ = _replay(w.call_log(), unique)
    s = w.stats()
    assert (s["live_allocations"], s["live_mappings"]) == (len(live), len(maps))
    keep = _expected_live(w, fault)
    assert set(live) == keep, (
        f"live {sorted(map(hex, live))} != arena + scratch + caller's buffers + orphan "
        f"{sorted(map(hex, keep))}"
    )
    assert maps <= keep
    mapped, mirrored, refused = tuple(w.debug_state()["views"].values())
    assert mapped == len(maps)
    assert mapped + mirrored + refused <= len(keep)


@pytest.mark.parametrize("cell", CELLS)
def test_fault_cell(cell, monkeypatch, caplog):
    platform, staging, phase, op, _pos, nth = cell
    if platform == "ascend":
        for k, v in ASCEND_ENV.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    unique = platform == "sim"
    w = _worker(platform, staging)
    w.inject_fault(op, nth=nth, code=CODE)
    err = None
    with caplog.at_level(logging.ERROR, logger="simpler"):
        try:
            _scenario(w)
        except sp.DeviceError as e:
            err = e
    log = w.call_log()
    failed = [i for i, c in enumerate(log) if c[3] == CODE]
    assert len(failed) == 1, f"the fault fired {len(failed)} times"
    fault = log[failed[0]]
    assert fault[0] == op
    assert _phase_at(log, failed[0]) == phase, "the fault hit a call of another phase"
    op_in_msg = re.compile(rf"\[{op}[,\]]")

    if phase == "close":
        # close never raises: it logs each failure, and the driver's own close frees the rest.
        assert err is None
        msgs = [r.getMessage() for r in caplog.records if "worker close:" in r.getMessage()]
        assert len(msgs) == 1, msgs
        assert msgs[0].startswith("worker close: [close]"), msgs[0]
        assert f"code {CODE}" in msgs[0] and op_in_msg.search(msgs[0]), msgs[0]
        assert w.closed
        live, maps, freed = _replay(w.call_log(), unique)
        assert (live, maps) == ({}, set())
        assert w.stats()["live_allocations"] == 0 and w.stats()["live_mappings"] == 0
        assert tuple(w.debug_state()["views"].values()) == (0, 0, 0)
        gen = _generation_at(log, failed[0], fault[1])
        assert freed[fault[1], gen] == 1  # the failed free/unmap was completed once, by the driver
        with pytest.raises(sp.StateError, match="closed"):
            w.malloc(8)
        return

    assert err is not None, "the injected fault was swallowed"
    assert (err.phase, err.op, err.code) == (phase, op, CODE), str(err)
    msg = str(err)
    assert msg.startswith(f"[{phase}]") and f"code {CODE}" in msg and op_in_msg.search(msg), msg
    _check_no_leak(w, fault, unique)

    # The worker stays usable: a clean case runs correctly, and leaves no more than before.
    _clean_case(w)
    _check_no_leak(w, fault, unique)
    summary = w.close()
    assert summary["errors"] == []
    assert (summary["leaked_allocations"], summary["leaked_mappings"]) == (0, 0)
    live, maps, freed = _replay(w.call_log(), unique)
    assert (live, maps) == ({}, set())
    assert w.stats()["live_allocations"] == 0 and w.stats()["live_mappings"] == 0
    assert tuple(w.debug_state()["views"].values()) == (0, 0, 0) and w.debug_state()["arena"] is None
    if op in ("free", "unmap"):
        gen = _generation_at(log, failed[0], fault[1])
        assert freed[fault[1], gen] == 1  # the orphan was freed exactly once, by close
