"""The pytest plugin of simpler (registered as ``simpler`` through the ``pytest11`` entry point).

Once simpler is installed, ``pytest --simpler-platform sim --simpler-rounds 3`` collects the scene
tests (:func:`simpler.scene_test` classes) of any test module: each case is its own item
(``test_x.py::TestX::case``), so ``-k`` selects cases and a failure names its case.
``pytest -p no:simpler`` turns the plugin off.

Options (every one prefixed, so they never collide with another plugin's or a conftest's):
``--simpler-platform`` (sim, ascend or cuda; default sim), ``--simpler-rounds`` (default 1),
``--simpler-case`` (``Foo``, ``Class::Foo``, ``Class::``; unselected cases are deselected),
``--simpler-skip-golden``, ``--simpler-manual {exclude,include,only}`` (default exclude),
``--simpler-svm``, ``--simpler-staging``, ``--simpler-devices N`` (every case on N devices, one
process each; a case that cannot split across them is skipped, with the reason; without it a
case runs on the devices it declares). Selection and skipping follow :mod:`simpler.testing.runner`,
the rules every front end shares. Each case records its run reports in the item's
``user_properties`` (``simpler_reports``: one JSON object per round), which junit XML
(``--junitxml``) carries. Loading the plugin twice (entry point and ``-p``/conftest) is harmless.

For files ported from the upstream runtime (hw-native-sys/simpler) it also provides:

* fixtures ``st_platform`` (the ``--simpler-platform`` value, in our names: ``sim``, not
  ``a2a3sim``) and ``st_device_ids`` (``[0]``, or ``[0, ..., n-1]`` under
  ``@pytest.mark.device_count(n)``; there is no device option: ids start at 0);
* markers ``platforms``, ``manual``, ``device_count`` and ``runtime``, registered so that
  ``--strict-markers`` accepts them. On a plain test function (not a scene case, whose
  ``CASES`` say this), ``@pytest.mark.platforms(["a2a3sim", "a2a3"])`` skips the test when the
  selected platform is not listed (upstream names mapped, an unknown name errors the test), and
  ``@pytest.mark.manual`` / ``manual("a2a3sim")`` / ``manual(platforms=[...])`` skips it under
  ``--simpler-manual exclude`` on those platforms. ``runtime`` has no effect (one runtime here).

When the session selected scene cases (or ``platforms``-marked tests) and none of them runs
because they do not list the platform, the terminal summary ends with a ``simpler`` section
saying so (not a warning: under ``-W error`` a warning from a session hook is an internal error,
and the summary line is where the skip counts are read).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from ..errors import ArgumentError, ArgumentTypeError
from . import _cases, runner, running

if TYPE_CHECKING:
    from .scene import SceneTestCase

#: The prefix of every option the plugin declares.
PREFIX = "simpler-"

#: Markers registered for files ported from the upstream runtime (name: ``--markers`` line).
MARKERS = {
    "platforms": "platforms(names): run this test only on these platforms (upstream names such as "
    "a2a3sim map to ours); others skip it",
    "manual": "manual(platforms=None): a manual test (on those platforms only, when given); skipped "
    "under --simpler-manual exclude",
    "device_count": "device_count(n): the test uses n devices (st_device_ids gives [0, ..., n-1])",
    "runtime": "runtime(name): upstream's runtime name; no effect here (one runtime)",
}

_NOTE = pytest.StashKey[str]()
_MARKER_ERROR = pytest.StashKey[Exception]()
_CASE = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declares the scene-test options (once, however often the plugin is loaded)."""
    group = parser.getgroup("simpler", "simpler scene tests")

    def add(*flags: str, **kw: Any) -> None:
        try:
            group.addoption(*flags, **kw)
        except ValueError as e:  # already added by another registration of this plugin
            if "already added" not in str(e):
                raise

    runner.add_runner_arguments(add, prefix=PREFIX)


def _opts(config: pytest.Config) -> runner.RunnerOptions:
    return runner.RunnerOptions.from_getter(config.getoption)


def pytest_configure(config: pytest.Config) -> None:
    """Registers the upstream markers; refuses worker options that do not fit the platform once,
    as a usage error (instead of failing every case)."""
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    problem = _opts(config).check()
    if problem:
        raise pytest.UsageError(f"simpler: {problem}")


@pytest.fixture(scope="session")
def st_platform(pytestconfig: pytest.Config) -> str:
    """The platform of this session (``--simpler-platform``: ``sim``, ``ascend`` or ``cuda``),
    upstream's fixture of the same name (which gives upstream names such as ``a2a3sim``)."""
    return _opts(pytestconfig).platform


@pytest.fixture
def st_device_ids(request: pytest.FixtureRequest) -> list[int]:
    """The device ids of this test: ``[0]``, or ``[0, ..., n-1]`` under
    ``@pytest.mark.device_count(n)`` (upstream's fixture allocates them from ``--device``)."""
    m = request.node.get_closest_marker("device_count")
    if m is None:
        return [0]
    n = m.args[0] if m.args else m.kwargs.get("n", m.kwargs.get("count"))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"device_count marker: a positive int, not {n!r}")
    return list(range(n))


def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    """Collects a scene-test class defined in the module being collected."""
    if not _cases.is_scene_test(obj):
        return None
    module = getattr(collector, "obj", None)
    if getattr(obj, "__module__", None) != getattr(module, "__name__", object()):
        return []  # imported from elsewhere: collected where it is defined
    return SceneClass.from_parent(collector, name=name, obj=obj)


class SceneClass(pytest.Class):
    """A scene-test class: one :class:`SceneCase` item per selected entry of ``CASES``."""

    def collect(self) -> list[pytest.Item]:
        """One item per case (``--simpler-case`` deselects the others, see below)."""
        return [SceneCase.from_parent(self, name=case["name"], case=case) for case in self.obj.CASES]


class SceneCase(pytest.Item):
    """One case of a scene test, run through :func:`simpler.testing.run_case`."""

    def __init__(self, *, case: dict[str, Any], **kw: Any):
        super().__init__(**kw)
        self.case = case
        o = _opts(self.config)
        cls_name = self.scene_class.__name__
        named = runner.named_explicitly(cls_name, case["name"], o.cases)
        reason = runner.case_skip_reason(
            case, o.platform, o.manual, named, prefix=PREFIX, cls=self.scene_class, devices=o.devices
        )
        if reason is not None:
            self.add_marker(pytest.mark.skip(reason=reason))

    @property
    def scene_class(self) -> type[SceneTestCase]:
        """The scene-test class of this case."""
        # A case item's parent is the class collector pytest_pycollect_makeitem made it under.
        return cast("pytest.Class", self.parent).obj

    def runtest(self) -> None:
        """Runs the case on the configured platform and rounds; records the reports."""
        o = _opts(self.config)
        self.reports = running.run_case(
            self.scene_class,
            self.case,
            platform=o.platform,
            rounds=o.rounds,
            skip_golden=o.skip_golden,
            worker_options=o.worker_options,
            devices=o.devices,
        )
        rounds = [{"round": i + 1, **r.to_dict()} for i, r in enumerate(self.reports)]
        self.user_properties.append(("simpler_reports", json.dumps(rounds, sort_keys=True)))

    def reportinfo(self) -> tuple[Any, int, str]:
        """Location (the class's line) and name shown in reports."""
        try:
            line = inspect.getsourcelines(self.scene_class)[1] - 1
        except (OSError, TypeError):
            line = 0
        return self.path, line, f"{self.scene_class.__name__}::{self.name}"

    def _traceback_filter(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:
        """Starts failure tracebacks at the scene runner (not pytest's own frames)."""
        tb = excinfo.traceback
        return tb.cut(path=Path(running.__file__)).filter(excinfo)


def _marker_platforms(m: pytest.Mark, item: pytest.Item) -> list[str] | None:
    """The platforms a ``platforms`` / ``manual`` marker names, in our names: one list argument,
    several string arguments or ``platforms=``; ``None`` when it names none (a bare ``manual``:
    manual everywhere)."""
    v = m.kwargs["platforms"] if "platforms" in m.kwargs else m.args
    if isinstance(v, tuple) and len(v) == 1 and not isinstance(v[0], str):
        v = v[0]  # platforms(["a2a3sim", "a2a3"])
    if v is None or (isinstance(v, (list, tuple)) and not v and m.name == "manual"):
        return None
    names = [v] if isinstance(v, str) else v
    if not isinstance(names, (list, tuple, set, frozenset)):
        raise ArgumentTypeError(f"{item.nodeid}: {m.name} marker: a list of platform names, not {v!r}")
    return _cases.platform_list(names, f"{item.nodeid}: {m.name} marker: ")


def _marker_case(item: pytest.Item) -> dict[str, Any] | None:
    """A plain test's ``platforms`` / ``manual`` markers as a case (``None``: it has neither)."""
    plats, manual = item.get_closest_marker("platforms"), item.get_closest_marker("manual")
    if plats is None and manual is None:
        return None
    case: dict[str, Any] = {"name": item.name}
    if plats is not None:
        case["platforms"] = _marker_platforms(plats, item) or []
    if manual is not None:
        on = _marker_platforms(manual, item)
        case["manual"] = True if on is None else tuple(on)
    return case


def _plain_skip(item: pytest.Item, case: dict[str, Any], o: runner.RunnerOptions) -> str | None:
    """Why a plain test with upstream markers skips on this platform (``None``: it runs)."""
    if not runner.case_runs_on(case, o.platform):
        return f"test runs on {', '.join(case['platforms']) or 'no platform'}, not {o.platform}"
    if o.manual == "exclude" and _cases.manual_on(case, o.platform):
        return f"manual test (run with --{PREFIX}manual include)"
    return None


def _ported(item: pytest.Item) -> bool:
    """Whether a plain test is a scene-test module's (ported from the upstream runtime): it asks
    for ``st_platform`` / ``st_device_ids``, or its module defines a scene test. The plugin loads
    wherever simpler is installed; other projects' ``manual`` / ``platforms`` markers are theirs."""
    if {"st_platform", "st_device_ids"} & set(getattr(item, "fixturenames", ())):
        return True
    module = getattr(item, "module", None)
    return module is not None and any(_cases.is_scene_test(v) for v in vars(module).values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Applies the ``platforms`` / ``manual`` markers of plain tests in scene-test modules (a
    skip); deselects scene cases that ``--simpler-case`` does not select."""
    o = _opts(config)
    for item in items:
        if isinstance(item, SceneCase) or not _ported(item):
            continue
        try:
            case = _marker_case(item)
        except (ArgumentError, ArgumentTypeError, TypeError) as e:
            item.stash[_MARKER_ERROR] = e
            continue
        if case is None:
            continue
        item.stash[_CASE] = case
        reason = _plain_skip(item, case, o)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
    selectors = config.getoption("simpler_case", None)
    if not selectors:
        return
    keep, drop = [], []
    for item in items:
        if isinstance(item, SceneCase) and not runner.case_selected(
            item.scene_class.__name__, item.name, selectors
        ):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Errors a plain test whose ``platforms`` / ``manual`` marker names an unknown platform."""
    err = item.stash.get(_MARKER_ERROR, None)
    if err is not None:
        raise err


def pytest_collection_finish(session: pytest.Session) -> None:
    """Notes, for the terminal summary, a session in which no selected scene case (or
    ``platforms``-marked test) runs and some are skipped for the platform."""
    if session.config.option.collectonly:
        return  # nothing runs anyway
    o = _opts(session.config)
    cases, ran = [], 0
    for item in session.items:
        if isinstance(item, SceneCase):
            case = item.case
            named = runner.named_explicitly(item.scene_class.__name__, case["name"], o.cases)
            reason = runner.case_skip_reason(
                case, o.platform, o.manual, named, cls=item.scene_class, devices=o.devices
            )
            runs = reason is None
        elif _CASE in item.stash:
            case = item.stash[_CASE]
            runs = _plain_skip(item, case, o) is None
        else:
            continue
        cases.append(case)
        ran += runs
    note = runner.nothing_ran_note(cases, ran, o.platform)
    if note:
        session.config.stash[_NOTE] = note


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Ends the summary with the note of :func:`pytest_collection_finish`, when there is one."""
    note = config.stash.get(_NOTE, None)
    if note:
        terminalreporter.section("simpler", sep="=", yellow=True, bold=True)
        terminalreporter.write_line(f"WARNING: {note}", yellow=True, bold=True)
