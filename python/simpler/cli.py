"""The ``simpler`` command: ``simpler bench`` runs the residency arms of a workload and prints
round tables; ``simpler report`` re-prints them from a JSON-lines file.

::

    simpler bench paged_attention --rounds 5 --case B64_8K --json pa.jsonl --plot pa.png
    simpler bench examples/vector_example/test_vector_example.py --rounds 5 --case Residency_
    simpler report pa.jsonl [--plot pa.png]

**Workloads.** ``WORKLOAD`` is a path to a scene-test file, or a name in :data:`WORKLOADS`. A
registry entry is either ``"path/to/test_x.py"`` (a scene-test file, run through
:func:`simpler.run_case`) or ``"path/to/driver.py:function"`` (a driver: ``function(options)``
receives a :class:`BenchOptions` and yields ``(case, arm, RunReport)`` once per round, in round
order). Relative paths resolve against the current directory, then against the repository the
package was installed from.

**Arms.** A scene-test case belongs to arm ``params["arm"]`` when it has one, else to the
``Residency_<x>`` suffix of its name (``B64_8K_Residency_bulk`` is case ``B64_8K``, arm
``Residency_bulk``); a case with neither is an arm of its own. Arms are compared within a case;
ratios are taken against ``Residency_staged``. The arms of a case run side by side in one process,
each on its own worker, with their rounds interleaved (round 1 of every arm, then round 2, ...,
the order rotating from round to round), so drift of a shared machine hits every arm alike.

**Selection.** ``--case`` takes the runner's selectors (``Foo``, ``Class::Foo``, ``Class::``;
repeatable, comma-separated) and matches either the full case name or the case without its arm.
Without ``--case`` every non-manual case runs; a manual case runs when ``--case`` names it.
Cases whose ``platforms`` exclude ``--platform`` are skipped.

**What is timed.** Every figure comes from the run reports (``report.phases``), so it covers
only the run itself. Golden checking is on by default: the comparison happens between rounds,
outside every timed phase, and a mismatch fails the case (``--skip-golden`` turns it off).

**Tables.** Per case and arm: the first round apart (cold), then min / median / max over the
remaining (warm) rounds of each phase (``bind``, ``orchestrate``, ``execute``, ``copy_back``,
``cleanup``), of the dispatch path (every phase but execute) and of the bytes moved per round
(``staged_bytes + copied_back_bytes + mirror_refresh_bytes``). A summary gives each arm's warm
median dispatch time and its ratio to ``Residency_staged`` (and ``Residency_all /
Residency_bulk``). With ``--rounds 1`` the only round is the cold one and the ratios use it.

**JSON lines.** ``--json`` writes one object per round: :meth:`RunReport.to_dict` (``callable``,
``ok``, ``phases``, ``counters``) plus ``workload``, ``test``, ``case``, ``case_name``, ``arm``,
``round`` (1-based), ``rounds``, ``platform``, ``golden`` (checked or not), ``dispatch_ns`` and
``bytes_moved``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import scene
from .worker import RunReport

__all__ = [
    "BYTES_KEYS",
    "PHASES",
    "WORKLOADS",
    "BenchOptions",
    "bench_records",
    "format_tables",
    "main",
    "plot_records",
    "read_jsonl",
    "split_arm",
]

#: Known workloads: name -> scene-test file, or ``file:function`` for a driver (see the module doc).
WORKLOADS: dict[str, str] = {
    "paged_attention": "examples/paged_attention/test_paged_attention.py",
}

#: The timed phases of a run, in order.
PHASES = ("bind", "orchestrate", "execute", "copy_back", "cleanup")

#: The counters that add up to the bytes moved per round.
BYTES_KEYS = ("staged_bytes", "copied_back_bytes", "mirror_refresh_bytes")

#: The arm every other arm is compared with.
BASELINE = "Residency_staged"

_ARM_RE = re.compile(r"^(?P<case>.*?)_?(?P<arm>Residency_\w+)$")


@dataclass
class BenchOptions:
    """What a bench run was asked for (also handed to driver workloads)."""

    workload: str
    rounds: int = 1
    platform: str = "sim"
    cases: list[str] | None = None
    skip_golden: bool = False
    worker_options: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# running


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _resolve(path: str) -> Path:
    p = Path(path)
    for cand in (p, _repo_root() / p) if not p.is_absolute() else (p,):
        if cand.is_file():
            return cand.resolve()
    raise SystemExit(f"simpler bench: no such workload file: {path}")


def _load_module(path: Path) -> Any:
    name = "_simpler_bench_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"simpler bench: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))  # helper modules next to the workload file
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def split_arm(case: Mapping[str, Any]) -> tuple[str, str]:
    """``(case, arm)`` of a scene-test case entry (see the module doc)."""
    name = case["name"]
    params = case.get("params", {}) or {}
    m = _ARM_RE.match(name)
    arm = params.get("arm") or (m.group("arm") if m else name)
    base = params.get("case") or (m.group("case") if m else name)
    return str(base or name), str(arm)


def _selected(cls_name: str, case: Mapping[str, Any], selectors: Sequence[str] | None) -> bool:
    base, _ = split_arm(case)
    return scene.case_selected(cls_name, case["name"], selectors) or scene.case_selected(
        cls_name, base, selectors
    )


def _scene_rounds(
    module: Any, opts: BenchOptions, log: Any
) -> Iterator[tuple[str, str, str, str, RunReport | BaseException]]:
    """Runs the selected cases of a scene-test module: ``(test, case, case_name, arm, report)``.

    The arms of a case run side by side, their rounds interleaved (round 1 of every arm, then
    round 2 of every arm, ...; the order rotates from round to round), so that drift of a busy
    machine hits every arm alike.
    """
    classes = scene.scene_classes(module)
    if not classes:
        raise SystemExit(f"simpler bench: {opts.workload} defines no scene test")
    for cls in classes:
        groups: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
        for case in cls.CASES:
            if not _selected(cls.__name__, case, opts.cases):
                continue
            if case.get("manual", False) and not opts.cases:
                continue  # manual cases run only when --case names them
            reason = scene.case_skip_reason(case, opts.platform, "include")
            if reason is not None:
                log(f"skip {cls.__name__}::{case['name']}: {reason}")
                continue
            base, arm = split_arm(case)
            groups.setdefault(base, []).append((arm, case))
        for base, arms in groups.items():
            yield from _interleaved_rounds(cls, base, arms, opts, log)


def _interleaved_rounds(
    cls: type, base: str, arms: list[tuple[str, Mapping[str, Any]]], opts: BenchOptions, log: Any
) -> Iterator[tuple[str, str, str, str, RunReport | BaseException]]:
    """The rounds of one case's arms, interleaved; an arm that fails is reported and dropped."""
    runs: dict[str, tuple[scene.CaseRun, Mapping[str, Any]]] = {}
    t0 = time.perf_counter()
    try:
        for arm, case in arms:
            run = scene.CaseRun(cls, case, opts.platform, opts.rounds, opts.skip_golden, opts.worker_options)
            runs[arm] = (run, case)
        for arm, (run, case) in list(runs.items()):
            try:
                run.start()
            except Exception as e:
                log(f"FAIL {cls.__name__}::{case['name']}: {type(e).__name__}: {e}")
                run.close(failed=True)
                del runs[arm]
                yield cls.__name__, base, case["name"], arm, e
        for r in range(opts.rounds):
            # The order rotates from round to round, so no arm always runs right after another.
            order = list(runs)
            k = r % len(order) if order else 0
            for arm in order[k:] + order[:k]:
                run, case = runs[arm]
                try:
                    report = run.round()
                except Exception as e:
                    log(f"FAIL {cls.__name__}::{case['name']}: {type(e).__name__}: {e}")
                    run.close(failed=True)
                    del runs[arm]
                    yield cls.__name__, base, case["name"], arm, e
                    continue
                yield cls.__name__, base, case["name"], arm, report
        for arm, (run, case) in list(runs.items()):
            try:
                run.finish()
            except Exception as e:
                log(f"FAIL {cls.__name__}::{case['name']}: {type(e).__name__}: {e}")
                yield cls.__name__, base, case["name"], arm, e
        dt = time.perf_counter() - t0
        if runs:
            names = ", ".join(arm for arm in runs)
            log(f"ran  {cls.__name__}::{base} ({names}): {opts.rounds} interleaved round(s) in {dt:.1f} s")
    finally:
        for run, _case in runs.values():
            run.close(failed=True)


def _driver_rounds(
    path: Path, fn_name: str, opts: BenchOptions
) -> Iterator[tuple[str, str, str, str, RunReport | BaseException]]:
    module = _load_module(path)
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise SystemExit(f"simpler bench: {path} has no function {fn_name}")
    for case, arm, report in fn(opts):
        yield path.stem, str(case), f"{case}_{arm}", str(arm), report


def bench_records(opts: BenchOptions, log: Any = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Runs a workload; returns one record per round (the JSON-lines objects) and the failures."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    target = WORKLOADS.get(opts.workload, opts.workload)
    file_part, sep, fn_name = target.rpartition(":")
    if not sep or not file_part.endswith(".py"):  # a plain scene-test path
        file_part, fn_name = target, ""
    path = _resolve(file_part)
    if fn_name:
        rounds = _driver_rounds(path, fn_name, opts)
    else:
        rounds = _scene_rounds(_load_module(path), opts, log)
    records: list[dict[str, Any]] = []
    failures: list[str] = []
    counter: dict[str, int] = {}
    for test, base, name, arm, rep in rounds:
        if isinstance(rep, BaseException):
            first = (str(rep).strip().splitlines() or [""])[0]
            failures.append(f"{test}::{name}: {type(rep).__name__}: {first}")
            continue
        counter[name] = counter.get(name, 0) + 1
        rec = rep.to_dict()
        rec.update(
            workload=opts.workload,
            test=test,
            case=base,
            case_name=name,
            arm=arm,
            round=counter[name],
            rounds=opts.rounds,
            platform=opts.platform,
            golden=not opts.skip_golden,
            dispatch_ns=rep.dispatch_ns,
            bytes_moved=sum(int(rep.counters.get(k, 0)) for k in BYTES_KEYS),
        )
        records.append(rec)
    if not records and not failures:
        raise SystemExit(f"simpler bench: no case of {opts.workload} selected")
    return records, failures


# ---------------------------------------------------------------------------------------------
# tables


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file written by ``simpler bench --json``."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"simpler report: {path}:{i}: not JSON ({e})") from None
    return out


def _group(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, list[Mapping]]]:
    groups: dict[tuple[str, str, str], dict[str, list[Mapping]]] = {}
    for r in records:
        key = (str(r.get("workload", "")), str(r.get("test", "")), str(r.get("case", "")))
        groups.setdefault(key, {}).setdefault(str(r.get("arm", "")), []).append(r)
    for arms in groups.values():
        for rs in arms.values():
            rs.sort(key=lambda r: r.get("round", 0))
    return groups


def _dispatch(r: Mapping[str, Any]) -> float:
    return float(r.get("dispatch_ns", sum(v for k, v in r["phases"].items() if k != "execute")))


def _bytes(r: Mapping[str, Any]) -> float:
    return float(r.get("bytes_moved", sum(int(r["counters"].get(k, 0)) for k in BYTES_KEYS)))


def _series(rs: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {p: [float(r["phases"].get(p, 0)) for r in rs] for p in PHASES}
    rows["args"] = [rows["bind"][i] + rows["copy_back"][i] + rows["cleanup"][i] for i in range(len(rs))]
    rows["dispatch"] = [_dispatch(r) for r in rs]
    rows["bytes/round"] = [_bytes(r) for r in rs]
    return rows


def _table_rows(rs: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    rows = _series(rs)
    del rows["args"]
    return rows


def _fmt_bytes(b: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def _warm_median(xs: list[float]) -> float:
    return statistics.median(xs[1:]) if len(xs) > 1 else xs[0]


def _warm_min(xs: list[float]) -> float:
    return min(xs[1:]) if len(xs) > 1 else xs[0]


def _ratios(d: Mapping[str, float]) -> list[str]:
    """``Residency_bulk / Residency_staged`` and ``Residency_all / Residency_bulk`` of ``d``."""
    out = []
    if d.get(BASELINE) and "Residency_bulk" in d:
        out.append(f"Residency_bulk / Residency_staged = {d['Residency_bulk'] / d[BASELINE]:.3f}")
    if d.get("Residency_bulk") and "Residency_all" in d:
        out.append(f"Residency_all / Residency_bulk = {d['Residency_all'] / d['Residency_bulk']:.3f}")
    return out


def format_tables(records: Iterable[Mapping[str, Any]]) -> str:
    """The round tables and the ratio summary of bench records (what ``bench``/``report`` print)."""
    lines: list[str] = []
    for (workload, test, case), arms in _group(records).items():
        any_r = next(iter(arms.values()))[0]
        n = max(len(rs) for rs in arms.values())
        golden = "golden checked" if any_r.get("golden", True) else "golden skipped"
        head = f"{workload} :: {test}::{case}" if test else f"{workload} :: {case}"
        lines.append(f"== {head} ({any_r.get('platform', '?')}, {n} round(s), {golden}) ==")
        peak = max(max(_series(rs)["dispatch"] + _series(rs)["execute"]) for rs in arms.values())
        unit, div = ("ms", 1e6) if peak >= 1e7 else ("us", 1e3)
        lines.append(
            f"{'arm':<18} {'':<12} {'cold':>11} {'min':>11} {'median':>11} {'max':>11}"
            + (f"   ({unit}; min/median/max over rounds 2..{n})" if n > 1 else f"   ({unit}; one round)")
        )
        for arm, rs in arms.items():
            for i, (row, xs) in enumerate(_table_rows(rs).items()):
                label = arm if i == 0 else ""
                if row == "bytes/round":
                    cells = [_fmt_bytes(xs[0])]
                    warm = xs[1:]
                    cells += (
                        [_fmt_bytes(f(warm)) for f in (min, statistics.median, max)] if warm else ["-"] * 3
                    )
                else:
                    cells = [f"{xs[0] / div:.3f}"]
                    warm = xs[1:]
                    cells += (
                        [f"{f(warm) / div:.3f}" for f in (min, statistics.median, max)] if warm else ["-"] * 3
                    )
                lines.append(f"{label:<18} {row:<12} " + " ".join(f"{c:>11}" for c in cells))
        basis = "warm median" if n > 1 else "the single (cold) round"
        lines.append(f"summary ({basis}): dispatch = every phase but execute;")
        lines.append("  args = bind + copy_back + cleanup (the dispatch path without orchestrate)")
        d_head, e_head = f"dispatch {unit}", f"execute {unit}"
        a_head = f"args {unit}"
        lines.append(
            f"  {'arm':<18} {d_head:>13} {'vs staged':>10} {a_head:>11} {'vs staged':>10} {e_head:>13} "
            f"{'bytes/round':>12}"
        )
        disp = {arm: _warm_median(_series(rs)["dispatch"]) for arm, rs in arms.items()}
        args = {arm: _warm_median(_series(rs)["args"]) for arm, rs in arms.items()}
        base, args_base = disp.get(BASELINE), args.get(BASELINE)
        for arm, rs in arms.items():
            s = _series(rs)
            ratio = f"{disp[arm] / base:.2f}x" if base else "-"
            a_ratio = f"{args[arm] / args_base:.3f}x" if args_base else "-"
            lines.append(
                f"  {arm:<18} {disp[arm] / div:>13.3f} {ratio:>10} {args[arm] / div:>11.3f} {a_ratio:>10} "
                f"{_warm_median(s['execute']) / div:>13.3f} {_fmt_bytes(_warm_median(s['bytes/round'])):>12}"
            )
        best = {arm: _warm_min(_series(rs)["dispatch"]) for arm, rs in arms.items()}
        for label, d in (("dispatch ratios", disp), ("on the best warm round", best)):
            ratios = _ratios(d)
            if ratios:
                lines.append(f"  {label}: " + "; ".join(ratios))
        lines.append("")
    return "\n".join(lines)


def plot_records(records: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Draws per-round dispatch time per arm (one panel per case) into ``path``.

    Needs matplotlib (``pip install 'simpler[plot]'``); raises ``SystemExit`` naming it when missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise SystemExit(
            "simpler: --plot needs matplotlib, which is not installed (pip install 'simpler[plot]')"
        ) from None
    groups = _group(records)
    fig, axes = plt.subplots(len(groups), 1, figsize=(7, 3.2 * len(groups)), squeeze=False)
    for ax, ((workload, _test, case), arms) in zip(axes[:, 0], groups.items()):
        for arm, rs in arms.items():
            ax.plot(
                [r.get("round", i + 1) for i, r in enumerate(rs)],
                [_dispatch(r) / 1e6 for r in rs],
                "o-",
                label=arm,
            )
        ax.set_title(f"{workload} :: {case}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("dispatch path (ms)")
        ax.set_yscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# command line


def _write_jsonl(records: Iterable[Mapping[str, Any]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="simpler", description="Benchmark residency arms and print round tables."
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="run the arms of a workload for N rounds and print round tables")
    b.add_argument(
        "workload",
        help=f"a scene-test file, or a known workload: {', '.join(sorted(WORKLOADS))}",
    )
    b.add_argument("--rounds", type=scene.parse_rounds, default=5, help="rounds per arm (default 5)")
    b.add_argument(
        "--case",
        action="append",
        default=None,
        help="cases to run ('Foo', 'Class::Foo', 'Class::'; with or without the arm suffix); "
        "default: every non-manual case",
    )
    b.add_argument("-p", "--platform", default="sim", help="sim, ascend or cuda (default sim)")
    b.add_argument(
        "--svm", type=scene.parse_svm, default=None, help="sim map_host policy: always, never or min bytes"
    )
    b.add_argument("--staging", choices=("arena", "fresh"), default=None, help="staging path (default arena)")
    b.add_argument("--skip-golden", action="store_true", help="do not check outputs (checked by default)")
    b.add_argument("--json", metavar="OUT.jsonl", help="write every round's report as JSON lines")
    b.add_argument(
        "--plot", metavar="OUT.png", help="plot per-round dispatch time per arm (needs matplotlib)"
    )
    r = sub.add_parser("report", help="re-print the tables of a JSON-lines file from 'simpler bench --json'")
    r.add_argument("jsonl", help="the JSON-lines file")
    r.add_argument(
        "--plot", metavar="OUT.png", help="plot per-round dispatch time per arm (needs matplotlib)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simpler`` console script; returns the exit status."""
    ns = _parser().parse_args(argv)
    if ns.command == "report":
        records = read_jsonl(ns.jsonl)
        if not records:
            print(f"simpler report: {ns.jsonl} holds no records", file=sys.stderr)
            return 1
        print(format_tables(records))
        if ns.plot:
            plot_records(records, ns.plot)
            print(f"plot written to {ns.plot}")
        return 0
    if ns.plot and importlib.util.find_spec("matplotlib") is None:  # fail before the run, not after
        print(
            "simpler: --plot needs matplotlib, which is not installed (pip install 'simpler[plot]')",
            file=sys.stderr,
        )
        return 2
    opts = BenchOptions(
        workload=ns.workload,
        rounds=ns.rounds,
        platform=ns.platform,
        cases=ns.case,
        skip_golden=ns.skip_golden,
        worker_options=scene.worker_options(ns.svm, ns.staging),
    )
    records, failures = bench_records(opts)
    if ns.json:
        _write_jsonl(records, ns.json)
    if records:
        print(format_tables(records))
    if ns.json:
        print(f"{len(records)} round report(s) written to {ns.json}")
    if ns.plot and records:
        plot_records(records, ns.plot)
        print(f"plot written to {ns.plot}")
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
