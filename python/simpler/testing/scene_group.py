"""Scene-test cases on several devices: one process per device, through a device group.

A case runs on ``n > 1`` devices when its class sets ``DEVICES = n``, the case says
``"devices": n``, or the front end is given ``--devices n`` (``--simpler-devices n`` under pytest).
:class:`GroupCaseRun` runs it, with the interface of :class:`~simpler.testing.scene.CaseRun`:

* ``start()``: the whole case's arguments are generated and its golden computed exactly as on
  one device; ``split_args(args, params, n)`` cuts the arguments into one builder per device;
  a :class:`~simpler.group.DeviceGroup` is opened (one spawned process per device, unless one is
  given) and every ``child_memory`` tensor is made resident on each device, from that device's
  part, in one group resident set (directions from ``CALLABLE.signature``);
* ``round()``: every device runs the callable once, at the same time, with its resident tensors
  and its host-staged arrays (placed once in shared memory; staged outputs copied back into the
  device's part). Staged outputs are restored before every round after the first, as on one
  device. Without resident outputs the devices' outputs are joined (``merge_outputs``) into the
  whole case's arguments and compared with the golden every round; with resident outputs the
  golden evolves (``compute_golden`` once per round on the whole golden) and
* ``finish()`` reads every device's resident outputs back once, joins them with the last
  round's staged outputs and compares;
* ``close()`` releases the resident set on every device (LIFO) and closes the group it opened.

Each round returns a :class:`GroupRound`: every device's :class:`~simpler.RunReport` and the wall
time of the group round (sending, every device's run, the copy-back of staged outputs).

The device processes import the scene-test class by name to build its ``CALLABLE`` (a spawned
process shares no objects with this one): the class must be defined at the top level of a
module, which is the case for scene tests in test files and in ``__main__`` scripts. A class
built inside a function cannot run on several devices (``ArgumentError`` before any device work).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _arrays
from ..args import TaskArgsBuilder
from ..errors import ArgumentError
from ..worker import ArgDirection, RunReport
from ._cases import host_fixture, release_then_close
from .caserun import CaseRun, compare

if TYPE_CHECKING:
    from .._core import _Platform

__all__ = ["GroupCaseRun", "GroupRound", "device_round"]

log = logging.getLogger("simpler")


@dataclass
class GroupRound:
    """One round of a case on several devices.

    ``devices``: the device ids, in group order; ``reports``: each device's
    :class:`~simpler.RunReport`, as its device's process made it, in the same order; ``wall_ns``:
    the wall time of the group round, as the caller saw it."""

    devices: list[int]
    reports: list[RunReport]
    wall_ns: int

    @property
    def ok(self) -> bool:
        """Whether every device's run was ok."""
        return all(r.ok for r in self.reports)

    @property
    def dispatch_ns(self) -> int:
        """The round's dispatch path: its slowest device's (``RunReport.dispatch_ns``)."""
        return max(r.dispatch_ns for r in self.reports)

    def to_dict(self) -> dict[str, Any]:
        """``devices``, ``wall_ns`` and ``per_device`` (each report's ``to_dict()``), as
        JSON-ready data."""
        return {
            "devices": list(self.devices),
            "wall_ns": self.wall_ns,
            "per_device": [r.to_dict() for r in self.reports],
        }


# -- in the device processes -------------------------------------------------------------------

#: The callables a device process built, by (module, qualified name) of their scene test.
_CALLABLES: dict[tuple[str, str], Any] = {}
#: The platforms whose fake-driver hooks a device process installed.
_INSTALLED: set[str] = set()

ClassRef = tuple[str, str, "str | None"]


def _lookup(module: Any, qualname: str) -> Any:
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _class_ref(cls: type) -> ClassRef:
    """How a device process finds ``cls``: (module name, qualified name, module file). Refused
    (``ArgumentError``) when the class is not reachable by that name."""
    module = sys.modules.get(cls.__module__)
    qual = cls.__qualname__
    if module is None or "<locals>" in qual or _lookup(module, qual) is not cls:
        raise ArgumentError(
            f"{cls.__name__} cannot run on several devices: each device's process imports the "
            f"scene test by name ({cls.__module__}.{qual}), so define the class at the top level of "
            "a module"
        )
    return cls.__module__, qual, getattr(module, "__file__", None)


def _load_callable(ref: ClassRef) -> Any:
    """The ``CALLABLE`` of the scene test ``ref`` names, imported once per process (by module
    name; by file when the name is not importable, as for a test file pytest or the bench loaded
    under a name of its own)."""
    name, qual, file = ref
    hit = _CALLABLES.get((name, qual))
    if hit is not None:
        return hit
    module = sys.modules.get(name)
    if module is None:
        try:
            module = importlib.import_module(name)
        except ImportError:
            if not file:
                raise
            spec = importlib.util.spec_from_file_location(name, file)
            if spec is None or spec.loader is None:
                raise
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    cls = _lookup(module, qual)
    if cls is None:
        raise ArgumentError(f"no scene test {qual} in module {name}")
    _CALLABLES[(name, qual)] = cls.CALLABLE
    return cls.CALLABLE


def device_round(ctx: Any, ref: ClassRef, args: list[Any]) -> RunReport:
    """One round of a scene case on one device, in that device's process: runs the scene
    test's ``CALLABLE`` with ``args`` on the device's worker; its report."""
    if ctx.worker.platform == "cuda" and "cuda" not in _INSTALLED:
        from .fake_kernels import install_if_fake

        install_if_fake()  # a GPU-less machine: the fake's host kernels, here too
        _INSTALLED.add("cuda")
    return ctx.worker.run(_load_callable(ref), args)


# -- in the caller -----------------------------------------------------------------------------


def _readonly(arr: np.ndarray) -> np.ndarray:
    """A read-only view: the group copies it to the devices and never back."""
    v = arr.view()
    v.flags.writeable = False
    return v


class GroupCaseRun:
    """One case of a scene test on several devices, round by round (see the module docs).

    ``GroupCaseRun(cls, case, platform, rounds, skip_golden, worker_options, group=None,
    devices=None)``: ``group`` an open :class:`~simpler.group.DeviceGroup` (left open), else one
    is opened on ``platform`` with ``devices`` processes (device ids ``0..n-1``) and
    ``worker_options``, and closed by ``close()``. ``round()`` returns a :class:`GroupRound`.

    The interface of :class:`~simpler.testing.caserun.CaseRun` (``start``, ``round``,
    ``finish``, ``close``, ``label``, ``golden_skipped_by``, ``reports``), by composition: it
    holds a ``CaseRun`` of the whole case, never started (its devices are the group's), which
    checks the class and the case, holds the whole case's arguments and golden and makes every
    comparison.
    """

    def __init__(
        self,
        cls: type,
        case: Mapping[str, Any] | str,
        platform: _Platform = "sim",
        rounds: int = 1,
        skip_golden: bool = False,
        worker_options: Mapping[str, Any] | None = None,
        *,
        group: Any = None,
        devices: int | None = None,
    ):
        self._case = whole = CaseRun(cls, case, platform, rounds, skip_golden, worker_options)
        if group is not None and devices is not None and devices != len(group):
            raise ArgumentError(f"{whole.label}: devices={devices} but the group has {len(group)} devices")
        self.group = group
        self.devices = len(group) if group is not None else int(devices or 1)
        self._own_group = group is None
        # Every message and note of the whole case names the devices.
        whole.label = f"{whole.label} on {self.devices} devices"
        self.reports: list[GroupRound] = []
        self.parts: list[TaskArgsBuilder] = []
        self._set: Any = None
        self._closed = False

    @property
    def label(self) -> str:
        """The case's name, with its device count (``Test::case on 2 devices``)."""
        return self._case.label

    @property
    def golden_skipped_by(self) -> str | None:
        """Who turned the golden check off (see :class:`~simpler.testing.caserun.CaseRun`)."""
        return self._case.golden_skipped_by

    @property
    def args(self) -> TaskArgsBuilder:
        """The whole case's arguments (after ``start()``): the devices' outputs joined."""
        return self._case.args

    @property
    def golden(self) -> TaskArgsBuilder | None:
        """The whole case's golden (after ``start()``), or ``None`` when it is not checked."""
        return self._case.golden

    def start(self) -> None:
        """Builds the whole case's fixtures and golden, splits them, opens the group (unless
        given) and makes every ``child_memory`` tensor resident on each device."""
        try:
            self._start()
        except BaseException as e:
            self._case._note(e)
            raise

    def _start(self) -> None:
        whole, n = self._case, self.devices
        whole._declared()
        self._ref = _class_ref(whole.cls)
        args = whole._generate_args()
        whole.args = args
        whole.golden = None if whole.skip else args.clone()
        parts = whole._inst.split_args(args, whole.params, n)
        dirs = {t.name: d for t, (d, _) in zip(args.tensors(), whole.callable.signature)}
        self._check_parts(parts, args, dirs)
        self.parts = parts
        self._resident = [t.name for t in args.tensors() if t.child_memory]
        self._staged_in = [
            t for t in args.tensor_names() if t not in self._resident and dirs[t] is ArgDirection.IN
        ]
        outputs = [t for t in args.tensor_names() if dirs[t] is not ArgDirection.IN]
        self._staged_out = [t for t in outputs if t not in self._resident]
        self._resident_out = [t for t in outputs if t in self._resident]
        # The whole case's golden evolves (one compute_golden a round) when outputs are resident.
        whole._evolving = bool(self._resident_out)
        # One snapshot per device here, where CaseRun keeps one for the whole case.
        self._initial: list[dict[str, np.ndarray]] = [
            {t: np.array(host_fixture(p[t]), copy=True) for t in self._staged_out} for p in parts
        ]
        self._initial_whole = {t: np.array(host_fixture(args[t]), copy=True) for t in self._staged_out}
        # One read-only view per array (an array every device reads is placed once); the arrays
        # are held, so no id is reused.
        ro: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._inputs = []
        for p in parts:
            views = {}
            for t in self._staged_in:
                arr = host_fixture(p[t])
                views[t] = ro.setdefault(id(arr), (arr, _readonly(arr)))[1]
            self._inputs.append(views)
        if whole.golden is not None and not whole._evolving:
            whole._inst.compute_golden(whole.golden, whole.params)
        if self.group is None:
            from ..group import DeviceGroup

            if whole.platform == "cuda":
                from .fake_kernels import install_if_fake

                install_if_fake()  # what the device processes inherit (NVRTC's path)
            self.group = DeviceGroup(whole.platform, devices=list(range(n)), **whole.worker_options)
        self._set = self.group.resident_set()
        for name in self._resident:
            self._set.add(name, [host_fixture(p[name]) for p in parts], dirs[name])

    def _check_parts(self, parts: Any, args: TaskArgsBuilder, dirs: Mapping[str, Any]) -> None:
        """``split_args``'s answer: ``n`` builders with ``args``'s arguments, host arrays, no
        output array shared by two devices, no empty resident part."""
        where = f"{self.label}: split_args"
        n = self.devices
        if not isinstance(parts, (list, tuple)) or len(parts) != n:
            got = len(parts) if isinstance(parts, (list, tuple)) else type(parts).__name__
            raise ArgumentError(f"{where} must return {n} TaskArgsBuilders (one per device), not {got}")
        names = args.names
        for i, p in enumerate(parts):
            if not isinstance(p, TaskArgsBuilder) or p.names != names:
                what = p.names if isinstance(p, TaskArgsBuilder) else type(p).__name__
                raise ArgumentError(f"{where}: device {i}'s part must have the arguments {names}, not {what}")
            for t in p.tensors():
                arr = host_fixture(t.value)
                if not isinstance(arr, np.ndarray):
                    raise ArgumentError(
                        f"{where}: device {i}'s '{t.name}' is a {type(arr).__name__}; a device's "
                        "process takes host arrays"
                    )
                if args.spec(t.name).child_memory and arr.nbytes == 0:
                    raise ArgumentError(f"{where}: device {i}'s resident '{t.name}' is empty")
        for name, d in dirs.items():
            arrs = [host_fixture(p[name]) for p in parts]
            if d is not ArgDirection.IN and any(
                np.shares_memory(a, b) for i, a in enumerate(arrs) for b in arrs[i + 1 :]
            ):
                raise ArgumentError(
                    f"{where}: output '{name}' shares memory between devices; give each device "
                    "its own array (split it)"
                )

    def _row(self, i: int) -> list[Any]:
        """Device ``i``'s arguments for one round, in signature order."""
        p, row = self.parts[i], []
        for t in p.tensors():
            if t.name in self._resident:
                row.append(self._set[t.name][i])
            elif t.name in self._inputs[i]:
                row.append(self._inputs[i][t.name])
            else:
                row.append(host_fixture(t.value))
        return row + [_arrays.host_scalar(s.value) for s in p.scalars()]

    def round(self) -> GroupRound:
        """Runs the next round on every device (and checks it); returns it."""
        __tracebackhide__ = True
        try:
            return self._round()
        except BaseException as e:
            self._case._note(e)
            raise

    def _round(self) -> GroupRound:
        from ..group import DeviceGroup

        r = len(self.reports)
        assert isinstance(self.group, DeviceGroup) and self._set is not None, "start() first"
        if r > 0:
            for p, snaps in zip(self.parts, self._initial):
                for t, snap in snaps.items():
                    np.copyto(host_fixture(p[t]), snap)
        rows = [(self._ref, self._row(i)) for i in range(self.devices)]
        t0 = time.perf_counter_ns()
        reports = self.group.round(device_round, rows)
        wall = time.perf_counter_ns() - t0
        result = GroupRound(list(self.group.devices), reports, wall)
        self.reports.append(result)
        whole = self._case
        merge = lambda: whole._inst.merge_outputs(self.parts, whole.args, whole.params)  # noqa: E731
        whole._step_golden(r, self._initial_whole, merge)
        return result

    def finish(self) -> list[GroupRound]:
        """After the last round: reads every device's resident outputs back once, joins them with
        the last round's staged outputs and compares; returns the rounds."""
        __tracebackhide__ = True
        try:
            whole = self._case
            if whole.golden is not None and whole._evolving and self._set is not None:
                for name in self._resident_out:
                    for p, arr in zip(self.parts, self._set.gather(name)):
                        np.copyto(host_fixture(p[name]), arr)
                whole._inst.merge_outputs(self.parts, whole.args, whole.params)
                compare(whole, f"{self.label}, after {len(self.reports)} round(s) (resident outputs)")
        except BaseException as e:
            self._case._note(e)
            raise
        return self.reports

    def close(self, failed: bool = False) -> None:
        """Releases the resident set on every device and closes the group it opened. When
        ``failed``, a release failure is logged instead of raised."""
        if self._closed:
            return
        self._closed = True
        close = self.group.close if self._own_group and self.group is not None else None
        release_then_close(self.label, self._set, close, failed)
