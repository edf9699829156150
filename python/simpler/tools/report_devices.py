"""Bench records of cases run on several devices, as tables (:mod:`simpler.tools.report` prints
them after the case's one-device tables).

A round on ``N`` devices is ``N`` records (one per device, with ``device``, ``device_index`` and
``round_wall_ns``). Per case and device count, the tables give:

* **per device**: each device's warm median of every phase, of its dispatch path (every phase
  but execute) and of its bytes moved per round;
* **whole round**: the wall time of the group round (what the caller waited for: sending the
  arguments, every device's run, the copy-back of staged outputs), cold / min / median / max /
  spread;
* **summary**: per arm, the dispatch path on one device (the same case, run in the same
  invocation, its rounds interleaved) beside the dispatch path on ``N`` devices (a round's is its
  slowest device's) and the whole round, each with its ratio to ``Residency_staged``, and the
  dispatch ratios of the arms on one device and on ``N`` side by side.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .bench import PHASES
from .report_format import BASELINE, arm_ratios, fmt_bytes, golden_note, spread, warm_median

__all__ = ["devices_of", "format_device_tables", "group_devices", "round_records"]

#: Per arm: round number -> that round's records (one per device, in group order).
Rounds = dict[int, list[Mapping[str, Any]]]


def devices_of(r: Mapping[str, Any]) -> int:
    """The device count of a record's run (1 for records without one)."""
    return int(r.get("devices", 1) or 1)


def group_devices(
    records: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, str, str, int], dict[str, Rounds]]:
    """The records of runs on several devices (one per device and round): (workload, test,
    case, devices) -> arm -> rounds."""
    out: dict[tuple[str, str, str, int], dict[str, Rounds]] = {}
    for r in records:
        n = devices_of(r)
        if n == 1 or "device_index" not in r:
            continue
        key = (str(r.get("workload", "")), str(r.get("test", "")), str(r.get("case", "")), n)
        rounds = out.setdefault(key, {}).setdefault(str(r.get("arm", "")), {})
        rounds.setdefault(int(r.get("round", 1)), []).append(r)
    for arms in out.values():
        for rounds in arms.values():
            for rs in rounds.values():
                rs.sort(key=lambda r: r.get("device_index", 0))
    return out


def _dispatch(r: Mapping[str, Any]) -> float:
    return float(r["dispatch_ns"])


def _bytes(r: Mapping[str, Any]) -> float:
    return float(r.get("bytes_moved", 0))


def _round_series(rounds: Rounds) -> dict[str, list[float]]:
    """Per round, in round order: ``dispatch`` (the slowest device's), ``wall`` (the group
    round's wall time) and ``bytes/round`` (every device's together)."""
    order = [rounds[k] for k in sorted(rounds)]
    return {
        "dispatch": [max(_dispatch(r) for r in rs) for rs in order],
        "wall": [float(rs[0].get("round_wall_ns", 0)) for rs in order],
        "bytes/round": [sum(_bytes(r) for r in rs) for rs in order],
    }


def _device_series(rounds: Rounds) -> dict[Any, dict[str, list[float]]]:
    """Per device (by id, in group order): each phase, ``dispatch`` and ``bytes/round`` per round."""
    out: dict[Any, dict[str, list[float]]] = {}
    for k in sorted(rounds):
        for r in rounds[k]:
            rows = out.setdefault(r.get("device", r.get("device_index", "?")), {})
            for p in PHASES:
                rows.setdefault(p, []).append(float(r["phases"].get(p, 0)))
            rows.setdefault("dispatch", []).append(_dispatch(r))
            rows.setdefault("bytes/round", []).append(_bytes(r))
    return out


def round_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rounds on several devices as one record each, for tables that compare rounds: case
    ``"<case> on N devices"``, the slowest device's ``phases`` and ``dispatch_ns``, every
    device's ``bytes_moved`` together, and ``round_wall_ns``."""
    out = []
    for (workload, test, case, n), arms in group_devices(records).items():
        for arm, rounds in arms.items():
            for k, rs in sorted(rounds.items()):
                slow = max(rs, key=_dispatch)
                out.append(
                    {
                        **{key: v for key, v in slow.items() if key not in ("device", "device_index")},
                        "workload": workload,
                        "test": test,
                        "case": f"{case} on {n} devices",
                        "arm": arm,
                        "round": k,
                        "bytes_moved": sum(_bytes(r) for r in rs),
                    }
                )
    return out


def format_device_tables(
    key: tuple[str, str, str, int],
    arms: Mapping[str, Rounds],
    single: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[str]:
    """The tables of one case on ``key[3]`` devices (see the module docs); ``single``: the same
    case's one-device records by arm (its dispatch ratios are printed beside these)."""
    workload, test, case, n = key
    any_r = next(iter(next(iter(arms.values())).values()))[0]
    rounds = max(len(r) for r in arms.values())
    golden = golden_note({arm: (r for rows in rs.values() for r in rows) for arm, rs in arms.items()})
    head = f"{workload} :: {test}::{case}" if test else f"{workload} :: {case}"
    lines = [f"== {head} on {n} devices ({any_r.get('platform', '?')}, {rounds} round(s), {golden}) =="]
    series = {arm: _round_series(rs) for arm, rs in arms.items()}
    peak = max(max(s["wall"] + s["dispatch"]) for s in series.values())
    unit, div = ("ms", 1e6) if peak >= 1e7 else ("us", 1e3)
    basis = f"warm median, rounds 2..{rounds}" if rounds > 1 else "the single (cold) round"
    cols = [*PHASES, "dispatch"]
    lines.append(f"per device ({unit}; {basis}):")
    lines.append(f"{'arm':<18} {'device':>6} " + " ".join(f"{c:>11}" for c in cols) + f" {'bytes/round':>12}")
    for arm, rs in arms.items():
        for i, (device, rows) in enumerate(_device_series(rs).items()):
            cells = " ".join(f"{warm_median(rows[c]) / div:>11.3f}" for c in cols)
            b = fmt_bytes(warm_median(rows["bytes/round"]))
            lines.append(f"{arm if i == 0 else '':<18} {device!s:>6} {cells} {b:>12}")
    lines.append(f"whole round: wall time of the group round ({unit})")
    lines.append(f"{'arm':<18} {'':<6} {'cold':>11} {'min':>11} {'median':>11} {'max':>11} {'spread':>8}")
    for arm, s in series.items():
        xs, warm = s["wall"], s["wall"][1:]
        stats = [f"{f(warm) / div:.3f}" for f in (min, statistics.median, max)] if warm else ["-"] * 3
        cells = " ".join(f"{c:>11}" for c in [f"{xs[0] / div:.3f}", *stats])
        lines.append(f"{arm:<18} {'':<6} {cells} {spread(warm):>8}")
    lines.append(
        f"summary ({'warm median' if rounds > 1 else 'the single (cold) round'}): dispatch = every "
        f"phase but execute; on {n} devices, a round's is its slowest device's"
    )
    one = {arm: warm_median([_dispatch(r) for r in rs]) for arm, rs in single.items()}
    many = {arm: warm_median(s["dispatch"]) for arm, s in series.items()}
    wall = {arm: warm_median(s["wall"]) for arm, s in series.items()}
    heads = [f"1 device {unit}", f"{n} devices {unit}", f"whole round {unit}"]
    lines.append(f"  {'arm':<18} " + " ".join(f"{h:>16} {'vs staged':>10}" for h in heads))
    for arm in arms:
        row_cells: list[str] = []
        for d in (one, many, wall):
            if arm in d:
                base = d.get(BASELINE)
                row_cells.append(f"{d[arm] / div:>16.3f} {f'{d[arm] / base:.2f}x' if base else '-':>10}")
            else:
                row_cells.append(f"{'-':>16} {'-':>10}")
        lines.append(f"  {arm:<18} " + " ".join(row_cells))
    for label, d in (
        ("dispatch ratios, 1 device", one),
        (f"dispatch ratios, {n} devices", many),
        (f"whole-round ratios, {n} devices", wall),
    ):
        ratios = arm_ratios(d)
        if ratios:
            lines.append(f"  {label}: " + "; ".join(ratios))
    lines.append("")
    return lines
