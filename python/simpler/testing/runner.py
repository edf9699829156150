"""The one case runner: options, case selection and the standalone ``main``.

Three front ends run scene-test cases — the standalone runner (``python test_x.py ...``,
:func:`main`), the pytest plugin (:mod:`simpler.testing.pytest_plugin`) and the bench (``simpler bench``)
— and all three declare their options with :func:`add_runner_arguments` and choose cases with
:func:`plan_cases`, so an option or a rule means the same thing everywhere:

* ``--case`` selects cases by ``Foo``, ``Class::Foo`` or ``Class::`` (repeatable,
  comma-separated); without it every case is selected.
* A case whose ``platforms`` exclude ``--platform`` is skipped, with the reason (upstream
  platform names in a case are mapped to ours when its class is decorated).
* A **manual** case runs under ``--manual include`` or ``--manual only``, or when ``--case``
  names it (by name or ``Class::name``; ``Class::`` alone does not name a case). ``manual``
  may name the platforms on which the case is manual (a regular case elsewhere).
* ``--devices N`` runs every selected case on ``N`` devices (one process each; see
  :mod:`simpler.testing.scene_group`); without it a case runs on the devices it declares
  (``devices``, or its class's ``DEVICES``; default 1). A case that cannot split its arguments
  across devices is skipped under ``--devices N > 1``, with the reason.
* A run in which no selected case ran and some were skipped for the platform says so
  (:func:`nothing_ran_note`): the standalone runner prints it, the pytest plugin adds it to the
  terminal summary.

The pytest plugin declares the same options with a ``simpler-`` prefix (``--simpler-platform``,
``--simpler-rounds``, ...), so they never collide with another plugin's or a conftest's options.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable as Fn
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ArgumentError, ArgumentTypeError
from ._cases import (
    PLATFORM_ALIASES,
    can_split,
    case_devices,
    case_platforms,
    is_scene_test,
    manual_on,
    platform_name,
)
from .running import run_case

if TYPE_CHECKING:  # the class this runner runs; its module runs cases through this one
    from .._core import _Platform
    from .scene import SceneTestCase

__all__ = [
    "PLATFORMS",
    "PlannedCase",
    "RunnerOptions",
    "add_runner_arguments",
    "case_runs_on",
    "case_selected",
    "case_skip_reason",
    "main",
    "nothing_ran_note",
    "plan_cases",
    "scene_classes",
]

#: The platforms a worker can be opened on (the native core's list).
PLATFORMS = tuple(_core.PLATFORMS)


def parse_svm(v: str | None) -> str | int | None:
    """``--svm``: ``always``, ``never`` or a minimum number of bytes (parsed by the native core,
    the one parser of the option)."""
    if v is None:
        return None
    try:
        return _core.parse_svm(v)
    except ArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_rounds(v: str) -> int:
    """``--rounds``: a positive int."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, not {v!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, not {v!r}")
    return n


def parse_devices(v: str) -> int:
    """``--devices``: a positive int (as ``--rounds``)."""
    return parse_rounds(v)


def worker_options(
    svm: str | int | None = None,
    staging: str | None = None,
    model: str | Sequence[str] | None = None,
    view_policy: str | None = None,
) -> dict[str, Any]:
    """The ``Worker`` keyword options from runner flags (only those given); several models (a
    repeated ``--model``) become one comma-separated ``model``, the first being the primary."""
    if model is not None and not isinstance(model, str):
        model = ",".join(model) or None
    given = {"svm": svm, "staging": staging, "model": model, "view_policy": view_policy}
    return {k: v for k, v in given.items() if v is not None}


@dataclass
class RunnerOptions:
    """What a run of cases was asked for (the parsed runner options)."""

    platform: _Platform = "sim"
    rounds: int = 1
    cases: list[str] | None = None
    skip_golden: bool = False
    manual: str = "exclude"
    worker_options: dict[str, Any] = field(default_factory=dict)
    devices: int | None = None

    def check(self) -> str | None:
        """Why the worker options do not fit the platform (a sim option on a vendor platform,
        an unknown model, ...), checked without opening a device; ``None`` when they fit."""
        try:
            _core.check_worker_options(self.platform, **self.worker_options)
        except (ArgumentError, ArgumentTypeError) as e:
            return str(e)
        return None

    @classmethod
    def from_getter(cls, get: Fn[[str], Any]) -> RunnerOptions:
        """From ``get(dest)`` over the destinations :func:`add_runner_arguments` declares."""
        return cls(
            platform=get("simpler_platform"),
            rounds=get("simpler_rounds"),
            cases=get("simpler_case"),
            skip_golden=get("simpler_skip_golden"),
            manual=get("simpler_manual"),
            worker_options=worker_options(
                get("simpler_svm"), get("simpler_staging"), get("simpler_model"), get("simpler_view_policy")
            ),
            devices=get("simpler_devices"),
        )


def add_runner_arguments(add: Fn[..., Any], prefix: str = "", rounds: int = 1) -> None:
    """Declares the runner options through ``add(*flags, dest=..., **argparse_kwargs)``.

    ``prefix`` goes in front of every long flag (the pytest plugin uses ``"simpler-"``); the
    short ``-p`` exists only without one. Every option's ``dest`` is ``simpler_<name>``, so
    :meth:`RunnerOptions.from_getter` reads them back the same way everywhere. ``rounds`` is the
    default round count.
    """

    def flag(name: str, *short: str, **kw: Any) -> None:
        flags = ((*short,) if not prefix else ()) + (f"--{prefix}{name}",)
        add(*flags, dest="simpler_" + name.replace("-", "_"), **kw)

    flag(
        "platform",
        "-p",
        default="sim",
        choices=PLATFORMS,
        help="platform to run on: sim, ascend or cuda (default sim)",
    )
    flag("rounds", type=parse_rounds, default=rounds, metavar="N", help=f"rounds per case (default {rounds})")
    flag(
        "case",
        action="append",
        default=None,
        metavar="CASE",
        help="select cases: 'Foo', 'Class::Foo' or 'Class::' (repeatable, comma-separated)",
    )
    flag(
        "devices",
        type=parse_devices,
        default=None,
        metavar="N",
        help="run every case on N devices, one process each (default: as each case declares)",
    )
    flag("skip-golden", action="store_true", default=False, help="run without golden validation")
    flag(
        "manual",
        choices=("exclude", "include", "only"),
        default="exclude",
        help="manual cases: exclude (default; run when --case names them), include, or only them",
    )
    flag(
        "svm",
        type=parse_svm,
        default=None,
        metavar="{always,never,BYTES}",
        help="sim map_host policy: always, never or min bytes",
    )
    flag("staging", choices=_core.STAGING_MODES, default=None, help="staging path: arena (default) or fresh")
    flag(
        "model",
        action="append",
        choices=_core.MODELS,
        default=None,
        help="sim: price every driver call, mapped access and kernel with a hardware cost model "
        "(repeatable: one run priced under each, the first being the primary model)",
    )
    flag(
        "view-policy",
        choices=_core.VIEW_POLICIES,
        default=None,
        help="how resident (and read-heavy staged) tensors are reached from the host (default auto)",
    )


def _selectors(selectors: Iterable[str] | None) -> list[str]:
    return [s.strip() for sel in (selectors or ()) for s in sel.split(",") if s.strip()]


def _matches(cls_name: str, names: Sequence[str], selectors: Iterable[str] | None, wildcard: bool) -> bool:
    """Whether a selector names one of ``names`` (``Foo`` or ``Class::Foo``), or, with
    ``wildcard``, is ``Class::`` for the case's class."""
    for s in _selectors(selectors):
        c, sep, n = s.partition("::")
        if (sep and c == cls_name and (n in names or (wildcard and n == ""))) or (not sep and s in names):
            return True
    return False


def case_selected(
    cls_name: str, case_name: str, selectors: Iterable[str] | None, aliases: Sequence[str] = ()
) -> bool:
    """Whether ``--case`` selectors (``Foo``, ``Class::Foo``, ``Class::``) select a case (by its
    name or one of its ``aliases``, e.g. the bench's case name without the arm)."""
    if not _selectors(selectors):
        return True
    return _matches(cls_name, (case_name, *aliases), selectors, wildcard=True)


def named_explicitly(
    cls_name: str, case_name: str, selectors: Iterable[str] | None, aliases: Sequence[str] = ()
) -> bool:
    """Whether a selector names the case itself (``Foo`` or ``Class::Foo``, not ``Class::``)."""
    return _matches(cls_name, (case_name, *aliases), selectors, wildcard=False)


def case_skip_reason(
    case: Mapping[str, Any],
    platform: str,
    manual: str = "exclude",
    named: bool = False,
    prefix: str = "",
    *,
    cls: type[SceneTestCase] | None = None,
    devices: int | None = None,
) -> str | None:
    """Why a case does not run on ``platform`` under ``manual`` (``None`` when it runs): first
    its ``platforms``, then whether it is manual on ``platform``, then (given its class ``cls``
    and ``--devices``) whether it can split across that many devices. ``named``: ``--case``
    names this case, which runs a manual case under ``exclude``. ``prefix``: the front end's
    option prefix, for the message."""
    if not case_runs_on(case, platform):
        plats = case_platforms(case) or []
        return f"case runs on {', '.join(plats) or 'no platform'}, not {platform}"
    is_manual = manual_on(case, platform)
    if manual == "exclude" and is_manual and not named:
        on = "" if isinstance(case.get("manual"), bool) else f" on {platform}"
        return f"manual case{on} (run with --{prefix}manual include, or name it with --{prefix}case)"
    if manual == "only" and not is_manual:
        return f"not a manual case (--{prefix}manual only)"
    if cls is not None and devices is not None and devices > 1 and not can_split(cls):
        return (
            f"cannot run on {devices} devices (--{prefix}devices): {cls.__name__} does not say how its "
            "arguments split (SPLIT or split_args)"
        )
    return None


def case_runs_on(case: Mapping[str, Any], platform: str) -> bool:
    """Whether a case's ``platforms`` include ``platform`` (no ``platforms``: every platform)."""
    plats = case_platforms(case)
    return plats is None or platform_name(platform) in plats


def nothing_ran_note(cases: Sequence[Mapping[str, Any]], ran: int, platform: str) -> str | None:
    """The warning for a run of the selected ``cases`` of which ``ran`` ran: when none ran and
    at least one was skipped because its ``platforms`` exclude ``platform`` (easy to miss in a
    list of skips: an upstream file's cases name ``a2a3sim`` / ``a2a3``, which are ``sim`` /
    ``ascend`` here). ``None`` when there is nothing to say."""
    off = [c for c in cases if not case_runs_on(c, platform)]
    if ran or not off:
        return None
    declared: list[str] = []
    for c in off:
        declared += [p for p in case_platforms(c) or [] if p not in declared]
    aliases = ", ".join(f"{k} -> {v}" for k, v in PLATFORM_ALIASES.items())
    return (
        f"no scene case ran on platform {platform}: {len(off)} of the {len(cases)} selected "
        f"case(s) do not list it in their 'platforms' (they list {', '.join(declared) or 'none'}; "
        f"upstream names map {aliases})"
    )


@dataclass
class PlannedCase:
    """A selected case and why it is skipped (``None``: it runs)."""

    cls: type[SceneTestCase]
    case: Mapping[str, Any]
    skip: str | None

    @property
    def label(self) -> str:
        """``Class::case``."""
        return f"{self.cls.__name__}::{self.case['name']}"


def plan_cases(
    classes: Iterable[type[SceneTestCase]],
    opts: RunnerOptions,
    aliases: Fn[[Mapping[str, Any]], Sequence[str]] = lambda case: (),
) -> list[PlannedCase]:
    """The cases ``opts`` selects, in order, each with its skip reason (see the module doc)."""
    out = []
    for cls in classes:
        for case in cls.CASES:
            al = aliases(case)
            if not case_selected(cls.__name__, case["name"], opts.cases, al):
                continue
            named = named_explicitly(cls.__name__, case["name"], opts.cases, al)
            reason = case_skip_reason(case, opts.platform, opts.manual, named, cls=cls, devices=opts.devices)
            out.append(PlannedCase(cls, case, reason))
    return out


def unknown_case_message(classes: Iterable[type[SceneTestCase]], selectors: Sequence[str]) -> str:
    """The error for ``--case`` selectors that match nothing, listing the cases there are."""
    known = [f"{c.__name__}::{case['name']}" for c in classes for case in c.CASES]
    shown = ", ".join(known[:40]) + (f", ... ({len(known)} in all)" if len(known) > 40 else "")
    return f"no case matches --case {' '.join(selectors)}; the cases are: {shown or 'none'}"


def scene_classes(module: Any) -> list[type[SceneTestCase]]:
    """The scene-test classes defined in ``module`` (in definition order)."""
    name = getattr(module, "__name__", None)
    return [
        obj
        for obj in vars(module).values()
        if is_scene_test(obj) and getattr(obj, "__module__", None) == name
    ]


def main(argv: Sequence[str] | None = None, module: Any = None) -> int:
    """Standalone runner: ``python test_x.py -p sim --rounds 3 --case Foo --skip-golden ...``.

    Runs every selected case of the scene tests defined in ``module`` (default ``__main__``),
    prints one line per case, and exits (``SystemExit``): 0 when every case passed, 1 when one
    failed, 2 on a usage error (including ``--case`` matching nothing, which lists the cases).
    When nothing ran because the cases do not list the platform, a ``WARNING:`` line on stderr
    says so (:func:`nothing_ran_note`). Upstream's ``SceneTestCase.run_module(__name__)`` is this
    function.
    """
    parser = argparse.ArgumentParser(description="Run the scene tests of this file.")
    add_runner_arguments(parser.add_argument)
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failures")
    ns = parser.parse_args(argv)
    opts = RunnerOptions.from_getter(lambda dest: getattr(ns, dest))
    problem = opts.check()
    if problem:
        parser.error(problem)
    if module is None:
        module = sys.modules["__main__"]
    classes = scene_classes(module)
    planned = plan_cases(classes, opts)
    if opts.cases and not planned:
        parser.error(unknown_case_message(classes, opts.cases))
    n_pass = n_fail = n_skip = 0
    for p in planned:
        if p.skip is not None:
            n_skip += 1
            print(f"SKIP {p.label}: {p.skip}")
            continue
        t0 = time.perf_counter()
        try:
            reports = run_case(
                p.cls,
                p.case,
                opts.platform,
                opts.rounds,
                opts.skip_golden,
                opts.worker_options,
                devices=opts.devices,
            )
        except Exception as e:
            n_fail += 1
            print(f"FAIL {p.label}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}")
            if ns.verbose:
                traceback.print_exc()
            continue
        n_pass += 1
        dt = time.perf_counter() - t0
        n = case_devices(p.cls, p.case, opts.devices)
        on = f", {n} devices" if n > 1 else ""
        print(f"PASS {p.label} ({len(reports)} round(s){on}, {dt * 1e3:.1f} ms)")
    where = f"platform {opts.platform}, rounds {opts.rounds}"
    if opts.devices is not None:
        where += f", devices {opts.devices}"
    print(f"{n_pass} passed, {n_fail} failed, {n_skip} skipped ({where})")
    note = nothing_ran_note([p.case for p in planned], n_pass + n_fail, opts.platform)
    if note:
        print(f"WARNING: {note}", file=sys.stderr)
    raise SystemExit(1 if n_fail else 0)
