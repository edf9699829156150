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

import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..args import TaskArgsBuilder
from ..errors import ArgumentError, ArgumentTypeError
from ..worker import ArgDirection, Callable, Worker
from . import runner
from ._cases import (
    COMPARE_ATTR,
    LEVEL_ATTR,
    PLATFORM_ALIASES,
    RUNTIME_ATTR,
    can_split,
    case_devices,
    case_platforms,
    check_devices,
    check_split,
    compare_style,
    is_scene_test,
    manual_on,
    merge_by_axes,
    platform_list,
    platform_name,
    scene_base,
    scene_level,
    scene_runtime,
    split_by_axes,
    validate_case,
)
from .caserun import CaseRun, comparable
from .running import case_run, run_case

if TYPE_CHECKING:
    from .._core import _Platform

__all__ = [
    "PLATFORM_ALIASES",
    "CaseRun",
    "SceneTestCase",
    "SceneTestWarning",
    "can_split",
    "case_devices",
    "case_platforms",
    "case_run",
    "is_scene_test",
    "manual_on",
    "platform_list",
    "platform_name",
    "run_case",
    "scene_level",
    "scene_runtime",
    "scene_test",
]


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

    #: What the harness below this module recognises scene tests by (``_cases.scene_base``).
    _scene_test_base = True

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
            a, g = comparable(actual[name]), comparable(golden[name])
            np.testing.assert_allclose(a, g, rtol=self.RTOL, atol=self.ATOL, err_msg=f"output '{name}'")

    @staticmethod
    def run_module(module_name: str, argv: Sequence[str] | None = None) -> NoReturn:
        """Runs the scene tests of module ``module_name`` standalone and exits: upstream's entry
        point, ``if __name__ == "__main__": SceneTestCase.run_module(__name__)``.

        The same runner as ``sp.main()`` (:func:`simpler.testing.runner.main`): its options
        (``-p sim --rounds 3 --case Foo ...``) come from ``argv`` (default ``sys.argv[1:]``),
        and it raises ``SystemExit`` (0 all passed, 1 a failure, 2 a usage error).
        """
        module = sys.modules.get(module_name) if isinstance(module_name, str) else None
        if module is None:
            raise ArgumentError(f"run_module: no imported module named {module_name!r} (pass __name__)")
        runner.main(argv, module=module)
        raise SystemExit(0)  # not reached: main always exits

    @classmethod
    def run_case(
        cls,
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
        """:func:`~simpler.testing.run_case` with this class: ``TestX.run_case("small", "sim", 3)``."""
        __tracebackhide__ = True
        return run_case(
            cls, case, platform, rounds, skip_golden, worker_options, worker, devices=devices, group=group
        )


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

    def deco(cls: type[SceneTestCase]) -> type[SceneTestCase]:
        if scene_base(cls) is not SceneTestCase:
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
        setattr(cls, LEVEL_ATTR, int(level))
        setattr(cls, RUNTIME_ATTR, runtime)
        setattr(cls, COMPARE_ATTR, compare)
        return cls

    return deco
