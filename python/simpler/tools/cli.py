"""The ``simpler`` command (also ``python -m simpler``).

::

    simpler bench                                  # the unrolled paged attention, Case1 and Case2
    simpler bench paged_attention --rounds 5 --case B64_8K --json pa.jsonl --plot pa.png
    simpler bench path/to/test_x.py --rounds 5 --case Residency_
    simpler report pa.jsonl [--plot pa.png]
    simpler report before.jsonl after.jsonl        # two runs side by side, with ratios
    simpler --version

``bench`` runs the residency arms of a workload (:mod:`simpler.tools.bench`) and prints round tables
(:mod:`simpler.tools.report`); ``--json`` writes every round's record as a JSON line (before the tables
are printed, so a closed pipe does not lose it; its directory is checked before the run).
``report`` re-prints the tables of such a file, or compares two. Exit status: 0 on success, 1
when a case failed or the platform is unavailable, 2 on a usage error (one line on stderr, never
a traceback), 141 (quietly) when the reader of standard output went away, as in
``simpler report pa.jsonl | head``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__
from ..errors import PlatformUnavailableError
from ..testing import runner
from ..workloads import DEFAULT_WORKLOAD, WORKLOADS
from .bench import BYTES_KEYS, PHASES, BenchError, BenchOptions, bench_records, split_arm
from .report import ReportError, format_compare, format_tables, plot_records, read_jsonl

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = [
    "BYTES_KEYS",
    "PHASES",
    "WORKLOADS",
    "BenchOptions",
    "bench_records",
    "format_compare",
    "format_tables",
    "main",
    "plot_records",
    "read_jsonl",
    "split_arm",
]


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (exit 2) and no usage dump, and a failed write of
    its help or version text raised (argparse drops it), so a closed pipe ends ``--help`` the
    way it ends every command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="simpler", description="Benchmark residency arms and print round tables.")
    p.add_argument("--version", action="version", version=f"simpler {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    b = sub.add_parser("bench", help="run the arms of a workload for N rounds and print round tables")
    b.add_argument(
        "workload",
        nargs="?",
        default=DEFAULT_WORKLOAD,
        help=f"a scene-test file, file.py:function, or a shipped workload: {', '.join(sorted(WORKLOADS))} "
        f"(default: {DEFAULT_WORKLOAD}, whose Case1 and Case2 run when no --case is given)",
    )
    runner.add_runner_arguments(b.add_argument, rounds=5)
    b.add_argument("--json", metavar="OUT.jsonl", help="write every round's report as JSON lines")
    b.add_argument(
        "--plot", metavar="OUT.png", help="plot per-round dispatch time per arm (needs matplotlib)"
    )
    b.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: on a terminal, when tqdm is installed)",
    )
    r = sub.add_parser("report", help="re-print the tables of 'simpler bench --json' files, or compare two")
    r.add_argument("jsonl", nargs="+", metavar="FILE.jsonl", help="one file (tables) or two (comparison)")
    r.add_argument(
        "--plot", metavar="OUT.png", help="plot per-round dispatch time per arm (needs matplotlib)"
    )
    return p


def _usage(message: str) -> int:
    print(f"simpler: error: {message}", file=sys.stderr)
    return 2


def _check_output(path: str | None, what: str) -> str | None:
    """Why ``path`` cannot be written (checked before a long run), or ``None``."""
    if path is None:
        return None
    if Path(path).is_dir():
        return f"{what} {path}: is a directory (name a file)"
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        return f"{what} {path}: directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"{what} {path}: directory {parent} is not writable"
    return None


def _write_jsonl(records: Iterable[Mapping[str, Any]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, sort_keys=True) + "\n")


def _report(ns: argparse.Namespace) -> int:
    if len(ns.jsonl) > 2:
        return _usage("report takes one file (tables) or two (a comparison)")
    runs = [read_jsonl(path) for path in ns.jsonl]
    if len(runs) == 2:
        print(format_compare(runs[0], runs[1], ns.jsonl))
    else:
        print(format_tables(runs[0]))
    if ns.plot:
        plot_records([rec for run in runs for rec in run], ns.plot)
        print(f"plot written to {ns.plot}")
    return 0


def _bench(ns: argparse.Namespace) -> int:
    for problem in (_check_output(ns.json, "--json"), _check_output(ns.plot, "--plot")):
        if problem:
            return _usage(problem)
    if ns.plot and importlib.util.find_spec("matplotlib") is None:
        return _usage(
            "--plot needs matplotlib, which is not installed (pip install 'simpler-residency[plot]')"
        )
    opts = BenchOptions(
        workload=ns.workload,
        rounds=ns.simpler_rounds,
        platform=ns.simpler_platform,
        cases=ns.simpler_case,
        skip_golden=ns.simpler_skip_golden,
        worker_options=runner.worker_options(
            ns.simpler_svm, ns.simpler_staging, ns.simpler_model, ns.simpler_view_policy
        ),
        manual=ns.simpler_manual,
        devices=ns.simpler_devices,
    )
    problem = opts.runner_options().check()
    if problem:
        return _usage(problem)
    # One probe of the platform, so an unavailable one is one message, not one per arm.
    from ..worker import Worker

    try:
        Worker(opts.platform, **opts.worker_options).close()
    except PlatformUnavailableError as e:
        print(f"simpler bench: {e}", file=sys.stderr)
        return 1
    records, failures = bench_records(opts, progress=ns.progress)
    # The files first, so a reader that goes away early (`| head`) does not lose them.
    if ns.json:
        _write_jsonl(records, ns.json)
    if ns.plot and records:
        plot_records(records, ns.plot)
    if records:
        print(format_tables(records))
    if ns.json:
        print(f"{len(records)} round report(s) written to {ns.json}")
    if ns.plot and records:
        print(f"plot written to {ns.plot}")
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simpler`` console script; returns the exit status."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, so a closed pipe surfaces inside the handler below
    except BrokenPipeError:
        # The reader went away (``simpler report a.jsonl | head``): stop quietly, with the
        # status of a process ended by SIGPIPE, and send the rest of the buffered output to
        # /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return _SIGPIPE_STATUS
    return status


# 128 + SIGPIPE: what a shell reports for a command whose output pipe was closed.
_SIGPIPE_STATUS = 141


def _main(argv: Sequence[str] | None) -> int:
    try:
        ns = _parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors: argparse already printed
        return int(e.code or 0)
    try:
        return _report(ns) if ns.command == "report" else _bench(ns)
    except (BenchError, ReportError) as e:
        return _usage(str(e))


if __name__ == "__main__":
    raise SystemExit(main())
