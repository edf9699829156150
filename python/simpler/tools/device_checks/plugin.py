"""The device check's pytest plugin: runs the check modules of this package as pytest tests and
writes their figures as JSON lines.

``python -m simpler.tools.device_check`` runs the preflight, then ``pytest.main`` with the
arguments of :func:`main_args` (the check modules by path, ``-p
simpler.tools.device_checks.plugin``, no configuration file, no conftest, no plugins loaded
from entry points, output not captured, pytest's own terminal report off: the plugin prints
the run) and a :class:`PreflightFacts` carrying the preflight's facts. Loaded without those facts
(``pytest -p simpler.tools.device_checks.plugin --device-check-out DIR ...``) the plugin runs
the preflight itself when the session starts.

Options: ``--device-check-out DIR`` (required: without it the plugin does nothing),
``--device-check-platform`` (cuda, ascend or sim; default cuda), ``--device-check-quick``
(small sizes, the Small cases in the bench), ``--device-check-only TEXT`` (repeatable: only
the checks whose name contains TEXT, and ``driver.open``; the others are deselected).

A check is a test function with the marker ``device_check(name)``; ``name`` is a format string
filled with the test's parameters (``"bench.paged_attention[{bench_case}]"``), and the check's
name is also a keyword (``-k`` matches it). It takes the fixtures ``ctx`` (the session's
:class:`~simpler.tools.device_checks.common.Context`) and ``figures`` (a dict it fills: figure
name -> value, recorded when the check passes); ``pytest.skip(reason)`` skips it.

``DIR/device_check.jsonl`` gets a ``kind: "run"`` line first (versions, driver, host, the
preflight's facts under ``preflight``), then per check a ``kind: "check"`` line (``name``,
``status``: passed, failed or skipped, ``ok``: not failed, ``seconds``, ``figures``, ``error``,
``skip_reason``) followed by one ``kind: "figure"`` line per figure (``check``, ``name``,
``value`` and where it was measured), and a ``kind: "summary"`` line last (the counts and the
seconds). A check module that does not import is recorded as a failed check named
``collect <module>``.
"""

from __future__ import annotations

import json
import os
import platform as _platform
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import pytest

from ... import __version__
from .. import preflight
from .common import (
    Context,
    Figures,
    driver_info,
    fake_first,
    figure_context,
    install_if_fake,
    register_fake_impls,
)

__all__ = ["CHECK_MODULES", "DeviceCheckRun", "PreflightFacts", "check_paths", "main_args"]

#: The check modules of this package, in the order they run.
CHECK_MODULES = ("check_driver", "check_workloads", "check_device")

#: The name the run is registered under with pytest's plugin manager.
RUN_PLUGIN = "simpler-device-check-run"

#: The check that runs whatever ``--device-check-only`` says: whether the device opens at all.
ALWAYS = "driver.open"


def check_paths() -> list[str]:
    """The paths of the check modules (:data:`CHECK_MODULES`), beside this module."""
    here = Path(__file__).resolve().parent
    return [str(here / f"{m}.py") for m in CHECK_MODULES]


def main_args(platform: str, out: Path, quick: bool = False, only: list[str] | None = None) -> list[str]:
    """The arguments of ``pytest.main`` for a device-check run: the check modules, this plugin,
    and pytest set apart from any project around it (no configuration file, no conftest, no
    cache, the terminal report, logging capture and warnings capture off, output not captured,
    assertions not rewritten; a module that does not import does not stop the others)."""
    args = [
        *check_paths(),
        "-p",
        __name__,
        "-c",
        os.devnull,
        "--rootdir",
        str(Path(__file__).resolve().parent),
        "--noconftest",
        "--assert=plain",
        "--capture=no",
        "--continue-on-collection-errors",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:terminal",
        "-p",
        "no:logging",
        "-p",
        "no:warnings",
        "--device-check-platform",
        platform,
        "--device-check-out",
        str(out),
    ]
    if quick:
        args.append("--device-check-quick")
    for text in only or ():
        args += ["--device-check-only", text]
    return args


class PreflightFacts:
    """A plugin object that hands the preflight's facts (:func:`simpler.tools.preflight.run`),
    made before pytest started, to the run."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts


def pytest_addoption(parser: pytest.Parser) -> None:
    """The device check's options (see the module's docstring)."""
    g = parser.getgroup("device-check", "simpler device check")
    g.addoption("--device-check-out", metavar="DIR", help="folder for device_check.jsonl (made if missing)")
    g.addoption(
        "--device-check-platform", default="cuda", choices=("cuda", "ascend", "sim"), help="default cuda"
    )
    g.addoption("--device-check-quick", action="store_true", help="small sizes, the Small cases in the bench")
    g.addoption(
        "--device-check-only",
        action="append",
        metavar="TEXT",
        help="only the checks whose name contains TEXT (and driver.open)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Registers the ``device_check`` marker and, with ``--device-check-out``, the run."""
    config.addinivalue_line(
        "markers", "device_check(name): a device check, named (format string of its params)"
    )
    if config.getoption("device_check_out") is None or config.pluginmanager.get_plugin(RUN_PLUGIN):
        return
    given = [p for p in config.pluginmanager.get_plugins() if isinstance(p, PreflightFacts)]
    config.pluginmanager.register(DeviceCheckRun(config, given[0].facts if given else None), RUN_PLUGIN)


def _run(config: pytest.Config) -> DeviceCheckRun:
    run = config.pluginmanager.get_plugin(RUN_PLUGIN)
    if not isinstance(run, DeviceCheckRun):
        raise pytest.UsageError("the device checks need --device-check-out DIR")
    return run


@pytest.fixture(scope="session")
def ctx(request: pytest.FixtureRequest) -> Context:
    """What every check gets: the platform, ``--quick``, the fake driver or not, the output
    folder and the preflight's facts."""
    return _run(request.config).context


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    """The check's figures: name -> value, recorded (JSON lines, console) when it passes."""
    got: Figures = {}
    _run(request.config).figures[request.node.nodeid] = got
    return got


def check_name(item: pytest.Item) -> str:
    """The check's name: its ``device_check`` marker's, filled with its parameters (the test's
    name without one)."""
    mark = item.get_closest_marker("device_check")
    if mark is None or not mark.args:
        return item.name
    callspec = getattr(item, "callspec", None)
    return str(mark.args[0]).format(**(callspec.params if callspec is not None else {}))


def _write(f: IO[str], rec: dict[str, Any]) -> None:
    f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
    f.flush()


def _fmt_fig(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt_fig(x) for x in v) + "]"
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _short(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut at ``limit`` characters (the whole is in the JSON)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


_WORD = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}


class DeviceCheckRun:
    """One device-check run: the context, the JSON lines and the console lines (registered by
    :func:`pytest_configure` when ``--device-check-out`` is given)."""

    def __init__(self, config: pytest.Config, facts: dict[str, Any] | None) -> None:
        self.config = config
        self.platform = config.getoption("device_check_platform")
        self.quick = bool(config.getoption("device_check_quick"))
        self.only: list[str] = config.getoption("device_check_only") or []
        self.out = Path(config.getoption("device_check_out")).resolve()
        self.path = self.out / "device_check.jsonl"
        self.facts = facts
        self.names: dict[str, str] = {}  # nodeid -> check name
        self.figures: dict[str, Figures] = {}  # nodeid -> what the check's fixture holds
        self.results: list[dict[str, Any]] = []
        self._file: IO[str] | None = None
        self._context: Context | None = None
        self._figure_context: dict[str, Any] = {}
        self._rec: dict[str, Any] | None = None
        self._t0 = self._t_all = 0.0

    @property
    def context(self) -> Context:
        """The session's :class:`~simpler.tools.device_checks.common.Context`."""
        if self._context is None:
            raise RuntimeError("the device check's session has not started")
        return self._context

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The preflight (when no facts were given), the fake's set-up on cuda, the run line."""
        if self.facts is None:
            try:
                self.facts = preflight.run(self.platform, before_nvrtc=fake_first(self.platform))
            except preflight.NoDevice as e:
                pytest.exit(f"device-check: skipped: {e}", returncode=0)
            except preflight.PreflightError as e:
                pytest.exit(f"device-check: preflight: {e}", returncode=2)
        import simpler  # where it was imported from, for the run line

        self.out.mkdir(parents=True, exist_ok=True)
        fake = False
        if self.platform == "cuda":
            register_fake_impls()
            fake = install_if_fake()  # CI: the fake's host kernels run the launches
        self._context = Context(self.platform, self.quick, fake, self.out, self.facts)
        meta = {
            "kind": "run",
            "platform": self.platform,
            "fake_driver": fake,
            "quick": self.quick,
            "simpler": __version__,
            "simpler_path": str(Path(simpler.__file__).parent),
            "python": _platform.python_version(),
            "numpy": np.__version__,
            "host": _platform.node(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **driver_info(self.platform),
            "preflight": self.facts,
        }
        print(
            f"device-check: platform {self.platform}{' (fake libcuda)' if fake else ''}, simpler "
            f"{__version__} from {meta['simpler_path']}, python {meta['python']}, numpy {np.__version__}",
            flush=True,
        )
        self._figure_context = figure_context(self.facts)
        self._t_all = time.perf_counter()
        self._file = open(self.path, "w", encoding="utf-8")
        _write(self._file, meta)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A check module that does not import: a failed check ``collect <module>``."""
        if report.failed:
            name = f"collect {report.nodeid}"
            print(f"\n== device-check: {name} ==\n{report.longreprtext}", flush=True)
            lines = report.longreprtext.strip().splitlines()
            error = lines[-1].removeprefix("E").strip() if lines else "collection failed"
            self._finish(name, {"status": "failed", "error": error, "skip_reason": None}, 0.0, {})

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Names the checks (and makes each name a keyword); ``--device-check-only`` deselects
        the checks whose name contains none of its texts, ``driver.open`` aside."""
        keep, drop = [], []
        for item in items:
            name = self.names[item.nodeid] = check_name(item)
            item.extra_keyword_matches.add(name)
            if self.only and name != ALWAYS and not any(o in name for o in self.only):
                drop.append(item)
            else:
                keep.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """The check's header line; its clock starts."""
        print(f"\n== device-check: {self.names.get(nodeid, nodeid)} ==", flush=True)
        self._rec = {"status": "passed", "error": None, "skip_reason": None}
        self._t0 = time.perf_counter()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        """How the check ended: skipped (with the reason) or failed (with its error, and the
        traceback printed from the check down); the report itself is pytest's."""
        rec, excinfo = self._rec, call.excinfo
        if rec is None or excinfo is None or rec["status"] == "failed":
            return
        if excinfo.errisinstance(pytest.skip.Exception):
            if rec["status"] == "passed":
                rec["status"], rec["skip_reason"] = (
                    "skipped",
                    str(getattr(excinfo.value, "msg", excinfo.value)),
                )
            return
        rec.update(status="failed", error=f"{excinfo.typename}: {excinfo.value}", skip_reason=None)
        tb: TracebackType | None = excinfo.tb
        code = getattr(getattr(item, "obj", None), "__code__", None)
        while tb is not None and tb.tb_frame.f_code is not code:
            tb = tb.tb_next
        exc = excinfo.value
        print("".join(traceback.format_exception(type(exc), exc, tb or excinfo.tb)), end="", flush=True)

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """The check's line and figure lines (JSON), its result and figures (console)."""
        rec, self._rec = self._rec or {"status": "failed", "error": "not run", "skip_reason": None}, None
        figures = self.figures.pop(nodeid, {})
        seconds = time.perf_counter() - self._t0
        self._finish(
            self.names.get(nodeid, nodeid), rec, seconds, figures if rec["status"] == "passed" else {}
        )

    def _finish(self, name: str, outcome: dict[str, Any], seconds: float, figures: Figures) -> None:
        rec = {"kind": "check", "name": name, "figures": figures, **outcome}
        rec["seconds"] = round(seconds, 3)
        rec["ok"] = rec["status"] != "failed"
        sys.stdout.flush()
        if self._file is not None:
            _write(self._file, rec)
            for k, v in figures.items():
                _write(
                    self._file,
                    {"kind": "figure", "check": name, "name": k, "value": v, **self._figure_context},
                )
        why = _short(rec["error"] or rec["skip_reason"] or "")
        print(f"{_WORD[rec['status']]} {name} ({rec['seconds']:.1f} s){': ' + why if why else ''}")
        for k, v in figures.items():
            print(f"     {k} = {_fmt_fig(v)}")
        sys.stdout.flush()
        self.results.append(rec)

    def counts(self) -> dict[str, int]:
        """How many checks passed, failed and were skipped so far."""
        return {s: sum(r["status"] == s for r in self.results) for s in ("passed", "failed", "skipped")}

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The summary line (JSON) and the summary (console)."""
        if self._file is None:
            return
        seconds = time.perf_counter() - self._t_all
        counts = self.counts()
        _write(self._file, {"kind": "summary", **counts, "seconds": round(seconds, 3)})
        self._file.close()
        self._file = None
        lines = ["", "== device-check: summary =="]
        for r in self.results:
            why = _short(r["error"] or r["skip_reason"] or "")
            lines.append(
                f"{_WORD[r['status']]}  {r['seconds']:7.1f} s  {r['name']}{'  (' + why + ')' if why else ''}"
            )
        lines.append(
            f"device-check: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} "
            f"skipped in {seconds:.1f} s; JSON lines in {self.path}"
        )
        print("\n".join(lines), flush=True)
