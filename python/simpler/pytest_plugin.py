"""The pytest plugin of simpler (registered through the ``pytest11`` entry point).

Once simpler is installed, ``pytest --platform sim --rounds 3`` collects the scene tests
(:func:`simpler.scene_test` classes) of any test module: each case is its own item
(``test_x.py::TestX::case``), so ``-k`` selects cases and a failure names its case.

Options: ``--platform`` (default sim), ``--rounds`` (default 1), ``--case`` (``Foo``,
``Class::Foo``, ``Class::``; unselected cases are deselected), ``--skip-golden``,
``--manual {exclude,include,only}`` (default exclude), ``--svm``, ``--staging``. A case whose
``platforms`` exclude the current platform, and a manual case under ``--manual exclude``, is
skipped with the reason. Loading the plugin twice (entry point and ``-p``/conftest) is harmless.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from . import scene

_DESTS = {
    "--platform": "simpler_platform",
    "--rounds": "simpler_rounds",
    "--case": "simpler_case",
    "--skip-golden": "simpler_skip_golden",
    "--manual": "simpler_manual",
    "--svm": "simpler_svm",
    "--staging": "simpler_staging",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declares the scene-test options (once, however often the plugin is loaded)."""
    group = parser.getgroup("simpler", "simpler scene tests")

    def add(*flags: str, **kw: Any) -> None:
        long = next(f for f in flags if f.startswith("--"))
        kw["dest"] = _DESTS[long]
        flags = tuple(f for f in flags if f.startswith("--"))  # no short flags: -p is pytest's own
        try:
            group.addoption(*flags, **kw)
        except ValueError as e:  # already added by another registration of this plugin
            if "already added" not in str(e):
                raise

    scene.add_runner_arguments(add)


def _opts(config: pytest.Config) -> dict[str, Any]:
    return {
        "platform": config.getoption("simpler_platform"),
        "rounds": config.getoption("simpler_rounds"),
        "case": config.getoption("simpler_case"),
        "skip_golden": config.getoption("simpler_skip_golden"),
        "manual": config.getoption("simpler_manual"),
        "worker_options": scene.worker_options(
            config.getoption("simpler_svm"), config.getoption("simpler_staging")
        ),
    }


def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    """Collects a scene-test class defined in the module being collected."""
    if not scene.is_scene_test(obj):
        return None
    module = getattr(collector, "obj", None)
    if getattr(obj, "__module__", None) != getattr(module, "__name__", object()):
        return []  # imported from elsewhere: collected where it is defined
    return SceneClass.from_parent(collector, name=name, obj=obj)


class SceneClass(pytest.Class):
    """A scene-test class: one :class:`SceneCase` item per entry of ``CASES``."""

    def collect(self) -> list[pytest.Item]:
        """One item per case."""
        return [SceneCase.from_parent(self, name=case["name"], case=case) for case in self.obj.CASES]


class SceneCase(pytest.Item):
    """One case of a scene test, run through :func:`simpler.scene.run_case`."""

    def __init__(self, *, case: dict[str, Any], **kw: Any):
        super().__init__(**kw)
        self.case = case
        opts = _opts(self.config)
        reason = scene.case_skip_reason(case, opts["platform"], opts["manual"])
        if reason is not None:
            self.add_marker(pytest.mark.skip(reason=reason))

    @property
    def scene_class(self) -> type[scene.SceneTestCase]:
        """The scene-test class of this case."""
        return self.parent.obj

    def runtest(self) -> None:
        """Runs the case on the configured platform and rounds."""
        o = _opts(self.config)
        self.reports = scene.run_case(
            self.scene_class,
            self.case,
            platform=o["platform"],
            rounds=o["rounds"],
            skip_golden=o["skip_golden"],
            worker_options=o["worker_options"],
        )

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
    """Deselects scene cases that ``--case`` does not select."""
    selectors = config.getoption("simpler_case", None)
    if not selectors:
        return
    keep, drop = [], []
    for item in items:
        if isinstance(item, SceneCase) and not scene.case_selected(
            item.scene_class.__name__, item.name, selectors
        ):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
