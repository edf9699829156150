"""Running a case: :func:`run_case` (every round, in one call) and :func:`case_run` (the run of a
case, round by round), on one device (:class:`~simpler.testing.caserun.CaseRun`) or on several
(:class:`~simpler.testing.scene_group.GroupCaseRun`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ArgumentError
from ..worker import Worker
from ._cases import case_devices, check_scene_class, find_case
from .caserun import CaseRun
from .scene_group import GroupCaseRun

if TYPE_CHECKING:
    from .._core import _Platform

__all__ = ["case_run", "run_case"]


def run_case(
    cls: type,
    case: Mapping[str, Any] | str,
    platform: _Platform = "sim",
    rounds: int = 1,
    skip_golden: bool = False,
    worker_options: Mapping[str, Any] | None = None,
    worker: Worker | None = None,
    *,
    devices: int | None = None,
    group: Any = None,
) -> list[Any]:
    """Runs one case of a scene test for ``rounds`` rounds; returns one report per round.

    The L2 path: ``generate_args`` -> golden clone -> resident setup of every ``child_memory``
    tensor (directions from ``CALLABLE.signature``) -> rounds -> release (always, in ``finally``).
    ``worker`` runs the case on an existing worker (left open); otherwise a worker is opened on
    ``platform`` with ``worker_options`` (``svm``, ``staging``, ...) and closed at the end.
    Golden checking is skipped when ``skip_golden``, the case's ``skip_golden`` or the class's
    ``SKIP_GOLDEN`` is set. A mismatch raises ``AssertionError`` naming the case (and round).
    See :class:`CaseRun` to run a case round by round.

    ``devices`` overrides the case's device count (``devices``, else the class's ``DEVICES``).
    On several devices (or on ``group``, an open :class:`~simpler.group.DeviceGroup`, left
    open) the case runs as :class:`~simpler.testing.scene_group.GroupCaseRun` and returns one
    :class:`~simpler.testing.scene_group.GroupRound` per round (each device's report and the
    round's wall time).
    """
    __tracebackhide__ = True  # pytest: failures start at the case's own code
    run = case_run(
        cls, case, platform, rounds, skip_golden, worker_options, worker, devices=devices, group=group
    )
    failed = False
    try:
        run.start()
        for _ in range(rounds):
            run.round()
        return run.finish()
    except BaseException:
        failed = True
        raise
    finally:
        run.close(failed)


def case_run(
    cls: type,
    case: Mapping[str, Any] | str,
    platform: _Platform = "sim",
    rounds: int = 1,
    skip_golden: bool = False,
    worker_options: Mapping[str, Any] | None = None,
    worker: Worker | None = None,
    *,
    devices: int | None = None,
    group: Any = None,
) -> CaseRun | GroupCaseRun:
    """The round-by-round run of a case (not started): a :class:`CaseRun` on one device, a
    :class:`~simpler.testing.scene_group.GroupCaseRun` on several (or on ``group``); the
    arguments are :func:`run_case`'s."""
    check_scene_class(cls)
    n = len(group) if group is not None and devices is None else case_devices(cls, case, devices)
    if group is None and n == 1:
        return CaseRun(cls, case, platform, rounds, skip_golden, worker_options, worker)
    label = f"{cls.__name__}::{find_case(cls, case)['name']}"
    if worker is not None:
        raise ArgumentError(
            f"{label} runs on {n} devices, one process each; worker= is one device "
            "(pass devices=1 to run it there, or group= a DeviceGroup)"
        )
    return GroupCaseRun(cls, case, platform, rounds, skip_golden, worker_options, group=group, devices=n)
