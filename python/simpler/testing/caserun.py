"""One case of a scene test on one device, round by round: :class:`CaseRun`, and the comparison
of a round's outputs with the golden that every run of a case makes (:func:`compare`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..args import ResidentTaskArgs, TaskArgsBuilder
from ..errors import ArgumentError, ArgumentTypeError
from ..worker import ArgDirection, Callable, RunReport, Worker
from ._cases import (
    check_scene_class,
    declared_compare,
    declared_level,
    find_case,
    host_fixture,
    release_then_close,
)

if TYPE_CHECKING:
    from .._core import _Platform
    from .scene import SceneTestCase

__all__ = ["CaseRun", "comparable", "compare"]


def comparable(v: Any) -> np.ndarray:
    """A fixture as numpy, bfloat16 and the fp8 kinds widened to float32 (as compared)."""
    arr = np.asarray(host_fixture(v))
    if arr.dtype.kind == "V" or arr.dtype.name.startswith(("bfloat", "float8", "float6", "float4")):
        return arr.astype(np.float32)
    return arr


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
        elif isinstance(host_fixture(t.value), np.ndarray):
            staged.append(t.name)
    return _Plan(staged, resident)


class CaseRun:
    """One case of a scene test, run round by round (what :func:`~simpler.testing.run_case` does
    in one call).

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
        platform: _Platform = "sim",
        rounds: int = 1,
        skip_golden: bool = False,
        worker_options: Mapping[str, Any] | None = None,
        worker: Worker | None = None,
    ):
        check_scene_class(cls)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ArgumentError(f"run_case: rounds must be a positive int, not {rounds!r}")
        self.cls = cls
        self.case = find_case(cls, case)
        callable_ = cls.CALLABLE
        if not isinstance(callable_, Callable):
            raise ArgumentTypeError(f"{cls.__name__}.CALLABLE must be a simpler.Callable")
        self.callable = callable_
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
        label, callable = self.label, self.callable
        self._declared()
        if self._own:
            if self.platform == "cuda":
                # CI's GPU-less machines: device launches run through the fake's host kernels.
                from .fake_kernels import install_if_fake

                install_if_fake()
            self.worker = Worker(self.platform, **self.worker_options)
        args = self._generate_args()
        resident_specs = [t for t in args.tensors() if t.child_memory]
        if self._level == 3 and resident_specs:
            raise ArgumentError(
                f"{label}: child_memory is not supported at scene-test level 3 (multi-process): "
                f"{', '.join(t.name for t in resident_specs)}; declare them host-staged or use level 2"
            )
        self.args = args
        self.golden = None if self.skip else args.clone()
        assert self.worker is not None  # given, or opened above
        self._res = ResidentTaskArgs.from_builder(self.worker, args, callable)
        self.plan = _plan(args, callable, self._res)
        self._initial = {n: np.array(host_fixture(args[n]), copy=True) for n in self.plan.staged_outputs}
        self._evolving = bool(self.plan.resident_outputs)
        if self.golden is not None and not self._evolving:
            self._inst.compute_golden(self.golden, self.params)

    def _declared(self) -> None:
        """The class's declared scene-test level and way of comparing outputs."""
        self._level = declared_level(self.cls)
        self._compare_as = declared_compare(self.cls)

    def _generate_args(self) -> TaskArgsBuilder:
        """The case's arguments (``generate_args``), checked against the callable's signature."""
        label = self.label
        args = self._inst.generate_args(self.params)
        if not isinstance(args, TaskArgsBuilder):
            raise ArgumentTypeError(
                f"{label}: generate_args must return a TaskArgsBuilder, not {type(args).__name__}"
            )
        self.callable.check_tensor_count(len(args.tensors()), f"{label}: generate_args")
        return args

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
                np.copyto(host_fixture(self.args[n]), snap)
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
                    np.copyto(host_fixture(golden[n]), snap)
            self._inst.compute_golden(golden, self.params)
            return
        if merge is not None:
            merge()
        compare(self, f"{self.label}, round {r + 1}/{self.rounds}")

    def finish(self) -> list[RunReport]:
        """After the last round: compares resident outputs (read back once); returns the reports."""
        __tracebackhide__ = True
        try:
            if self.golden is not None and self._evolving and self._res is not None:
                self._res.copy_back(self.args, self.plan.resident_outputs)
                n = len(self.reports)
                compare(self, f"{self.label}, after {n} round(s) (resident outputs)")
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


def compare(run: CaseRun, where: str) -> None:
    """Calls the case's ``compare_outputs`` the way its class declares it: ours with
    ``(actual, golden, params)``; upstream's with the output names too (every tensor at level 3,
    as upstream passes them there)."""
    inst, actual, golden = run._inst, run.args, run.golden
    assert golden is not None  # callers compare only when the golden is checked
    try:
        if run._compare_as == "upstream":
            names = [t.name for t in actual.tensors()] if run._level == 3 else inst.output_names(actual)
            inst.compare_outputs(actual, golden, names, run.params)
        else:
            inst.compare_outputs(actual, golden, run.params)
    except AssertionError as e:
        e.add_note(f"scene case {where}")
        raise
