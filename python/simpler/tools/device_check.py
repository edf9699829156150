"""Checks of a vendor platform on a machine with a real device, from an installed package.

``python -m simpler.tools.device_check --out DIR [--platform cuda] [--quick] [--only TEXT]``
``python -m simpler.tools.device_check --preflight [--platform cuda]``

What ``make device-check`` (``.ci/device-check``) runs on a GPU machine, which has no Rust
toolchain and no package registry: the wheel built elsewhere, installed with ``pip --no-deps
--target`` (with the wheels ``make device-wheels`` carries: ``ml_dtypes``, pytest and what it
needs), and this module, in one process. The checks are pytest tests shipped in the package
(:mod:`simpler.tools.device_checks`: ``check_driver``, ``check_workloads``, ``check_device``);
this module runs the preflight, then ``pytest.main`` on them with the package's own plugin
(:mod:`simpler.tools.device_checks.plugin`, ``-p``; no configuration file, conftest or plugin
of the machine is loaded), which prints the run and writes the JSON lines.

``--preflight`` prints what the run would stand on and exits (:mod:`simpler.tools.preflight`):
the interpreter, the packages (numpy, pytest, ml_dtypes, torch, cupy, triton, the NVRTC wheels
and their ``libnvrtc`` files), the CUDA driver (the library and ``cuDriverGetVersion``), the
device (name, compute capability, SMs, memory, clocks) and the NVRTC the runtime would compile
with. Every normal run prints the same lines first, before any check, and records the facts in
its ``run`` line. When something required is missing (numpy, pytest; on cuda the driver library,
a ``cuInit`` that fails, no device) the preflight stops with one line on stderr saying what is
missing and how to get it, exit status 2; without ``ml_dtypes`` the bfloat16 checks (paged
attention, bench) are skipped with that reason and the others run.

Every check is named and timed; a failure is recorded (with its traceback on stdout) and the
next check runs; a check that does not apply is skipped (``pytest.skip``) with the reason.
``--only TEXT`` (repeatable) runs ``driver.open`` and the checks whose name contains TEXT (the
others are deselected); the names are also pytest keywords, so ``PYTEST_ADDOPTS="-k ..."``
selects by them too. ``DIR/device_check.jsonl`` gets one JSON line per check (``kind:
"check"``: ``name``, ``status`` — passed, failed or skipped —, ``ok`` (not failed),
``seconds``, ``figures``, ``error``, ``skip_reason``) and per figure (``kind: "figure"``:
``check``, ``name``, ``value``), after a ``kind: "run"`` line (versions, driver, host, and the
preflight's facts under ``preflight``) and before a ``kind: "summary"`` line. The bench's round
records also go to ``DIR/bench_<case>.jsonl`` (``simpler report`` re-prints them). Exit status 1
when a check failed, else 0.

The checks (``--platform cuda``, the default):

* ``driver.*`` — through the public API: the device opens (``driver.open``, whatever ``--only``
  says); workers opened and closed on 4 threads at once, and one worker
  used from 4 threads; ``copy_to`` / ``copy_from`` of 256 MiB (16 MiB with ``--quick``) from
  pageable memory, GB/s; mirror refreshes into page-locked vs pageable mirrors
  (``SIMPLER_CUDA_PIN_MIRRORS=1`` / ``0``), GB/s; the poison memset (a staged OUT tensor a kernel
  never writes reads back 0xA5, for a host-path kernel and for a device kernel); errors (a copy
  past an allocation is an ``ArgumentError`` / ``DeviceError`` naming the call, an injected
  ``h2d`` fault a ``DeviceError``, in a copy and in a run, and the worker works afterwards); a
  resident set round trip through a device kernel.
* ``paged_attention.*`` — the shipped workload's Small1 / Small2 cases, all three arms, golden
  checked, with the batched orchestration and with the per-task one; on cuda every task runs on
  the device (``host_path_tasks == 0``, ``device_tasks == tasks``).
* ``paged_attention_unroll.*`` — the unrolled workload's CaseVarSeq4 / CaseTwoGroups cases, all
  three arms, golden checked, every task on the device on cuda.
* ``bench.paged_attention_unroll[Case1]`` and ``[Case2]`` (``--quick``: CaseVarSeq4,
  CaseTwoGroups), then ``bench.paged_attention[B64_8K]`` and ``[B256_8K]`` (``--quick``: Small1,
  Small2) — the bench's
  three arms interleaved (:func:`simpler.tools.bench.bench_records`, golden checked): per-phase
  warm medians per arm, the dispatch ratios bulk/staged and all/bulk, execute ms per round; then
  the model's error: the same case priced on sim (2 rounds) under the cost model of the device's
  platform (``h200`` on cuda, ``ascend-a3`` on ascend), printed beside the measured phases (every
  phase, the dispatch path and the round) with the ratio measured / modeled, figures
  ``model.<arm>.<row>.<model>`` (``docs/cost-model.md`` keeps them per platform).
* ``bench.replay`` — warm rounds planned against replayed (:mod:`simpler.tools.bench_replay`),
  with the device's time from events: the host's part of execute, its planning and the device
  time per workload and arm, and each workload's cold plan.
* ``decode.overlap`` — the decode driver's device mode (``examples/decode``) with each step
  waited for and left pending, interleaved: tokens per second of each and their ratio, outputs
  bit for bit the same.
* ``export.queued_work`` — a consumer reads a :class:`~simpler.DeviceTensor` while the memsets
  that write it are still queued on the worker's stream (:mod:`simpler.tools.export_check`; on the
  fake libcuda the stream is held instead): through DLPack (a capsule for the consumer's stream),
  through ``__cuda_array_interface__`` (the consumer waits for its ``stream``, as CAI v3 asks), and
  with torch on a real GPU through ``torch.from_dlpack`` under a side stream: every such read sees
  the new bytes. A read that does not wait is counted; it must have seen stale bytes at least
  once, or the race never happened and the check fails for proving nothing.
* ``compile.kernel_resources`` — every shipped CUDA source compiled for the device's
  architecture with the NVRTC chosen for its driver (:func:`simpler.compile_cuda`): registers,
  stack and spills per entry from ptxas' report; a spill fails the check.
* ``launches`` — the ``launches`` benchmark (:func:`simpler.tools.benchmarks.bench_launches`):
  N single submits vs one ``submit_many``, per task; on cuda one launch per single submit and one
  per ``submit_many``, every task on the device.

On CI's fake libcuda (``simpler.testing.fake_cuda``; ``.ci/device-check --dry-run``) the fake's
host kernels are installed first and what needs a real GPU is skipped with the reason. On other
platforms (``ascend``, ``sim``) the CUDA-only checks are skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import PlatformUnavailableError
from ..worker import Worker
from . import preflight

# What the other modules and the tests read from here: the checks' context, the device check's
# own CUDA entry and the model comparison of the bench checks (none of them imports pytest).
from .device_checks.common import MODEL_ROUNDS, NOTHING_ENTRY, NOTHING_SOURCE, PLATFORM_MODEL, Context
from .device_checks.common import fake_first as _fake_first
from .device_checks.common import model_error as _model_error  # noqa: F401  (tests read it here)

__all__ = ["MODEL_ROUNDS", "NOTHING_ENTRY", "NOTHING_SOURCE", "PLATFORM_MODEL", "Context", "main"]

# Pytest loads no plugin from the machine's entry points in a device-check run: only the checks'.
_NO_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simpler.tools.device_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", metavar="DIR", help="folder for device_check.jsonl (made if missing; not with --preflight)"
    )
    p.add_argument(
        "--preflight",
        action="store_true",
        help="print the interpreter, packages, driver, device and NVRTC choice, then exit",
    )
    p.add_argument("--platform", default="cuda", choices=("cuda", "ascend", "sim"), help="default cuda")
    p.add_argument("--quick", action="store_true", help="small sizes, the Small cases in the bench")
    p.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="only the checks whose name contains TEXT (and driver.open); repeatable",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m simpler.tools.device_check``: the preflight, then the checks
    under pytest; returns the exit status (2 when the preflight finds something required
    missing, 1 when a check failed)."""
    p = _parser()
    a = p.parse_args(argv)
    if not a.out and not a.preflight:
        p.error("--out DIR is required (except with --preflight)")
    try:
        facts = preflight.run(a.platform, before_nvrtc=_fake_first(a.platform))
    except preflight.NoDevice as e:
        print(f"device-check: skipped: {e}", flush=True)
        return 0
    except preflight.PreflightError as e:
        print(f"device-check: preflight: {e}", file=sys.stderr, flush=True)
        return 2
    if a.preflight:
        return 0
    try:
        Worker(a.platform).close()
    except PlatformUnavailableError as e:
        print(f"device-check: skipped: {e}")
        return 0
    except Exception:
        pass  # the device does not open: the first check (driver.open) records why
    import pytest  # the preflight found it

    from .device_checks import plugin

    args = plugin.main_args(a.platform, Path(a.out).resolve(), a.quick, a.only)
    before = os.environ.get(_NO_AUTOLOAD)
    os.environ[_NO_AUTOLOAD] = "1"
    try:
        code = pytest.main(args, plugins=[plugin.PreflightFacts(facts)])
    finally:
        if before is None:
            os.environ.pop(_NO_AUTOLOAD, None)
        else:
            os.environ[_NO_AUTOLOAD] = before
    return 0 if code in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) else 1


if __name__ == "__main__":
    raise SystemExit(main())
