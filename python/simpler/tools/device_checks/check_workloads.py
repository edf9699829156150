"""The device checks of the shipped workloads: their cases on the platform, golden checked
(``paged_attention.*``, ``paged_attention_unroll.*``), the bench's three arms with the model's
error beside them (``bench.<workload>[<case>]``), and warm rounds planned against replayed
(``bench.replay``).
"""

from __future__ import annotations

import json
from statistics import median
from typing import Any

import pytest

from ...testing.running import run_case
from .common import Context, Figures, device_timing, model_error, need_bfloat16, need_cuda

ARMS = ("Residency_staged", "Residency_bulk", "Residency_all")

#: The bench's cases per workload: (the full run's, ``--quick``'s). The unrolled graph leads
#: (upstream's Case1 and Case2, event-timed); the per-block graph follows.
BENCH_CASES = {
    "paged_attention_unroll": (("Case1", "Case2"), ("CaseVarSeq4", "CaseTwoGroups")),
    "paged_attention": (("B64_8K", "B256_8K"), ("Small1", "Small2")),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The bench checks' ``bench_case``: the cases of :data:`BENCH_CASES` for the workload the
    check's name ends with, the small ones with ``--quick``."""
    if "bench_case" in metafunc.fixturenames:
        full, quick = BENCH_CASES[metafunc.function.__name__.removeprefix("test_bench_")]
        metafunc.parametrize("bench_case", quick if metafunc.config.getoption("device_check_quick") else full)


# -- the shipped workloads' cases on the platform, golden checked --------------------------------------


def _case(
    ctx: Context, figures: Figures, case_name: str, per_task: bool = False, unrolled: bool = False
) -> None:
    """One case of the workload in 3 rounds, golden checked; on cuda every task on the device."""
    need_bfloat16()
    from ...workloads import paged_attention as pa
    from ...workloads import paged_attention_unroll as pu

    cls: type = pu.PagedAttentionUnroll if unrolled else pa.PagedAttention
    if per_task:

        class PerTask(pa.PagedAttention):
            CALLABLE = pa.CALLABLE_PER_TASK

        cls = PerTask
    rounds = 3
    reports = run_case(cls, case_name, ctx.platform, rounds)
    figures.update(rounds=rounds, warm_rounds=max(rounds - 1, 1))
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


@pytest.mark.device_check("paged_attention.{case}")
@pytest.mark.parametrize("case", [f"{base}_{arm}" for base in ("Small1", "Small2") for arm in ARMS])
def test_paged_attention(ctx: Context, figures: Figures, case: str) -> None:
    """The paged attention's Small1 / Small2 cases, all three arms, with the batched
    orchestration: golden checked, every task on the device on cuda."""
    _case(ctx, figures, case)


@pytest.mark.device_check("paged_attention.per_task.{case}")
@pytest.mark.parametrize("case", ["Small1_Residency_all"])
def test_paged_attention_per_task(ctx: Context, figures: Figures, case: str) -> None:
    """The paged attention with the per-task orchestration (one submit per task)."""
    _case(ctx, figures, case, per_task=True)


@pytest.mark.device_check("paged_attention_unroll.{case}")
@pytest.mark.parametrize(
    "case", [f"{base}_{arm}" for base in ("CaseVarSeq4", "CaseTwoGroups") for arm in ARMS]
)
def test_paged_attention_unroll(ctx: Context, figures: Figures, case: str) -> None:
    """The unrolled paged attention's CaseVarSeq4 / CaseTwoGroups cases, all three arms: golden
    checked, every task on the device on cuda."""
    _case(ctx, figures, case, unrolled=True)


# -- the bench's three arms -------------------------------------------------------------------------


def _bench(ctx: Context, figures: Figures, case: str, workload: str) -> None:
    """The bench's three arms interleaved on ``case`` (golden checked), its round records in
    ``DIR/bench_<workload>_<case>.jsonl``: per-phase warm medians per arm, the dispatch ratios,
    execute per round, split into the device's part and the host's; then the model's error."""
    need_bfloat16()
    from ..bench import BenchOptions, bench_records
    from ..report import format_tables

    rounds = 3 if ctx.quick else 5
    opts = BenchOptions(workload=workload, rounds=rounds, platform=ctx.platform, cases=[case])
    with device_timing():  # the device's part of execute, timed with events
        records, failures = bench_records(opts, progress=False)
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
    figures.update(rounds=rounds, warm_rounds=max(rounds - 1, 1))
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
    figures.update(model_error(ctx, case, records, workload))


@pytest.mark.device_check("bench.paged_attention_unroll[{bench_case}]")
def test_bench_paged_attention_unroll(ctx: Context, figures: Figures, bench_case: str) -> None:
    """The bench on the unrolled paged attention (upstream's Case1 and Case2; ``--quick``:
    CaseVarSeq4, CaseTwoGroups)."""
    _bench(ctx, figures, bench_case, "paged_attention_unroll")


@pytest.mark.device_check("bench.paged_attention[{bench_case}]")
def test_bench_paged_attention(ctx: Context, figures: Figures, bench_case: str) -> None:
    """The bench on the per-block paged attention (B64_8K and B256_8K; ``--quick``: Small1,
    Small2)."""
    _bench(ctx, figures, bench_case, "paged_attention")


@pytest.mark.device_check("bench.replay")
def test_replay(ctx: Context, figures: Figures) -> None:
    """Warm rounds planned against replayed (``python -m simpler.tools.benchmarks replay``),
    with the device's time from events: per workload and arm, the medians of the host's part
    of execute, its planning, and the device time (ns)."""
    need_cuda(ctx)
    need_bfloat16()  # the paged attention's inputs
    from ..bench_replay import bench_replay

    with device_timing():
        got = bench_replay(ctx.quick, ctx.platform)
    figures["rounds"] = got["rounds"]
    for label, w in got["workloads"].items():
        key = label.replace(" ", "_")
        for arm, m in w["median_ns"].items():
            figures[f"{key}.{arm}.exec_host_us"] = round(m["host"] / 1e3, 2)
            figures[f"{key}.{arm}.plan_us"] = round(m["plan"] / 1e3, 2)
            figures[f"{key}.{arm}.device_us"] = round(m["device"] / 1e3, 2)
        figures[f"{key}.cold_plan_us"] = round(w["cold_plan_ns"] / 1e3, 2)
