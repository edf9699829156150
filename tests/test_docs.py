"""The code blocks of the README, of ARCHITECTURE.md and of ``docs/`` run or are checked (so they
cannot drift).

* Every ``python`` block of a page runs, in page order, in one namespace per page.
* Every ``sh`` block holds commands (``$`` prompts and ``#`` comments allowed, ``\\`` continues a
  line, leading ``VAR=value`` assignments are skipped). Each command is checked against the real
  thing without running it: a ``make`` target exists in the Makefile; a ``simpler`` /
  ``python -m simpler`` command line parses with the CLI's parser; ``python -m
  simpler.tools.benchmarks``, ``python -m simpler.tools.device_check``, a scene-test file (the
  standalone runner), ``examples/decode/decode.py`` and ``pytest`` (its ``--simpler-*`` options)
  parse with theirs. A command of any other kind
  fails the test, so a new kind of command gets a check before it gets into the docs.
* ``text`` blocks (output) are not run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from simpler.testing import runner
from simpler.tools import benchmarks, cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(page.read_text(encoding="utf-8")) if kind == lang]


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p, "python")], ids=lambda p: p.name)
def test_the_page_s_python_blocks_run(page, capsys):
    namespace: dict[str, object] = {"__name__": f"doc_{page.stem}"}
    for i, block in enumerate(_blocks(page, "python")):
        code = compile(block, f"{page.name} (python block {i + 1})", "exec")
        exec(code, namespace)


def _commands(block: str) -> list[list[str]]:
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ").strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words.pop(0)
        out.append(words)
    return out


def _parses(parser: argparse.ArgumentParser, args: list[str], known_only: bool = False) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if known_only:
                _, rest = parser.parse_known_args(args)
                unprefixed = re.compile(r"^--(platform|rounds|case|skip-golden|manual|svm|staging)\b")
                bad = [a for a in rest if a.startswith("--simpler") or unprefixed.match(a)]
                assert not bad, f"not an option of the plugin: {bad} (they are --simpler-*)"
            else:
                parser.parse_args(args)
    except SystemExit as e:  # --help / --version exit 0 after printing
        if e.code:
            raise AssertionError(f"does not parse: {err.getvalue().strip()}") from None


def _runner_parser(prefix: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    runner.add_runner_arguments(p.add_argument, prefix=prefix)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _decode_parser(args: list[str]) -> None:
    spec = importlib.util.spec_from_file_location("_doc_decode", ROOT / "examples" / "decode" / "decode.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            module.parse_args(args)
    except SystemExit:
        raise AssertionError(f"does not parse: {err.getvalue().strip()}") from None


def _check(words: list[str]) -> None:
    prog, args = words[0], words[1:]
    name = Path(prog).name
    if name == "make":
        makefile = (ROOT / "Makefile").read_text()
        for target in args:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make target {target}"
        return
    if name.startswith("python") and args[:2] == ["-m", "simpler"]:
        name, args = "simpler", args[2:]
    if name == "simpler":
        return _parses(cli._parser(), args)
    if name.startswith("python") and args[:2] == ["-m", "simpler.tools.benchmarks"]:
        p = benchmarks._parser()
        _parses(p, args[2:])
        unknown = set(p.parse_args(args[2:]).which) - set(benchmarks.BENCHES)
        assert not unknown, f"unknown benchmark(s) {unknown}"
        return
    if name.startswith("python") and args[:2] == ["-m", "simpler.tools.bench_builds"]:
        from simpler.tools import bench_builds

        return _parses(bench_builds._parser(), args[2:])
    if name.startswith("python") and args[:2] == ["-m", "simpler.tools.device_check"]:
        from simpler.tools import device_check

        return _parses(device_check._parser(), args[2:])
    if name.startswith("python") and args and args[0].endswith("decode.py"):
        return _decode_parser(args[1:])
    if name.startswith("python") and args and Path(args[0]).name.startswith("test_"):
        return _parses(_runner_parser(), args[1:])
    if name == "pytest":
        return _parses(_runner_parser("simpler-"), args, known_only=True)
    raise AssertionError(f"no check for commands of {prog!r}: add one to tests/test_docs.py")


def _sh_commands() -> list[tuple[str, list[str]]]:
    return [(f"{p.name}: {' '.join(c)}", c) for p in PAGES for b in _blocks(p, "sh") for c in _commands(b)]


@pytest.mark.parametrize(("where", "words"), _sh_commands(), ids=[w for w, _ in _sh_commands()])
def test_the_pages_commands_parse(where, words):
    _check(words)


def test_every_page_is_seen_and_every_block_is_typed():
    assert {p.name for p in PAGES} >= {"README.md", "concepts.md", "scene_tests.md"}
    assert sum(len(_blocks(p, "python")) for p in PAGES) >= 4
    assert len(_sh_commands()) >= 8
    untyped = [p.name for p in PAGES if _blocks(p, "")]
    assert not untyped, f"blocks without a language (python, sh or text) in {untyped}"
