"""Running a bench: the residency arms of a workload, their rounds interleaved, as records.

A **workload** is a name in :data:`simpler.workloads.WORKLOADS` (shipped with the package, so it
runs from any install), a path to a scene-test file, or ``path/to/driver.py:function`` (a driver:
``function(options)`` receives the :class:`BenchOptions` and yields ``(case, arm, RunReport)``
once per round, in round order). Relative paths resolve against the current directory.

**Arms.** A scene-test case belongs to arm ``params["arm"]`` when it has one, else to the
``Residency_<x>`` suffix of its name (``B64_8K_Residency_bulk`` is case ``B64_8K``, arm
``Residency_bulk``); a case with neither is an arm of its own. The arms of a case run side by side
in one process, each on its own worker, with their rounds interleaved (round 1 of every arm, then
round 2, ..., the order rotating from round to round), so drift of a shared machine hits every arm
alike.

**Devices.** With ``--devices N`` (``N > 1``), or for a case that declares several devices, each
arm runs twice in the same invocation, its rounds interleaved with the others': on one device
(the usual worker) and on ``N`` devices (a :class:`~simpler.group.DeviceGroup`, one process per
device, the case's arguments split across them: :mod:`simpler.testing.scene_group`), so the
dispatch ratios of the arms on ``N`` devices sit beside the one-device ones. A case that cannot
split is skipped, with the reason.

**Selection** follows :mod:`simpler.testing.runner` (the rules every front end shares); a selector also
matches a case by its name without the arm, and naming a manual case (``--case B256_8K``) runs it.
Without ``--case``, a workload module's ``BENCH_CASES`` (when it has them) are selected: the
unrolled paged attention's ``Case1`` and ``Case2``; on sim without ``--model``, its
``BENCH_MODELS`` price every round (the unrolled paged attention's: ``ascend-a3`` and ``h200``).

**Records.** One dict per round: :meth:`RunReport.to_dict` (``callable``, ``ok``, ``phases``,
``counters``) plus ``workload``, ``test``, ``case``, ``case_name``, ``arm``, ``round`` (1-based),
``rounds``, ``platform``, ``golden`` (whether the round's outputs were compared with the golden),
``golden_skipped_by`` (when they were not: ``"option"`` for ``--skip-golden``, ``"case"`` for
the case's ``"skip_golden"``, ``"class"`` for the class's ``SKIP_GOLDEN``; ``None`` when they
were; a driver workload is handed the options and checks unless ``--skip-golden``),
``dispatch_ns``, ``bytes_moved``,
``devices`` (the device count of the run: 1, or ``N``), on a sim
worker with cost models ``modeled`` (per phase, the primary model), ``modeled_by`` (per model),
``kernels`` (each kernel's work and price), ``modeled_dispatch_ns`` and ``modeled_round_ns``, and the
run's provenance: ``version`` (of simpler), ``commit`` (of the checkout simpler was built from,
when there is one), ``host``, ``python`` and ``timestamp`` (UTC, ISO 8601, when the bench started).
A round on ``N`` devices is ``N`` records, one per device (its own report), each with ``device``
(the id), ``device_index`` (its position in the group) and ``round_wall_ns`` (the wall time of the
group round, the same in the round's ``N`` records).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import importlib.util
import platform as _platform
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _core
from ..testing import runner, scene
from ..testing.scene_group import GroupCaseRun, GroupRound
from ..worker import RunReport
from ..workloads import WORKLOADS

if TYPE_CHECKING:
    from .._core import _Platform

__all__ = ["BYTES_KEYS", "PHASES", "BenchError", "BenchOptions", "bench_records", "run_metadata", "split_arm"]

#: The timed phases of a run, in order.
PHASES: tuple[str, ...] = tuple(_core.PHASES)

#: The counters that add up to the bytes moved per round.
BYTES_KEYS = ("staged_bytes", "copied_back_bytes", "mirror_refresh_bytes")

_ARM_RE = re.compile(r"^(?P<case>.*?)_?(?P<arm>Residency_\w+)$")


class BenchError(Exception):
    """A bench that cannot run as asked (unknown workload, no case selected): a usage error."""


@dataclass
class BenchOptions:
    """What a bench run was asked for (also handed to driver workloads)."""

    workload: str
    rounds: int = 1
    platform: _Platform = "sim"
    cases: list[str] | None = None
    skip_golden: bool = False
    worker_options: dict[str, Any] = field(default_factory=dict)
    manual: str = "exclude"
    devices: int | None = None

    def runner_options(self) -> runner.RunnerOptions:
        """The same request, as the case runner's options."""
        return runner.RunnerOptions(
            self.platform,
            self.rounds,
            self.cases,
            self.skip_golden,
            self.manual,
            self.worker_options,
            self.devices,
        )


def split_arm(case: Mapping[str, Any]) -> tuple[str, str]:
    """``(case, arm)`` of a scene-test case entry (see the module doc)."""
    name = case["name"]
    params = case.get("params", {}) or {}
    m = _ARM_RE.match(name)
    arm = params.get("arm") or (m.group("arm") if m else name)
    base = params.get("case") or (m.group("case") if m else name)
    return str(base or name), str(arm)


def _load_file(path: Path) -> Any:
    name = "_simpler_bench_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BenchError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))  # helper modules next to the workload file
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def _resolve(workload: str) -> tuple[Any, str]:
    """The workload's module and driver function name (``""`` for scene tests)."""
    if workload in WORKLOADS:
        return importlib.import_module(WORKLOADS[workload]), ""
    file_part, sep, fn_name = workload.rpartition(":")
    if not sep or not file_part.endswith(".py"):
        file_part, fn_name = workload, ""
    path = Path(file_part)
    if not path.is_file():
        raise BenchError(
            f"no such workload: {workload} (a scene-test file, file.py:function, or one of: "
            f"{', '.join(sorted(WORKLOADS))})"
        )
    return _load_file(path.resolve()), fn_name


def _git_commit() -> str | None:
    """The commit of the checkout this package was built from, when it is one."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_metadata() -> dict[str, Any]:
    """Provenance stamped on every record: version, commit, host, python, timestamp."""
    from .. import __version__

    return {
        "version": __version__,
        "commit": _git_commit(),
        "host": _platform.node(),
        "python": _platform.python_version(),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


# (test, case, case_name, arm, devices, who skipped the golden or None, report or failure)
Round = tuple[str, str, str, str, int, "str | None", "RunReport | GroupRound | BaseException"]


def _scene_rounds(module: Any, opts: BenchOptions, log: Any, progress: Any) -> Iterator[Round]:
    """Runs the selected cases of a scene-test module: ``(test, case, case_name, arm, devices,
    golden_skipped_by, report)``."""
    classes = runner.scene_classes(module)
    if not classes:
        raise BenchError(f"{opts.workload} defines no scene test")
    if opts.cases is None and getattr(module, "BENCH_CASES", None):
        opts = dataclasses.replace(opts, cases=list(module.BENCH_CASES))
    if (
        opts.platform == "sim"
        and "model" not in opts.worker_options
        and getattr(module, "BENCH_MODELS", None)
    ):
        opts = dataclasses.replace(
            opts, worker_options={**opts.worker_options, "model": ",".join(module.BENCH_MODELS)}
        )
    planned = runner.plan_cases(classes, opts.runner_options(), aliases=lambda c: (split_arm(c)[0],))
    if not planned:
        raise BenchError(runner.unknown_case_message(classes, opts.cases or []))
    groups: dict[tuple[type, str], list[tuple[str, int, Mapping[str, Any]]]] = {}
    for p in planned:
        if p.skip is not None:
            log(f"skip {p.label}: {p.skip}")
            continue
        base, arm = split_arm(p.case)
        n = scene.case_devices(p.cls, p.case, opts.devices)
        for devices in sorted({1, n}):  # on several devices: one device beside it
            groups.setdefault((p.cls, base), []).append((arm, devices, p.case))
    if not groups:
        raise BenchError(f"every selected case of {opts.workload} is skipped on {opts.platform} (above)")
    progress.total = sum(len(arms) for arms in groups.values()) * opts.rounds
    for (cls, base), arms in groups.items():
        yield from _interleaved_rounds(cls, base, arms, opts, log, progress)


def _interleaved_rounds(
    cls: type,
    base: str,
    arms: list[tuple[str, int, Mapping[str, Any]]],
    opts: BenchOptions,
    log: Any,
    progress: Any,
) -> Iterator[Round]:
    """The rounds of one case's arms (each on its device counts), interleaved; an arm that fails
    is reported and dropped."""
    runs: dict[tuple[str, int], tuple[scene.CaseRun | GroupCaseRun, Mapping[str, Any]]] = {}
    t0 = time.perf_counter()

    def label(case: Mapping[str, Any], devices: int) -> str:
        return f"{cls.__name__}::{case['name']}" + (f" on {devices} devices" if devices > 1 else "")

    def failed(key: tuple[str, int], case: Mapping[str, Any], e: Exception) -> Round:
        log(f"FAIL {label(case, key[1])}: {type(e).__name__}: {e}")
        return cls.__name__, base, case["name"], key[0], key[1], None, e

    try:
        for arm, devices, case in arms:
            args = (cls, case, opts.platform, opts.rounds, opts.skip_golden, opts.worker_options)
            run = scene.CaseRun(*args) if devices == 1 else GroupCaseRun(*args, devices=devices)
            runs[(arm, devices)] = (run, case)
        for key, (run, case) in list(runs.items()):
            try:
                run.start()
            except Exception as e:
                run.close(failed=True)
                del runs[key]
                progress.update(opts.rounds)
                yield failed(key, case, e)
        for r in range(opts.rounds):
            # The order rotates from round to round, so no arm always runs right after another.
            order = list(runs)
            k = r % len(order) if order else 0
            for key in order[k:] + order[:k]:
                run, case = runs[key]
                on = f" on {key[1]} devices" if key[1] > 1 else ""
                progress.set_description(f"{base} {key[0]}{on} round {r + 1}/{opts.rounds}")
                try:
                    report = run.round()
                except Exception as e:
                    run.close(failed=True)
                    del runs[key]
                    progress.update(opts.rounds - r)
                    yield failed(key, case, e)
                    continue
                progress.update(1)
                yield cls.__name__, base, case["name"], key[0], key[1], run.golden_skipped_by, report
        for key, (run, case) in list(runs.items()):
            try:
                run.finish()
            except Exception as e:
                yield failed(key, case, e)
        if runs:
            dt = time.perf_counter() - t0
            names = ", ".join(arm + (f" on {n} devices" if n > 1 else "") for arm, n in runs)
            log(f"ran  {cls.__name__}::{base} ({names}): {opts.rounds} interleaved round(s) in {dt:.1f} s")
    finally:
        for run, _case in runs.values():
            run.close(failed=True)


def _record(report: RunReport, common: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """One record: a report's dict (``RunReport.to_dict()``), the round's fields, the report's
    dispatch path, its modeled one and modeled round (with a cost model), the bytes moved and
    the provenance."""
    rec = report.to_dict()
    rec.update(common)
    rec["dispatch_ns"] = report.dispatch_ns
    if report.modeled is not None:
        rec["modeled_dispatch_ns"] = report.modeled_dispatch_ns
        rec["modeled_round_ns"] = report.modeled_round_ns
    rec["bytes_moved"] = sum(int(rec["counters"].get(k, 0)) for k in BYTES_KEYS)
    rec.update(meta)
    return rec


class _NoProgress:
    """Stands in for a tqdm bar when there is none."""

    total = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(show: bool) -> Any:
    """A tqdm bar on stderr when ``show`` and tqdm is installed (the ``progress`` extra)."""
    if not show:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=0, unit="round", file=sys.stderr, leave=False, dynamic_ncols=True)


def bench_records(
    opts: BenchOptions, log: Any = None, progress: bool | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Runs a workload; returns one record per round (see the module doc) and the failures.

    ``progress``: a progress bar on stderr (default: when stderr is a terminal and tqdm is
    installed). Raises :class:`BenchError` when the workload does not exist or selects nothing.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    module, fn_name = _resolve(opts.workload)
    meta = run_metadata()
    bar = _progress_bar(sys.stderr.isatty() if progress is None else progress)
    if fn_name:
        fn = getattr(module, fn_name, None)
        if fn is None:
            raise BenchError(f"{opts.workload}: the file has no function {fn_name}")
        test = Path(opts.workload.rpartition(":")[0]).stem
        skipped = "option" if opts.skip_golden else None
        rounds: Iterator[Round] = (
            (test, str(case), f"{case}_{arm}", str(arm), len(getattr(rep, "devices", [0])), skipped, rep)
            for case, arm, rep in fn(opts)
        )
    else:
        rounds = _scene_rounds(module, opts, log, bar)
    records: list[dict[str, Any]] = []
    failures: list[str] = []
    counter: dict[str, int] = {}
    try:
        for test, base, name, arm, devices, skipped_by, rep in rounds:
            if isinstance(rep, BaseException):
                first = (str(rep).strip().splitlines() or [""])[0]
                on = f" on {devices} devices" if devices > 1 else ""
                failures.append(f"{test}::{name}{on}: {type(rep).__name__}: {first}")
                continue
            key = f"{name}@{devices}"
            counter[key] = counter.get(key, 0) + 1
            common = dict(
                workload=opts.workload,
                test=test,
                case=base,
                case_name=name,
                arm=arm,
                round=counter[key],
                rounds=opts.rounds,
                platform=opts.platform,
                golden=skipped_by is None,
                golden_skipped_by=skipped_by,
                devices=devices,
            )
            if isinstance(rep, GroupRound):
                for i, (device, d) in enumerate(zip(rep.devices, rep.reports)):
                    rec = _record(d, common, meta)
                    rec.update(device=device, device_index=i, round_wall_ns=rep.wall_ns)
                    records.append(rec)
            else:
                records.append(_record(rep, common, meta))
    finally:
        bar.close()
    return records, failures
