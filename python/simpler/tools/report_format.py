"""How the bench's tables print their figures: bytes, warm medians and spreads, ratios between
the residency arms, and what a table's arms compared with the golden. Shared by the one-device
tables (:mod:`simpler.tools.report`) and the several-device ones
(:mod:`simpler.tools.report_devices`)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The arm every other arm is compared with.
BASELINE = "Residency_staged"


def fmt_bytes(b: float) -> str:
    """``1.5 GiB``, ``12.0 KiB``, ``96 B``."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def spread(warm: Sequence[float]) -> str:
    """``(max - min) / median`` of the warm rounds, in percent (``-`` without two of them)."""
    if len(warm) < 2:
        return "-"
    med = statistics.median(warm)
    return f"{(max(warm) - min(warm)) / med * 100:.0f}%" if med else "-"


def warm_median(xs: list[float]) -> float:
    """The median of the warm rounds (every round but the first; the only one when alone)."""
    return statistics.median(xs[1:]) if len(xs) > 1 else xs[0]


def warm_min(xs: list[float]) -> float:
    """The best warm round (every round but the first; the only one when alone)."""
    return min(xs[1:]) if len(xs) > 1 else xs[0]


def fmt_ratio(ratio: float | None) -> str:
    """``1.23x``, ``52.2x``, ``1,740x``; ``-`` when there is none (nothing modeled)."""
    if ratio is None:
        return "-"
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def arm_ratios(d: Mapping[str, float]) -> list[str]:
    """``Residency_bulk / Residency_staged`` and ``Residency_all / Residency_bulk`` of ``d``."""
    out = []
    if d.get(BASELINE) and "Residency_bulk" in d:
        out.append(f"Residency_bulk / Residency_staged = {d['Residency_bulk'] / d[BASELINE]:.3f}")
    if d.get("Residency_bulk") and "Residency_all" in d:
        out.append(f"Residency_all / Residency_bulk = {d['Residency_all'] / d['Residency_bulk']:.3f}")
    return out


_SKIPPED_BY = {"option": "by --skip-golden", "case": "by the case", "class": "by the class"}


def golden_note(arms: Mapping[str, Iterable[Mapping[str, Any]]]) -> str:
    """What a table's arms compared: ``golden checked`` when every arm's rounds were compared with
    the golden, ``golden skipped (by the case)`` when none were, else which arms were and which
    were not (a record without ``golden`` is from before the field: checked)."""
    state: dict[str, str] = {}
    for arm, rs in arms.items():
        seen = set()
        for r in rs:
            if r.get("golden", True):
                seen.add("checked")
            else:
                by = _SKIPPED_BY.get(str(r.get("golden_skipped_by")))
                seen.add(f"skipped ({by})" if by else "skipped")
        state[arm] = " / ".join(sorted(seen))
    kinds = list(dict.fromkeys(state.values()))
    if len(kinds) == 1:
        return f"golden {kinds[0]}"
    return "golden " + "; ".join(
        f"{kind} for {', '.join(a for a, k in state.items() if k == kind)}" for kind in kinds
    )
