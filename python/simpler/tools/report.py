"""Bench records as tables: the round tables of one run, two runs side by side, and a plot.

**Tables** (:func:`format_tables`). Per case and arm: the first round apart (cold), then min /
median / max and the spread (``(max - min) / median`` over the warm rounds) of each phase
(``bind``, ``orchestrate``, ``execute``, ``copy_back``, ``cleanup``), of the dispatch path (every
phase but execute) and of the bytes moved per round (``staged_bytes + copied_back_bytes +
mirror_refresh_bytes``). A summary gives each arm's warm median dispatch time and its ratio to
``Residency_staged`` (and ``Residency_all / Residency_bulk``), also on each arm's best warm
round. With one round the only round is the cold one and the ratios use it.

**Several devices** (``simpler bench --devices N``): after a case's one-device tables, its
tables on ``N`` devices: per device, the whole round (the group round's wall time), and the
dispatch ratios of the arms on ``N`` devices beside the one-device ones
(:mod:`simpler.tools.report_devices`).

**Comparison** (:func:`format_compare`): two runs of the same workload, per case, arm and row,
the warm medians side by side and the ratio ``b / a`` (the way pytest-benchmark's
``--benchmark-compare`` reads), with each run's provenance (version, commit, host, time).
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import report_devices
from .bench import BYTES_KEYS, PHASES
from .report_format import (
    BASELINE,
    arm_ratios,
    fmt_bytes,
    fmt_ratio,
    golden_note,
    spread,
    warm_median,
    warm_min,
)

__all__ = [
    "MODEL_ROWS",
    "ReportError",
    "format_compare",
    "format_model_comparison",
    "format_tables",
    "golden_note",
    "model_comparison",
    "plot_records",
    "read_jsonl",
]

#: The rows of the measured-vs-modeled table: every phase, the dispatch path (every phase but
#: execute) and the whole round.
MODEL_ROWS: tuple[str, ...] = (*PHASES, "dispatch", "round")

#: The record keys every bench record has (a file without them is not a bench file).
_REQUIRED = ("phases", "counters", "arm", "case", "dispatch_ns")


class ReportError(Exception):
    """A records file that cannot be read (missing, not JSON lines, not bench records)."""


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file written by ``simpler bench --json``.

    Raises :class:`ReportError` naming the file (and line) when it is missing, unreadable, not
    JSON lines, or holds something other than bench records.
    """
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(
                        line, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int
                    )
                except _BadNumber as e:
                    raise ReportError(f"{path}:{i}: not a bench record ({e})") from None
                except json.JSONDecodeError as e:
                    raise ReportError(f"{path}:{i}: not JSON ({e.msg})") from None
                except RecursionError:
                    raise ReportError(f"{path}:{i}: not a bench record (nested too deeply)") from None
                missing = [k for k in _REQUIRED if not isinstance(rec, dict) or k not in rec]
                if missing:
                    raise ReportError(
                        f"{path}:{i}: not a bench record (no {', '.join(missing)}); "
                        "expected the output of 'simpler bench --json'"
                    )
                wrong = _wrong_types(rec)
                if wrong:
                    raise ReportError(f"{path}:{i}: not a bench record ({wrong})")
                out.append(rec)
    except OSError as e:
        raise ReportError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a text file") from None
    if not out:
        raise ReportError(f"{path} holds no records")
    return out


class _BadNumber(ValueError):
    """A number no bench record holds (NaN, an infinity, an integer past 64 bits)."""


def _no_constant(name: str) -> Any:
    raise _BadNumber(f"{name}: a bench record holds finite numbers")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _BadNumber(f"{text}: a bench record holds finite numbers")
    return v


#: The largest magnitude of an integer in a record (counters and times are 64-bit).
_INT_LIMIT = 2**64


def _bounded_int(text: str) -> int:
    # Checked on the digits first: Python refuses to convert more than 4,300 of them.
    if len(text.lstrip("-")) > 20 or abs(int(text)) >= _INT_LIMIT:
        raise _BadNumber(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is past 2**64")
    return int(text)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _numbers(table: object) -> bool:
    return isinstance(table, dict) and all(_is_number(v) for v in table.values())


def _wrong_types(rec: Mapping[str, Any]) -> str | None:
    """What in a record that has the required keys has the wrong type, or ``None``."""
    for key in ("phases", "counters"):
        table = rec[key]
        if not _numbers(table):
            return f"'{key}' must map names to numbers, not {type(table).__name__} {table!r:.60}"
    for key in ("arm", "case"):
        if not isinstance(rec[key], str):
            return f"'{key}' must be a string, not {type(rec[key]).__name__}"
    if not _is_number(rec["dispatch_ns"]):
        return f"'dispatch_ns' must be a number, not {type(rec['dispatch_ns']).__name__}"
    for key in ("round", "rounds", "devices", "device_index", "round_wall_ns", "bytes_moved"):
        if key in rec and not _is_number(rec[key]):
            return f"'{key}' must be a number, not {type(rec[key]).__name__}"
    if "device" in rec and not _is_int(rec["device"]):
        d = rec["device"]
        return f"'device' must be a device id (an int), not {type(d).__name__} {d!r:.40}"
    if "modeled" in rec and rec["modeled"] is not None and not _numbers(rec["modeled"]):
        return f"'modeled' must map phases to numbers, not {type(rec['modeled']).__name__}"
    by = rec.get("modeled_by")
    if by is not None and not isinstance(by, str):
        if not isinstance(by, dict) or not all(_numbers(m) for m in by.values()):
            return f"'modeled_by' must map models to phases and numbers, not {type(by).__name__} {by!r:.60}"
    return None


def _group(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, list[Mapping]]]:
    """The one-device records: (workload, test, case) -> arm -> records in round order."""
    groups: dict[tuple[str, str, str], dict[str, list[Mapping]]] = {}
    for r in records:
        if "device_index" in r:
            continue  # one device's record of a round on several: simpler.tools.report_devices
        key = (str(r.get("workload", "")), str(r.get("test", "")), str(r.get("case", "")))
        groups.setdefault(key, {}).setdefault(str(r.get("arm", "")), []).append(r)
    for arms in groups.values():
        for rs in arms.values():
            rs.sort(key=lambda r: r.get("round", 0))
    return groups


def _dispatch(r: Mapping[str, Any]) -> float:
    return float(r["dispatch_ns"])


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


def _row_value(phases: Mapping[str, Any], row: str) -> float:
    """Phase ``row`` of a phases dict, or the dispatch path, or the round."""
    if row == "dispatch":
        return float(sum(v for k, v in phases.items() if k != "execute"))
    if row == "round":
        return float(sum(phases.values()))
    return float(phases.get(row, 0))


def _modeled_by(r: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A record's modeled phases by model (records of older versions name one model)."""
    by = r.get("modeled_by")
    if isinstance(by, dict):
        return by
    if isinstance(by, str) and isinstance(r.get("modeled"), dict):
        return {by: r["modeled"]}
    return {}


def model_comparison(
    measured: Iterable[Mapping[str, Any]], modeled: Iterable[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Measured beside modeled: per case, arm and row (:data:`MODEL_ROWS`), the warm median of
    the ``measured`` records' phases and, per cost model, the warm median of the ``modeled``
    records' modeled phases (the same records by default: a sim run measured and priced at
    once), with ``ratio`` = measured / modeled (the model's accuracy where the measured side is
    a device). Cases and arms without modeled records are left out."""
    measured = list(measured)
    by_key = _group(measured if modeled is None else modeled)
    out: list[dict[str, Any]] = []
    for key, arms in _group(measured).items():
        for arm, rs in arms.items():
            ms = by_key.get(key, {}).get(arm, [])
            models = list(dict.fromkeys(m for r in ms for m in _modeled_by(r)))
            for row in MODEL_ROWS if models else ():
                meas = warm_median([_row_value(r["phases"], row) for r in rs])
                mod = {
                    m: warm_median([_row_value(_modeled_by(r)[m], row) for r in ms if m in _modeled_by(r)])
                    for m in models
                }
                out.append(
                    {
                        "workload": key[0],
                        "test": key[1],
                        "case": key[2],
                        "arm": arm,
                        "row": row,
                        "measured_ns": meas,
                        "modeled_ns": mod,
                        "ratio": {m: (meas / v if v else None) for m, v in mod.items()},
                    }
                )
    return out


def format_model_comparison(
    measured: Iterable[Mapping[str, Any]],
    modeled: Iterable[Mapping[str, Any]] | None = None,
    measured_on: str = "sim",
) -> str:
    """:func:`model_comparison` as a table per case: per arm and row, measured and each model's
    figure (warm medians, us) with the ratio measured / modeled."""
    rows = model_comparison(measured, modeled)
    lines: list[str] = []
    for case in dict.fromkeys((r["workload"], r["test"], r["case"]) for r in rows):
        sel = [r for r in rows if (r["workload"], r["test"], r["case"]) == case]
        models = list(sel[0]["modeled_ns"])
        lines.append(
            f"  measured ({measured_on}) beside modeled, warm median, us; ratio = measured / modeled:"
        )
        head = f"  {'arm':<18} {'':<12} {'measured':>12}"
        for m in models:
            head += f" {m:>12} {'ratio':>8}"
        lines.append(head)
        last_arm = None
        for r in sel:
            label = r["arm"] if r["arm"] != last_arm else ""
            last_arm = r["arm"]
            line = f"  {label:<18} {r['row']:<12} {r['measured_ns'] / 1e3:>12.1f}"
            for m in models:
                line += f" {r['modeled_ns'][m] / 1e3:>12.1f} {fmt_ratio(r['ratio'][m]):>8}"
            lines.append(line)
    return "\n".join(lines)


def _tasks_lines(arms: Mapping[str, list[Mapping[str, Any]]]) -> list[str]:
    """Tasks and submits per round (the last round of each arm; once when every arm agrees), and
    the callable's note on what it counts (:data:`PUBLISHED_ARMS`' module's ``TASKS_NOTE``)."""
    per_arm = {
        arm: (
            int(rs[-1].get("counters", {}).get("tasks", 0)),
            int(rs[-1].get("counters", {}).get("submits", 0)),
        )
        for arm, rs in arms.items()
    }
    if not any(t for t, _ in per_arm.values()):
        return []
    if len(set(per_arm.values())) == 1:
        tasks, submits = next(iter(per_arm.values()))
        text = f"  tasks per round: {tasks:,} in {submits:,} submit(s), every arm"
    else:
        text = "  tasks per round: " + "; ".join(
            f"{a} {t:,} in {s:,} submit(s)" for a, (t, s) in per_arm.items()
        )
    lines = [text]
    entry = PUBLISHED_ARMS.get(str(next(iter(arms.values()))[0].get("callable", "")))
    note = getattr(importlib.import_module(entry[0]), "TASKS_NOTE", None) if entry else None
    if note:
        lines.append(f"    ({note})")
    return lines


#: Published per-arm figures to set beside a callable's arms: callable name -> (module, attribute,
#: what they are). The attribute maps arm -> (low, high) in ms.
PUBLISHED_ARMS = {
    "paged_attention_unroll": (
        "simpler.workloads.paged_attention_unroll",
        "PUBLISHED_CHIP_RUN_MS",
        "the warm chip.run upstream published for its unrolled paged attention on an A2/A3 card",
    ),
}


def _published(callable_name: str) -> tuple[dict[str, tuple[float, float]], str] | None:
    entry = PUBLISHED_ARMS.get(callable_name)
    if entry is None:
        return None
    module, attr, what = entry
    return getattr(importlib.import_module(module), attr), what


def _range_ratio(num: tuple[float, float], den: tuple[float, float]) -> tuple[float, float]:
    return num[0] / den[1], num[1] / den[0]


def published_lines(arms: Mapping[str, list[Mapping[str, Any]]]) -> list[str]:
    """Beside a case's arms, the published figures of its callable (:data:`PUBLISHED_ARMS`): their
    ratios between the arms, each cost model's ratios of the modeled round (dispatch + execute,
    warm median) for the same arms, and a sentence on why they differ: what the staged arm moves
    per round and what the published staged arm's extra time could move at the modeled rate."""
    any_r = next(iter(arms.values()))[0]
    pub = _published(str(any_r.get("callable", "")))
    if pub is None or not all(a in arms for a in (BASELINE, "Residency_bulk", "Residency_all")):
        return []
    ms, what = pub
    lines = [f"  {what} (ms): " + ", ".join(f"{a} {lo:.3f}-{hi:.3f}" for a, (lo, hi) in ms.items())]
    seed = {
        "Residency_bulk / Residency_staged": _range_ratio(ms["Residency_bulk"], ms[BASELINE]),
        "Residency_all / Residency_bulk": _range_ratio(ms["Residency_all"], ms["Residency_bulk"]),
    }
    lines.append("    its ratios: " + "; ".join(f"{k} = {lo:.3f}-{hi:.3f}" for k, (lo, hi) in seed.items()))
    group = [r for rs in arms.values() for r in rs]
    for model in dict.fromkeys(m for r in group for m in _modeled_by(r)):
        if not all(model in _modeled_by(r) for r in group):
            continue
        rnd = {
            arm: warm_median([sum(_modeled_by(r)[model].values()) for r in rs]) for arm, rs in arms.items()
        }
        bind = warm_median([_modeled_by(r)[model].get("bind", 0) for r in arms[BASELINE]])
        bulk_bind = warm_median([_modeled_by(r)[model].get("bind", 0) for r in arms["Residency_bulk"]])
        ours = {
            "Residency_bulk / Residency_staged": rnd["Residency_bulk"] / rnd[BASELINE],
            "Residency_all / Residency_bulk": rnd["Residency_all"] / rnd["Residency_bulk"],
        }
        lines.append(
            f"    modeled round ratios ({model}; round = dispatch + execute): "
            + "; ".join(f"{k} = {v:.3f}" for k, v in ours.items())
        )
        staged = warm_median([float(r.get("counters", {}).get("staged_bytes", 0)) for r in arms[BASELINE]])
        bulk_staged = warm_median(
            [float(r.get("counters", {}).get("staged_bytes", 0)) for r in arms["Residency_bulk"]]
        )
        extra = staged - bulk_staged
        rate = extra / (bind - bulk_bind) if bind > bulk_bind else 0.0  # bytes per ns = GB/s
        seed_extra = (ms[BASELINE][0] - ms["Residency_bulk"][1], ms[BASELINE][1] - ms["Residency_bulk"][0])
        lo_b, hi_b = seed_extra[0] * 1e6 * rate, seed_extra[1] * 1e6 * rate
        why = (
            f"    why: our staged arm uploads {fmt_bytes(extra)} more per round than bulk residency "
            f"({(bind - bulk_bind) / 1e6:.2f} ms of bind on {model}, {rate:.1f} GB/s); the published staged "
            f"arm is only {seed_extra[0]:.3f}-{seed_extra[1]:.3f} ms slower than its bulk arm, the time of "
            f"{fmt_bytes(lo_b)}-{fmt_bytes(hi_b)} at that rate, so it did not re-upload what ours does "
            "(the KV caches), and bulk / staged differs by that."
        )
        lo, hi = seed["Residency_all / Residency_bulk"]
        r_all = ours["Residency_all / Residency_bulk"]
        where = "inside" if lo <= r_all <= hi else ("below" if r_all < lo else "above")
        why += (
            f" all / bulk ({r_all:.3f}) is {where} the published range: the arms differ only in how "
            "block_table and context_lens reach the orchestrator (a host view instead of a staged "
            "upload), small beside the device round."
        )
        lines.append(why)
    if len(lines) == 2:
        lines.append("    (price the rounds with --model ascend-a3 for the modeled ratios beside these)")
    return lines


def format_tables(records: Iterable[Mapping[str, Any]]) -> str:
    """The round tables and the ratio summary of bench records (what ``bench``/``report`` print):
    per case, its one-device tables, then its tables on each larger device count."""
    records = list(records)
    single, multi = _group(records), report_devices.group_devices(records)
    lines: list[str] = []
    for key in dict.fromkeys(
        (str(r.get("workload", "")), str(r.get("test", "")), str(r.get("case", ""))) for r in records
    ):
        if key in single:
            lines += _case_tables(key, single[key])
        for mkey, arms in multi.items():
            if mkey[:3] == key:
                lines += report_devices.format_device_tables(mkey, arms, single.get(key, {}))
    return "\n".join(lines)


def _case_tables(key: tuple[str, str, str], arms: Mapping[str, list[Mapping[str, Any]]]) -> list[str]:
    """The one-device tables of one case."""
    workload, test, case = key
    lines: list[str] = []
    any_r = next(iter(arms.values()))[0]
    n = max(len(rs) for rs in arms.values())
    golden = golden_note(arms)
    head = f"{workload} :: {test}::{case}" if test else f"{workload} :: {case}"
    lines.append(f"== {head} ({any_r.get('platform', '?')}, {n} round(s), {golden}) ==")
    peak = max(max(_series(rs)["dispatch"] + _series(rs)["execute"]) for rs in arms.values())
    unit, div = ("ms", 1e6) if peak >= 1e7 else ("us", 1e3)
    lines.append(
        f"{'arm':<18} {'':<12} {'cold':>11} {'min':>11} {'median':>11} {'max':>11} {'spread':>8}"
        + (f"   ({unit}; warm rounds 2..{n})" if n > 1 else f"   ({unit}; one round)")
    )
    for arm, rs in arms.items():
        for i, (row, xs) in enumerate(_table_rows(rs).items()):
            label = arm if i == 0 else ""
            if row == "bytes/round":
                cells = [fmt_bytes(xs[0])]
                warm = xs[1:]
                cells += [fmt_bytes(f(warm)) for f in (min, statistics.median, max)] if warm else ["-"] * 3
            else:
                cells = [f"{xs[0] / div:.3f}"]
                warm = xs[1:]
                cells += (
                    [f"{f(warm) / div:.3f}" for f in (min, statistics.median, max)] if warm else ["-"] * 3
                )
            spread_txt = spread(warm)
            lines.append(
                f"{label:<18} {row:<12} " + " ".join(f"{c:>11}" for c in cells) + f" {spread_txt:>8}"
            )
    basis = "warm median" if n > 1 else "the single (cold) round"
    lines.append(f"summary ({basis}): dispatch = every phase but execute;")
    lines.append("  args = bind + copy_back + cleanup (the dispatch path without orchestrate)")
    d_head, e_head = f"dispatch {unit}", f"execute {unit}"
    a_head = f"args {unit}"
    lines.append(
        f"  {'arm':<18} {d_head:>13} {'vs staged':>10} {a_head:>11} {'vs staged':>10} {e_head:>13} "
        f"{'bytes/round':>12}"
    )
    disp = {arm: warm_median(_series(rs)["dispatch"]) for arm, rs in arms.items()}
    args = {arm: warm_median(_series(rs)["args"]) for arm, rs in arms.items()}
    base, args_base = disp.get(BASELINE), args.get(BASELINE)
    for arm, rs in arms.items():
        s = _series(rs)
        ratio = f"{disp[arm] / base:.2f}x" if base else "-"
        a_ratio = f"{args[arm] / args_base:.3f}x" if args_base else "-"
        lines.append(
            f"  {arm:<18} {disp[arm] / div:>13.3f} {ratio:>10} {args[arm] / div:>11.3f} {a_ratio:>10} "
            f"{warm_median(s['execute']) / div:>13.3f} {fmt_bytes(warm_median(s['bytes/round'])):>12}"
        )
    lines += _tasks_lines(arms)
    best = {arm: warm_min(_series(rs)["dispatch"]) for arm, rs in arms.items()}
    for label, d in (("dispatch ratios", disp), ("on the best warm round", best)):
        ratios = arm_ratios(d)
        if ratios:
            lines.append(f"  {label}: " + "; ".join(ratios))
    group = [r for rs in arms.values() for r in rs]
    for model in dict.fromkeys(m for r in group for m in _modeled_by(r)):
        modeled = {
            arm: warm_median([_row_value(_modeled_by(r)[model], "dispatch") for r in rs])
            for arm, rs in arms.items()
            if all(model in _modeled_by(r) for r in rs)
        }
        ratios = arm_ratios(modeled)
        if ratios:
            lines.append(f"  modeled dispatch ratios ({model}): " + "; ".join(ratios))
    lines += published_lines(arms)
    table = format_model_comparison(group, measured_on=str(any_r.get("platform", "sim")))
    if table:
        lines.append(table)
    lines.append("")
    return lines


def plot_records(records: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Draws per-round dispatch time per arm (one panel per case) into ``path``.

    Needs matplotlib (``pip install 'simpler-residency[plot]'``); raises ``ReportError`` naming
    it when missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator, ScalarFormatter
    except ImportError:
        raise ReportError(
            "--plot needs matplotlib, which is not installed (pip install 'simpler-residency[plot]')"
        ) from None
    groups = _group([*records, *report_devices.round_records(records)])
    fig, axes = plt.subplots(len(groups), 1, figsize=(7, 3.2 * len(groups)), squeeze=False)
    for ax, ((workload, _test, case), arms) in zip(axes[:, 0], groups.items()):
        peak = max(_dispatch(r) for rs in arms.values() for r in rs)
        unit, div = ("ms", 1e6) if peak >= 1e6 else ("us", 1e3)
        for arm, rs in arms.items():
            ax.plot(
                [r.get("round", i + 1) for i, r in enumerate(rs)],
                [_dispatch(r) / div for r in rs],
                "o-",
                label=arm,
            )
        ax.set_title(f"{workload} :: {case}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(f"dispatch path ({unit})")
        ax.set_yscale("log")
        # Plain numbers on the log axis (not 6x10^-1), at minor ticks too.
        for axis in (ax.yaxis,):
            fmt = ScalarFormatter()
            fmt.set_scientific(False)
            axis.set_major_formatter(fmt)
            axis.set_minor_formatter(ScalarFormatter())
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _provenance(records: Sequence[Mapping[str, Any]]) -> str:
    r = records[0]
    parts = [f"simpler {r.get('version', '?')}"]
    if r.get("commit"):
        parts.append(f"commit {r['commit']}")
    parts += [f"host {r.get('host', '?')}", str(r.get("timestamp", "?")), str(r.get("platform", "?"))]
    return ", ".join(parts)


def format_compare(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], names: Sequence[str]
) -> str:
    """Two runs side by side: per case, arm and row, the warm medians of run ``a`` and run ``b``
    and the ratio ``b / a`` (below 1: ``b`` is faster / moves less)."""
    ga, gb = _group([*a, *report_devices.round_records(a)]), _group([*b, *report_devices.round_records(b)])
    lines = [f"a = {names[0]} ({_provenance(a)})", f"b = {names[1]} ({_provenance(b)})", ""]
    for key in [k for k in ga if k in gb] + [k for k in gb if k not in ga]:
        workload, test, case = key
        head = f"{workload} :: {test}::{case}" if test else f"{workload} :: {case}"
        if key not in ga or key not in gb:
            lines.append(f"== {head}: only in {'b' if key not in ga else 'a'} ==")
            lines.append("")
            continue
        lines.append(f"== {head} (warm medians) ==")
        lines.append(f"{'arm':<18} {'':<12} {'a':>12} {'b':>12} {'b / a':>8}")
        arms_a, arms_b = ga[key], gb[key]
        for arm in [x for x in arms_a if x in arms_b]:
            sa, sb = _table_rows(arms_a[arm]), _table_rows(arms_b[arm])
            for i, row in enumerate(sa):
                ma, mb = warm_median(sa[row]), warm_median(sb[row])
                ratio = f"{mb / ma:.2f}x" if ma else "-"
                if row == "bytes/round":
                    ca, cb = fmt_bytes(ma), fmt_bytes(mb)
                else:
                    ca, cb = f"{ma / 1e3:.1f} us", f"{mb / 1e3:.1f} us"
                lines.append(f"{arm if i == 0 else '':<18} {row:<12} {ca:>12} {cb:>12} {ratio:>8}")
        for arm in [x for x in arms_a if x not in arms_b] + [x for x in arms_b if x not in arms_a]:
            lines.append(f"{arm:<18} only in {'a' if arm in arms_a else 'b'}")
        lines.append("")
    return "\n".join(lines)
