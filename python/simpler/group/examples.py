"""Small round functions for the device-group docs and tests: module-level, so that a spawned
child (or a Ray actor) imports them by name."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..worker import ArgDirection, Callable, Kernel
from ._host import DeviceContext

IN, INOUT = ArgDirection.IN, ArgDirection.INOUT


def _acc_kernel(w: np.ndarray, acc: np.ndarray) -> None:
    np.add(acc, w, out=acc)


def make_accumulate() -> Callable:
    """A callable over ``(w IN, acc INOUT)`` whose one task adds ``w`` into ``acc``."""
    k = Kernel(_acc_kernel, [IN, INOUT], name="accumulate")
    return Callable(lambda o, w, acc: o.submit(k, w, acc), [IN, INOUT], name="accumulate")


def accumulate(ctx: DeviceContext, x: np.ndarray) -> float:
    """A round function: the sum of ``x`` as the device sees it (a check that it arrived)."""
    return float(np.asarray(x).sum())


def noop(ctx: DeviceContext, *args: Any) -> None:
    """A round function that does nothing (the fixed cost of a round)."""
