"""The pytest plugin of simpler (registered as ``simpler`` through the ``pytest11`` entry point).

Once simpler is installed, ``pytest --simpler-platform sim --simpler-rounds 3`` collects the scene
tests (:func:`simpler.scene_test` classes) of any test module: each case is its own item
(``test_x.py::TestX::case``), so ``-k`` selects cases and a failure names its case.
``pytest -p no:simpler`` turns the plugin off.

Options (every one prefixed, so they never collide with another plugin's or a conftest's):
``--simpler-platform`` (sim, ascend or cuda; default sim), ``--simpler-rounds`` (default 1),
``--simpler-case`` (``Foo``, ``Class::Foo``, ``Class::``; unselected cases are deselected),
``--simpler-skip-golden``, ``--simpler-manual {exclude,include,only}`` (default exclude),
``--simpler-svm``, ``--simpler-staging``. Selection and skipping follow :mod:`simpler.testing.runner`,
the rules every front end shares. Each case records its run reports in the item's
``user_properties`` (``simpler_reports``: one JSON object per round), which junit XML
(``--junitxml``) carries. Loading the plugin twice (entry point and ``-p``/conftest) is harmless.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from . import runner, scene

#: The prefix of every option the plugin declares.
PREFIX = "simpler-"


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
    """Refuses worker options that do not fit the platform once, as a usage error (instead of
    failing every case)."""
    problem = _opts(config).check()
    if problem:
        raise pytest.UsageError(f"simpler: {problem}")


def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    """Collects a scene-test class defined in the module being collected."""
    if not scene.is_scene_test(obj):
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
    """One case of a scene test, run through :func:`simpler.testing.scene.run_case`."""

    def __init__(self, *, case: dict[str, Any], **kw: Any):
        super().__init__(**kw)
        self.case = case
        o = _opts(self.config)
        cls_name = self.scene_class.__name__
        named = runner.named_explicitly(cls_name, case["name"], o.cases)
        reason = runner.case_skip_reason(case, o.platform, o.manual, named, prefix=PREFIX)
        if reason is not None:
            self.add_marker(pytest.mark.skip(reason=reason))

    @property
    def scene_class(self) -> type[scene.SceneTestCase]:
        """The scene-test class of this case."""
        return self.parent.obj

    def runtest(self) -> None:
        """Runs the case on the configured platform and rounds; records the reports."""
        o = _opts(self.config)
        self.reports = scene.run_case(
            self.scene_class,
            self.case,
            platform=o.platform,
            rounds=o.rounds,
            skip_golden=o.skip_golden,
            worker_options=o.worker_options,
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
        return tb.cut(path=Path(scene.__file__)).filter(excinfo)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects scene cases that ``--simpler-case`` does not select."""
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
