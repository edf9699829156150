"""The sim cost model: every driver call and every access through a mapping is priced from the
published figures of ``docs/cost-model.md``; the run report carries modeled time per phase beside
the measured time. One test per reference figure, through the whole stack."""

from __future__ import annotations

import numpy as np
import pytest

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT


def _modeled(w):
    return w.stats()["modeled_ns"]


def test_a_small_d2h_costs_9_5_us_on_ascend_a3():
    with sp.Worker("sim", model="ascend-a3") as w:
        buf = w.malloc(64)
        before = _modeled(w)
        w.copy_from(np.empty(16, np.float32), buf)
        assert abs(_modeled(w) - before - 9_500) <= 10  # the call, and 64 B at 12 GB/s


def test_a_register_unregister_pair_costs_5_2_us_at_1_kib_and_18_8_us_at_256_kib():
    read = sp.Callable(lambda o, t: o.get_tensor_data(t, 0), [IN])
    for nbytes, pair in ((1 << 10, 5_200), (256 << 10, 18_800)):
        with sp.Worker("sim", model="ascend-a3", view_policy="mapping") as w:
            buf = w.malloc(nbytes)
            w.run(read, [buf.tensor((nbytes // 4,), "float32")])  # maps the allocation
            before = _modeled(w)
            mapped = w.stats()["maps"]
            w.free(buf)  # unmaps, then frees
            freed = _modeled(w) - before
            assert mapped == 1
            # The pair, split between the two calls; the register was charged during the run.
            register = (pair + 1) // 2
            assert abs((freed - 5_000) + register - pair) <= 1, (freed, pair)


def test_a_256_mib_h2d_runs_at_pageable_and_a_refresh_at_pinned_bandwidth_on_h200():
    n = 256 << 20
    data = np.zeros(n, np.uint8)
    with sp.Worker("sim", model="h200", svm="never") as w:
        buf = w.malloc(n)
        before = _modeled(w)
        w.copy_to(buf, data)  # from pageable numpy memory
        pageable = _modeled(w) - before
        assert 10.0 <= n / (pageable - 6_500) <= 17.0
        # A mirror is page-locked on this platform: its refresh (one D2H) runs at pinned speed.
        r = w.run(sp.Callable(lambda o, t: o.get_tensor_data(t, 0), [IN]), [buf.tensor((n,), "uint8")])
        assert r.counters["views_mirrored"] == 1 and w.stats()["pins"] == 1
        w.copy_to(buf, data[:16])  # marks the mirror stale
        before = _modeled(w)
        r = w.run(sp.Callable(lambda o, t: o.get_tensor_data(t, 0), [IN]), [buf.tensor((n,), "uint8")])
        assert r.counters["mirror_refreshes"] == 1
        pinned = r.modeled["orchestrate"]
        assert 53.0 <= n / (pinned - 6_500) <= 55.0
        assert _modeled(w) - before == pinned


def test_a_mapped_read_costs_1_7_us_and_a_write_0_09_us():
    def orch(o, t):
        o.get_tensor_data(t, 3)
        o.set_tensor_data(t, 4, 1.0)

    call = sp.Callable(orch, [INOUT])
    with sp.Worker("sim", model="h200", view_policy="mapping") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.zeros(1024, np.float32), INOUT, eager=True)  # mapped at add
        r = w.run(call, [t])
        assert (r.counters["mapped_reads"], r.counters["mapped_writes"]) == (1, 1)
        assert r.modeled["orchestrate"] == 1_700 + 90


@pytest.mark.parametrize("policy", ["mapping", "cached"])
def test_the_cumulative_modeled_time_is_the_sum_of_the_reports(policy):
    """``stats()["modeled_ns"]`` accumulates what the reports model, mapped accesses and cache
    fills included: over several runs, its growth equals the sum of every modeled phase."""

    def orch(o, t):
        for i in range(64):
            o.get_tensor_data(t, i)
        o.set_tensor_data(t, 1, 2.0)

    call = sp.Callable(orch, [INOUT])
    with sp.Worker("sim", model="h200", view_policy=policy) as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.zeros(1024, np.float32), INOUT)
        before = _modeled(w)
        reports = [w.run(call, [t]) for _ in range(3)]
        assert reports[0].modeled["orchestrate"] > 0
        assert _modeled(w) - before == sum(sum(r.modeled.values()) for r in reports)


def test_reports_carry_modeled_time_beside_measured_time():
    k = sp.Kernel(lambda x, y: np.copyto(y, x), [IN, OUT])
    call = sp.Callable(lambda o, x, y: o.submit(k, x, y), [IN, OUT])
    with sp.Worker("sim", model="ascend-a3") as w:
        x = np.ones(1 << 20, np.float32)
        r = w.run(call, [x, np.zeros_like(x)])
        assert set(r.modeled) == set(r.phases)
        # bind uploads 4 MiB (and grows the arena): at least one call plus 4 MiB at 12 GB/s.
        assert r.modeled["bind"] >= 9_500 + (4 << 20) // 12
        assert r.modeled["copy_back"] >= 9_500 + (4 << 20) // 12
        assert r.modeled_dispatch_ns == sum(v for k_, v in r.modeled.items() if k_ != "execute")
    with sp.Worker("sim") as w:
        assert w.run(call, [x, np.zeros_like(x)]).modeled is None


def test_unknown_models_and_models_off_sim_are_refused():
    with pytest.raises(sp.ArgumentError, match="model must be one of ascend-a3, h200"):
        sp.Worker("sim", model="tpu-v9")
    with pytest.raises(sp.ArgumentError, match="model are sim options"):
        sp.Worker("ascend", model="ascend-a3")
