"""Scene tests: a callable, a list of cases, fixtures and a golden model, run for N rounds.

::

    @sp.scene_test(level=2)
    class TestAdd(sp.SceneTestCase):
        CALLABLE = sp.Callable(orch_fn, signature=[sp.IN, sp.IN, sp.OUT])
        CASES = [{"name": "small", "params": {"n": 16}}]

        def generate_args(self, params):
            return sp.TaskArgsBuilder(
                sp.TensorArg("a", ...), sp.TensorArg("b", ...), sp.TensorArg("out", ...)
            )

        def compute_golden(self, args, params):
            args.out[...] = args.a + args.b

    if __name__ == "__main__":
        sp.main()  # the standalone runner (simpler.testing.runner)

Memory policy is declared per argument (``TensorArg(..., child_memory=True)``) and never depends
on ``rounds`` (see ``docs/scene_tests.md``):

=====================  ======================  ==============================  =====================
declaration            case setup              between rounds                  validation
=====================  ======================  ==============================  =====================
host-staged (default)  nothing                 restore OUT/INOUT host fixtures per-round copy-back,
                                                                               golden every round
resident IN            allocate + upload once  keep device address, contents   no readback
resident OUT           allocate, no upload     keep device contents            final readback
resident INOUT         allocate + upload once  keep device state               final readback
=====================  ======================  ==============================  =====================

Without resident outputs the golden is computed once and compared after every round. With
resident outputs ``compute_golden`` is applied once per round to the evolving golden args (their
host-staged outputs restored before each round, like the real ones) and the case compares once,
after the final round, against a device readback of the resident outputs and the last round's
staged outputs. With golden skipped there is nothing to validate, so there is no readback either.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from .. import _arrays
from ..args import ResidentTaskArgs, TaskArgsBuilder
from ..errors import ArgumentError, ArgumentTypeError
from ..worker import ArgDirection, Callable, RunReport, Worker
from . import fake_cuda
from ._cases import (
    PLATFORM_ALIASES,
    case_platforms,
    check_devices,
    check_split,
    compare_style,
    manual_on,
    merge_by_axes,
    platform_list,
    platform_name,
    release_then_close,
    split_by_axes,
    validate_case,
)

__all__ = [
    "PLATFORM_ALIASES",
    "CaseRun",
    "SceneTestCase",
    "SceneTestWarning",
    "can_split",
    "case_devices",
    "case_platforms",
    "manual_on",
    "platform_list",
    "platform_name",
    "run_case",
    "scene_runtime",
    "scene_test",
]

log = logging.getLogger("simpler")

_LEVEL_ATTR = "_scene_test_level"
_RUNTIME_ATTR = "_scene_test_runtime"
_COMPARE_ATTR = "_scene_test_compare"  # "ours" or "upstream": how compare_outputs is called


class SceneTestWarning(UserWarning):
    """A scene test declares something this harness accepts but does not act on (an upstream
    case's ``config``). Filter it like any warning category (``-W ignore::...``)."""


class SceneTestCase:
    """Base class of scene tests (decorate subclasses with :func:`scene_test`).

    Class attributes: ``CALLABLE`` (a :class:`~simpler.Callable`), ``CASES`` (a list of dicts
    with ``name``, and optionally ``params`` (dict), ``platforms`` (list; absent = every
    platform; upstream names such as ``a2a3sim`` are mapped, see :data:`PLATFORM_ALIASES`),
    ``manual`` (``True``/``False``, or the platform(s) on which the case is manual; it runs
    only with ``--manual include|only`` there), ``skip_golden``, ``config`` (upstream's runtime
    settings: accepted and ignored, with one :class:`SceneTestWarning` per class), ``devices``
    (the case's device count)), ``RTOL`` / ``ATOL`` for the default comparison, ``SKIP_GOLDEN``
    for the whole class, ``DEVICES`` (the device count of every case without ``devices``;
    default 1) and ``SPLIT`` (how the arguments split across devices).

    Override :meth:`generate_args` and :meth:`compute_golden`; optionally :meth:`compare_outputs`
    (ours, ``(actual, golden, params)``, or upstream's, ``(test_args, golden_args, output_names,
    params)``: the decorator tells them apart by the signature).

    **Several devices.** A case on ``n > 1`` devices (declared, or ``--devices n``) runs in a
    :class:`~simpler.group.DeviceGroup`, one process per device: the whole case's arguments are
    generated and its golden computed as on one device; :meth:`split_args` cuts the arguments
    into one builder per device (``SPLIT = {"x": 0, "out": 0}``: those tensors along those axes,
    the others whole on every device; or override it); each device runs every round with its
    own resident tensors; :meth:`merge_outputs` joins the devices' outputs into the whole
    case's, which are compared with the golden as on one device. A class with neither ``SPLIT``
    nor a ``split_args`` override cannot run on several devices (see ``docs/scene_tests.md``).
    """

    CALLABLE: Callable | None = None
    CASES: list[dict[str, Any]] = []
    RTOL: float = 1e-5
    ATOL: float = 1e-5
    SKIP_GOLDEN: bool = False
    DEVICES: int = 1
    SPLIT: Mapping[str, int | None] | None = None

    def generate_args(self, params: dict[str, Any]) -> TaskArgsBuilder:
        """Builds the case's fixtures: tensors in signature order, then scalars."""
        raise ArgumentTypeError(f"{type(self).__name__} must override generate_args")

    def compute_golden(self, args: TaskArgsBuilder, params: dict[str, Any]) -> None:
        """Writes the expected outputs into ``args`` in place (one round's worth)."""
        raise ArgumentTypeError(f"{type(self).__name__} must override compute_golden")

    def split_args(self, args: TaskArgsBuilder, params: dict[str, Any], n: int) -> list[TaskArgsBuilder]:
        """The case's arguments for ``n`` devices: one builder per device, each with every
        argument of ``args`` in the same order (``child_memory`` as declared there).

        The default follows ``SPLIT`` (tensor name: axis to split along, ``np.array_split``,
        or ``None``; a tensor it does not name goes whole to every device, as one shared array,
        so an output must be split); without ``SPLIT`` the case cannot split and this raises
        ``ArgumentError`` saying so. Override it for anything else (re-indexed tables, a
        per-device scalar): the builders' arrays must be host arrays, and no output array may be
        shared by two devices."""
        where = type(self).__name__
        if self.SPLIT is None:
            raise ArgumentError(
                f"{where} cannot run on {n} devices: it does not say how its arguments split "
                "(set SPLIT = {'tensor': axis, ...} or override split_args)"
            )
        return split_by_axes(args, self.SPLIT, n, where)

    def merge_outputs(
        self, parts: Sequence[TaskArgsBuilder], args: TaskArgsBuilder, params: dict[str, Any]
    ) -> None:
        """Writes the devices' outputs (``parts``, in device order, as :meth:`split_args` made
        them, after the run) into the whole case's ``args``, where they are compared with the
        golden. The default joins every OUT/INOUT tensor along its ``SPLIT`` axis (axis 0
        without ``SPLIT``)."""
        merge_by_axes(parts, args, self.output_names(args), self.SPLIT, type(self).__name__)

    def output_names(self, args: TaskArgsBuilder) -> list[str]:
        """The tensors of ``args`` that the signature makes OUT or INOUT."""
        sig = self.CALLABLE.signature if self.CALLABLE is not None else ()
        return [t.name for t, (d, _) in zip(args.tensors(), sig) if d is not ArgDirection.IN]

    def compare_outputs(
        self,
        actual: TaskArgsBuilder,
        golden: TaskArgsBuilder,
        *rest: Any,
        output_names: Sequence[str] | None = None,
        params: Any = None,
    ) -> None:
        """Asserts ``actual`` matches ``golden`` (allclose at RTOL/ATOL); raises ``AssertionError``.

        Called as ours, ``compare_outputs(actual, golden, params)`` (every OUT/INOUT tensor), or as
        upstream's, ``compare_outputs(test_args, golden_args, output_names, params)`` (the tensors
        named), so an upstream override's ``super().compare_outputs(..., [subset], params)`` works.
        bfloat16 and the fp8 kinds are compared as float32.
        """
        __tracebackhide__ = True
        if output_names is not None or params is not None:  # the same, by keyword
            rest = (*rest, *([output_names] if output_names is not None else []), params)
        if len(rest) == 1:
            names = self.output_names(actual)
        elif len(rest) == 2:
            names = list(rest[0])
        else:
            raise ArgumentTypeError(
                "compare_outputs takes (actual, golden, params) or (test_args, golden_args, "
                f"output_names, params), not {2 + len(rest)} arguments"
            )
        for name in names:
            a, g = _comparable(actual[name]), _comparable(golden[name])
            np.testing.assert_allclose(a, g, rtol=self.RTOL, atol=self.ATOL, err_msg=f"output '{name}'")

    @staticmethod
    def run_module(module_name: str, argv: Sequence[str] | None = None) -> NoReturn:
        """Runs the scene tests of module ``module_name`` standalone and exits: upstream's entry
        point, ``if __name__ == "__main__": SceneTestCase.run_module(__name__)``.

        The same runner as ``sp.main()`` (:func:`simpler.testing.runner.main`): its options
        (``-p sim --rounds 3 --case Foo ...``) come from ``argv`` (default ``sys.argv[1:]``),
        and it raises ``SystemExit`` (0 all passed, 1 a failure, 2 a usage error).
        """
        from . import runner  # the runner imports this module

        module = sys.modules.get(module_name) if isinstance(module_name, str) else None
        if module is None:
            raise ArgumentError(f"run_module: no imported module named {module_name!r} (pass __name__)")
        runner.main(argv, module=module)
        raise SystemExit(0)  # not reached: main always exits


def _host(v: Any) -> Any:
    """A fixture's numpy view (a torch tensor's memory; anything else as it is)."""
    return _arrays.host_array(v, "fixture")


def _comparable(v: Any) -> np.ndarray:
    arr = np.asarray(_host(v))
    if arr.dtype.kind == "V" or arr.dtype.name.startswith(("bfloat", "float8", "float6", "float4")):
        return arr.astype(np.float32)
    return arr


def scene_test(level: int = 2, runtime: str | None = None) -> Any:
    """Class decorator marking a :class:`SceneTestCase` subclass as a scene test.

    ``level=2``: one process drives one device. ``level=3`` (multi-process) runs a one-device
    case host-staged in this process (a ``child_memory=True`` argument there is rejected with an
    error before any device work). At either level, a case on several devices (``DEVICES``, a
    case's ``devices``, or ``--devices``) runs one process per device, with each device's
    resident tensors in its own process (see :class:`SceneTestCase`). ``runtime``: upstream's runtime
    name (``"tensormap_and_ringbuffer"``, ...), recorded (:func:`scene_runtime`) and otherwise
    unused: there is one runtime here. The class and its ``CASES`` are validated here, so a
    malformed case fails at import: upstream platform names in ``platforms`` / ``manual`` are
    mapped to ours, an unknown one is an error, a ``config`` gets one :class:`SceneTestWarning`,
    a ``compare_outputs`` override is recognised by its signature (ours or upstream's) or
    refused, and a class that declares several devices must say how its arguments split.
    """
    if isinstance(level, bool) or level not in (2, 3):
        raise ArgumentError(f"scene_test: level must be 2 or 3, not {level!r}")
    if runtime is not None and (not isinstance(runtime, str) or not runtime):
        raise ArgumentTypeError(f"scene_test: runtime must be a non-empty string, not {runtime!r}")

    def deco(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, SceneTestCase)):
            raise ArgumentTypeError("scene_test decorates a SceneTestCase subclass")
        if not isinstance(cls.CALLABLE, Callable):
            raise ArgumentTypeError(f"{cls.__name__}.CALLABLE must be a simpler.Callable")
        for method in ("generate_args", "compute_golden"):
            if getattr(cls, method) is getattr(SceneTestCase, method):
                raise ArgumentTypeError(f"{cls.__name__} must override {method}")
        compare = compare_style(cls, SceneTestCase.compare_outputs)
        seen: set[str] = set()
        cases = []
        for i, case in enumerate(cls.CASES):
            cases.append(validate_case(cls, i, case))
            if case["name"] in seen:
                raise ArgumentError(f"{cls.__name__}: duplicate case name '{case['name']}'")
            seen.add(case["name"])
        configured = [c["name"] for c in cases if "config" in c]
        if configured:
            warnings.warn(
                f"{cls.__name__}: the 'config' of case(s) {', '.join(configured)} is ignored: "
                "upstream runtime settings (AICPU thread counts, ring sizes, device_count, "
                "num_sub_workers) have no equivalent here",
                SceneTestWarning,
                stacklevel=2,
            )
        check_devices(cls.DEVICES, f"{cls.__name__}.DEVICES")
        if cls.SPLIT is not None:
            check_split(cls.SPLIT, cls.__name__)
        several = [c["name"] for c in cases if c.get("devices", cls.DEVICES) > 1]
        if several and not can_split(cls):
            raise ArgumentError(
                f"{cls.__name__}: case(s) {', '.join(several)} run on several devices, but the class "
                "does not say how its arguments split (set SPLIT = {'tensor': axis, ...} or override "
                "split_args)"
            )
        cls.CASES = cases
        setattr(cls, _LEVEL_ATTR, int(level))
        setattr(cls, _RUNTIME_ATTR, runtime)
        setattr(cls, _COMPARE_ATTR, compare)
        return cls

    return deco


def can_split(cls: type[SceneTestCase]) -> bool:
    """Whether a scene test can run on several devices: it sets ``SPLIT`` or overrides
    ``split_args``."""
    return cls.SPLIT is not None or cls.split_args is not SceneTestCase.split_args


def case_devices(cls: type[SceneTestCase], case: Mapping[str, Any] | str, devices: int | None = None) -> int:
    """The device count a case runs on: ``devices`` (``--devices``) when given, else the case's
    ``devices``, else the class's ``DEVICES``."""
    if devices is not None:
        return check_devices(devices, "devices")
    c = _find_case(cls, case)
    return int(c.get("devices", getattr(cls, "DEVICES", 1)))


def is_scene_test(obj: object) -> bool:
    """Whether ``obj`` is a class decorated with :func:`scene_test`."""
    return isinstance(obj, type) and issubclass(obj, SceneTestCase) and _LEVEL_ATTR in obj.__dict__


def scene_level(cls: type) -> int:
    """The level a scene test was declared with."""
    return int(cls.__dict__[_LEVEL_ATTR])


def scene_runtime(cls: type) -> str | None:
    """The ``runtime`` a scene test was declared with (upstream's runtime name; ``None`` when
    none was given). Recorded only: this harness has one runtime."""
    if not is_scene_test(cls):
        raise ArgumentTypeError(f"scene_runtime: {cls!r} is not a class decorated with scene_test")
    return cls.__dict__[_RUNTIME_ATTR]


def _find_case(cls: type[SceneTestCase], case: Mapping[str, Any] | str) -> Mapping[str, Any]:
    if isinstance(case, str):
        for c in cls.CASES:
            if c["name"] == case:
                return c
        raise ArgumentError(f"{cls.__name__}: no case named '{case}'")
    return case


@dataclass
class _Plan:
    """What the L2 path needs to know about one case's fixtures."""

    staged_outputs: list[str]  # host-staged OUT/INOUT tensors (restored before every round after the first)
    resident_outputs: list[str]  # resident OUT/INOUT tensors (read back once, after the final round)


def _plan(args: TaskArgsBuilder, callable: Callable, res: ResidentTaskArgs | None) -> _Plan:
    staged, resident = [], []
    for t, (d, _) in zip(args.tensors(), callable.signature):
        if d is ArgDirection.IN:
            continue
        if res is not None and t.name in res.resident_names:
            resident.append(t.name)
        elif isinstance(_host(t.value), np.ndarray):
            staged.append(t.name)
    return _Plan(staged, resident)


class CaseRun:
    """One case of a scene test, run round by round (what :func:`run_case` does in one call).

    ``start()`` opens the worker (unless one is given), builds the fixtures and the golden clone
    and makes every ``child_memory`` tensor resident; each ``round()`` runs the callable once and
    checks it (a host-staged case compares every round; a case with resident outputs evolves its
    golden); ``finish()`` makes the final comparison of a case with resident outputs; ``close()``
    releases the resident set and closes the worker it opened (always call it, e.g. in
    ``finally``; it is idempotent). Rounds of several cases may be interleaved, which is how
    ``simpler bench`` compares residency arms on a busy machine. ``golden_skipped_by`` says who
    turned the golden check off (``"option"``: ``skip_golden``; ``"case"``: the case's
    ``"skip_golden"``; ``"class"``: ``SKIP_GOLDEN``), or is ``None`` when rounds are compared.
    """

    def __init__(
        self,
        cls: type[SceneTestCase],
        case: Mapping[str, Any] | str,
        platform: str = "sim",
        rounds: int = 1,
        skip_golden: bool = False,
        worker_options: Mapping[str, Any] | None = None,
        worker: Worker | None = None,
    ):
        if not (isinstance(cls, type) and issubclass(cls, SceneTestCase)):
            raise ArgumentTypeError("run_case: expected a SceneTestCase subclass")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ArgumentError(f"run_case: rounds must be a positive int, not {rounds!r}")
        self.cls = cls
        self.case = _find_case(cls, case)
        self.callable = cls.CALLABLE
        if not isinstance(self.callable, Callable):
            raise ArgumentTypeError(f"{cls.__name__}.CALLABLE must be a simpler.Callable")
        self.label = f"{cls.__name__}::{self.case['name']}"
        self.params = dict(self.case.get("params", {}))
        self.rounds = rounds
        # Who turned the golden check off: the caller's option, the case's "skip_golden" or the
        # class's SKIP_GOLDEN (None: it is checked).
        self.golden_skipped_by: str | None = (
            "option"
            if skip_golden
            else "case"
            if self.case.get("skip_golden", False)
            else "class"
            if cls.SKIP_GOLDEN
            else None
        )
        self.skip = self.golden_skipped_by is not None
        self.platform = platform
        self.worker_options = dict(worker_options or {})
        self.worker = worker
        self._own = worker is None
        self.reports: list[RunReport] = []
        self._inst = cls()
        self._res: ResidentTaskArgs | None = None
        self._closed = False

    def _note(self, e: BaseException) -> None:
        if isinstance(e, Exception) and not any(self.label in n for n in getattr(e, "__notes__", ())):
            e.add_note(f"scene case {self.label}")

    def start(self) -> None:
        """Opens the worker, builds fixtures and golden, sets up the resident tensors."""
        try:
            self._start()
        except BaseException as e:
            self._note(e)
            raise

    def _start(self) -> None:
        cls, label, callable = self.cls, self.label, self.callable
        level = scene_level(cls) if _LEVEL_ATTR in cls.__dict__ else 2
        base = SceneTestCase.compare_outputs
        self._compare_as = cls.__dict__.get(_COMPARE_ATTR) or compare_style(cls, base)
        self._level = level
        if self._own:
            if self.platform == "cuda":
                # CI's GPU-less machines: device launches run through the fake's host kernels.
                fake_cuda.install_if_fake()
            self.worker = Worker(self.platform, **self.worker_options)
        args = self._inst.generate_args(self.params)
        if not isinstance(args, TaskArgsBuilder):
            raise ArgumentTypeError(
                f"{label}: generate_args must return a TaskArgsBuilder, not {type(args).__name__}"
            )
        callable.check_tensor_count(len(args.tensors()), f"{label}: generate_args")
        resident_specs = [t for t in args.tensors() if t.child_memory]
        if level == 3 and resident_specs:
            raise ArgumentError(
                f"{label}: child_memory is not supported at scene-test level 3 (multi-process): "
                f"{', '.join(t.name for t in resident_specs)}; declare them host-staged or use level 2"
            )
        self.args = args
        self.golden = None if self.skip else args.clone()
        self._res = ResidentTaskArgs.from_builder(self.worker, args, callable)
        self.plan = _plan(args, callable, self._res)
        self._initial = {n: np.array(_host(args[n]), copy=True) for n in self.plan.staged_outputs}
        self._evolving = bool(self.plan.resident_outputs)
        if self.golden is not None and not self._evolving:
            self._inst.compute_golden(self.golden, self.params)

    def round(self) -> RunReport:
        """Runs the next round (and checks it); returns its report."""
        __tracebackhide__ = True
        try:
            return self._round()
        except BaseException as e:
            self._note(e)
            raise

    def _round(self) -> RunReport:
        r = len(self.reports)
        if r > 0:
            for n, snap in self._initial.items():
                np.copyto(_host(self.args[n]), snap)
        assert self.worker is not None and self._res is not None, "start() first"
        report = self.worker.run(self.callable, self._res.bind(self.args))
        self.reports.append(report)
        self._step_golden(r, self._initial)
        return report

    def _step_golden(self, r: int, initial: Mapping[str, Any], merge: Any = None) -> None:
        """After round ``r``: an evolving golden (resident outputs) moves one ``compute_golden``
        forward from its ``initial`` staged values; otherwise the outputs (joined by ``merge``
        first, when given) are compared with the golden."""
        golden = self.golden
        if golden is None:
            return
        if self._evolving:
            if r > 0:
                for n, snap in initial.items():
                    np.copyto(_host(golden[n]), snap)
            self._inst.compute_golden(golden, self.params)
            return
        if merge is not None:
            merge()
        _compare(self, f"{self.label}, round {r + 1}/{self.rounds}")

    def finish(self) -> list[RunReport]:
        """After the last round: compares resident outputs (read back once); returns the reports."""
        __tracebackhide__ = True
        try:
            if self.golden is not None and self._evolving and self._res is not None:
                self._res.copy_back(self.args, self.plan.resident_outputs)
                n = len(self.reports)
                _compare(self, f"{self.label}, after {n} round(s) (resident outputs)")
        except BaseException as e:
            self._note(e)
            raise
        return self.reports

    def close(self, failed: bool = False) -> None:
        """Releases the resident set and closes the worker it opened. When ``failed``, a release
        failure is logged instead of raised (the first error is the one that matters)."""
        if self._closed:
            return
        self._closed = True
        close = self.worker.close if self._own and self.worker is not None else None
        release_then_close(self.label, self._res, close, failed)


def run_case(
    cls: type[SceneTestCase],
    case: Mapping[str, Any] | str,
    platform: str = "sim",
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
    cls: type[SceneTestCase],
    case: Mapping[str, Any] | str,
    platform: str = "sim",
    rounds: int = 1,
    skip_golden: bool = False,
    worker_options: Mapping[str, Any] | None = None,
    worker: Worker | None = None,
    *,
    devices: int | None = None,
    group: Any = None,
) -> CaseRun:
    """The round-by-round run of a case (not started): a :class:`CaseRun` on one device, a
    :class:`~simpler.testing.scene_group.GroupCaseRun` on several (or on ``group``); the
    arguments are :func:`run_case`'s."""
    if not (isinstance(cls, type) and issubclass(cls, SceneTestCase)):
        raise ArgumentTypeError("run_case: expected a SceneTestCase subclass")
    n = len(group) if group is not None and devices is None else case_devices(cls, case, devices)
    if group is None and n == 1:
        return CaseRun(cls, case, platform, rounds, skip_golden, worker_options, worker)
    label = f"{cls.__name__}::{_find_case(cls, case)['name']}"
    if worker is not None:
        raise ArgumentError(
            f"{label} runs on {n} devices, one process each; worker= is one device "
            "(pass devices=1 to run it there, or group= a DeviceGroup)"
        )
    from .scene_group import GroupCaseRun  # it builds on this module

    return GroupCaseRun(cls, case, platform, rounds, skip_golden, worker_options, group=group, devices=n)


# `TestX.run_case(case, ...)`: the same function, with the class bound.
SceneTestCase.run_case = classmethod(run_case)  # type: ignore[attr-defined]


def _compare(run: CaseRun, where: str) -> None:
    """Calls the case's ``compare_outputs`` the way its class declares it: ours with
    ``(actual, golden, params)``; upstream's with the output names too (every tensor at level 3,
    as upstream passes them there)."""
    inst, actual, golden = run._inst, run.args, run.golden
    try:
        if run._compare_as == "upstream":
            names = [t.name for t in actual.tensors()] if run._level == 3 else inst.output_names(actual)
            inst.compare_outputs(actual, golden, names, run.params)
        else:
            inst.compare_outputs(actual, golden, run.params)
    except AssertionError as e:
        e.add_note(f"scene case {where}")
        raise
