"""The device checks beyond the driver and the workloads: the decode driver's device mode with
steps waited for and left pending (``decode.overlap``), exports read while the work that writes
them is still queued (``export.queued_work``), the shipped CUDA sources' resources
(``compile.kernel_resources``) and the ``launches`` benchmark (``launches``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import pytest

from .common import NOTHING_SOURCE, Context, Figures, need_cuda, skip


@pytest.mark.device_check("decode.overlap")
def test_decode_overlap(ctx: Context, figures: Figures) -> None:
    """The decode driver's device mode with each step waited for and left pending
    (``w.run(..., wait=False)``), interleaved: tokens per second of each (medians), and the
    outputs of the two arms bit for bit."""
    need_cuda(ctx)
    # The driver is an example: in a checkout beside this package, or in the working directory
    # (an installed wheel run from the repository).
    roots = (Path(__file__).resolve().parents[4], Path.cwd())
    found = [r / "examples" / "decode" for r in roots if (r / "examples" / "decode" / "decode.py").exists()]
    if not found:
        skip("examples/decode/decode.py is neither beside this package nor in the working directory")
    examples = found[0]
    cfg_args = {
        "layers": 2 if ctx.quick else 8,
        "hidden": 64 if ctx.quick else 512,
        "heads": 8,
        "kv_heads": 2,
    }
    rounds = 4 if ctx.quick else 32
    arms: dict[bool, list[Any]] = {True: [], False: []}
    # The driver imports its kernels' device code from beside it, while it runs.
    sys.path.insert(0, str(examples))
    try:
        from decode import DecodeConfig, run_decode  # type: ignore[import-not-found]  # an example

        cfg = DecodeConfig(**cfg_args)
        for i in range(2 if ctx.quick else 4):
            for wait in (True, False) if i % 2 == 0 else (False, True):
                arms[wait].append(run_decode(cfg, "device", rounds, ctx.platform, wait=wait))
    finally:
        sys.path.remove(str(examples))
    bad = [r for rs in arms.values() for r in rs if r.golden_ok is False]
    if bad:
        raise AssertionError(f"decode golden failed: {bad[0].golden_errors}")
    if any(not np.array_equal(a.out, b.out) for a, b in zip(arms[True], arms[False])):
        raise AssertionError("a pending step gave other outputs than a waited one")
    waited = median(r.tokens_per_s for r in arms[True])
    pending = median(r.tokens_per_s for r in arms[False])
    figures.update(
        rounds=rounds,
        waited_tokens_per_s=round(waited, 2),
        pending_tokens_per_s=round(pending, 2),
        pending_over_waited=round(pending / waited, 4),
        device_launches_per_step=arms[False][0].reports[-1].counters["device_launches"],
    )


@pytest.mark.device_check("export.queued_work")
def test_export_queued_work(ctx: Context, figures: Figures) -> None:
    """A consumer reads a device tensor while the work that writes it is still queued on the
    worker's stream (:mod:`simpler.tools.export_check`): the reads that wait as DLPack and the
    CUDA Array Interface ask see the new bytes, every time; a read that does not wait must have
    seen stale bytes at least once, or the check proved nothing. With torch on a real GPU,
    ``torch.from_dlpack`` under a side stream is judged too."""
    from .. import export_check

    need_cuda(ctx)
    use_torch = False
    if not ctx.fake:
        try:
            import torch

            use_torch = bool(torch.cuda.is_available())
        except ImportError:
            use_torch = False
    nbytes = (16 << 20) if ctx.quick else (256 << 20)
    iterations = 5 if ctx.quick else 50
    with ctx.worker() as w:
        figures.update(export_check.run_export_check(w, iterations, nbytes, use_torch))
    figures["torch"] = use_torch


# -- the shipped kernels' resources ------------------------------------------------------------------


def _shipped_cuda_sources() -> list[tuple[str, str]]:
    """Every CUDA source the package ships, by name."""
    from ..benchmarks import LAUNCH_SOURCE

    sources = [("launches_benchmark", LAUNCH_SOURCE), ("device_check_nothing", NOTHING_SOURCE)]
    try:
        from ...workloads import paged_attention_cuda as pac
        from ...workloads import paged_attention_unroll_cuda as puc

        sources[:0] = [("paged_attention", pac.SOURCE), ("paged_attention_unroll", puc.SOURCE)]
    except ImportError:  # pragma: no cover - the workloads import without ml_dtypes
        pass
    return sources


@pytest.mark.device_check("compile.kernel_resources")
def test_kernel_resources(ctx: Context, figures: Figures) -> None:
    """Every shipped CUDA source compiled for this device's architecture with the NVRTC the
    runtime chose for its driver (:func:`simpler.compile_cuda`): registers, stack and spills per
    entry, from ptxas' report in the compile log. A spill fails the check."""
    from ... import compile_cuda

    need_cuda(ctx)
    device = ctx.facts.get("device") or {}
    cc = tuple(device.get("capability") or ())
    if len(cc) != 2:
        skip("the preflight could not read the device's compute capability")
    driver = (ctx.facts.get("nvrtc") or {}).get("driver")
    spills = []
    for what, src in _shipped_cuda_sources():
        r = compile_cuda(src, cc, name=f"{what}.cu", driver=tuple(driver) if driver else None)
        figures[f"{what}.target"] = r["target"]
        figures[f"{what}.nvrtc"] = r["nvrtc"]
        if not r["kernels"]:
            if r["kind"] == "cubin" and not ctx.fake:
                raise AssertionError(
                    f"{what}: the compile log of the {r['target']} cubin has no ptxas report "
                    f"(--ptxas-options=-v) from {r['nvrtc']}"
                )
            # PTX is compiled by the driver, not ptxas; the fake NVRTC runs no ptxas.
            figures[f"{what}.resources"] = f"not reported ({r['kind']} from this NVRTC)"
        for entry, k in r["kernels"].items():
            for key in ("registers", "stack_bytes", "spill_store_bytes", "spill_load_bytes"):
                figures[f"{what}.{entry}.{key}"] = k[key]
            if k["spill_store_bytes"] or k["spill_load_bytes"]:
                stored, loaded = k["spill_store_bytes"], k["spill_load_bytes"]
                spills.append(f"{entry} ({stored} B stored, {loaded} B loaded)")
    if spills:
        raise AssertionError("register spills: " + ", ".join(spills))


# -- the launches benchmark ---------------------------------------------------------------------------


@pytest.mark.device_check("launches")
def test_launches(ctx: Context, figures: Figures) -> None:
    """The ``launches`` benchmark; on cuda: a launch per single submit, one per ``submit_many``,
    every task on the device, every element right."""
    from ..benchmarks import bench_launches

    figs = bench_launches(ctx.quick, ctx.platform)
    figures["verified"] = figs["verified"]
    problems = []
    for r in figs["results"]:
        key = f"{r['arm']}.{r['n']}"
        for k in ("orchestrate_ns_per_task", "execute_ns_per_task", "tasks_per_s", "launches_per_s"):
            figures[f"{key}.{k}"] = round(r[k], 3)
        for k in ("device_launches", "device_tasks", "host_path_tasks"):
            figures[f"{key}.{k}"] = r[k]
        if ctx.cuda:
            launches = r["n"] if r["arm"] == "single" else -(-r["n"] // 65535)
            if (r["device_launches"], r["device_tasks"], r["host_path_tasks"]) != (launches, r["n"], 0):
                problems.append(
                    f"{key}: {r['device_launches']} launches, {r['device_tasks']} device tasks, "
                    f"{r['host_path_tasks']} host-path tasks (expected {launches}, {r['n']}, 0)"
                )
    figures.update({f"ratio_single_over_many.{k}": round(v, 3) for k, v in figs["ratios"].items()})
    if "device_code" in figs:
        figures.update({f"device_code.{k}": v for k, v in figs["device_code"].items()})
    if problems:
        raise AssertionError("; ".join(problems))
