"""The public surface: every exported name and its public methods carry a docstring."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import simpler as sp


def _public_members(obj: type) -> list[tuple[str, object]]:
    out = []
    for name, member in vars(obj).items():
        if name.startswith("_"):
            continue
        native = inspect.ismethoddescriptor(member) or inspect.isgetsetdescriptor(member)
        if native or inspect.isfunction(member) or isinstance(member, (property, classmethod, staticmethod)):
            out.append((name, member))
    return out


def test_every_public_name_and_method_has_a_docstring():
    missing = []
    for name in sp.__all__:
        obj = getattr(sp, name)
        if isinstance(obj, sp.ArgDirection):
            continue  # IN / OUT / INOUT: enum members documented by ArgDirection
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for mname, member in _public_members(obj):
                target = member.fget if isinstance(member, property) else member
                if isinstance(target, (classmethod, staticmethod)):
                    target = target.__func__
                if not inspect.getdoc(target):
                    missing.append(f"{name}.{mname}")
    assert missing == []


def test_native_module_is_documented():
    from simpler import _core

    assert _core.__doc__


_NATIVE_SRC = Path(__file__).resolve().parent.parent / "crates" / "python" / "src"


def test_the_native_module_imports_nothing_from_its_package():
    """The bindings import only Python's own modules (the log bridge's `logging`, `builtins`,
    `atexit` for the exit hook) and numpy, a dependency: exceptions are declared natively and
    the helpers that stay Python are handed over at import."""
    imported = {
        m for f in _NATIVE_SRC.glob("*.rs") for m in re.findall(r'\.import\("([^"]+)"\)', f.read_text())
    }
    assert imported <= {"logging", "builtins", "atexit", "numpy"}, imported
    assert not any("import_exception!" in f.read_text() for f in _NATIVE_SRC.glob("*.rs"))


_CRATES = Path(__file__).resolve().parent.parent / "crates"


def _without_test_modules(text: str) -> str:
    """``text`` without its ``#[cfg(test)] mod name { ... }`` blocks (a test module may use any
    module of its crate)."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        out.append(text[i : m.start()])
        i = j
    return "".join(out) + text[i:]


def _crate_uses(src: Path) -> dict[str, set[str]]:
    """Each module of the crate under ``src`` (``run::launch`` for ``run/launch.rs``) -> the
    modules of the crate it uses (``crate::a::b``, ``crate::a::{b, c}``, ``super::b``),
    test modules left out."""
    files = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        files["::".join(parts[:-1] if parts[-1] in ("mod", "lib") else parts)] = f

    def known(path: str) -> str | None:
        parts = path.split("::")
        while parts and "::".join(parts) not in files:
            parts.pop()
        return "::".join(parts) or None

    uses: dict[str, set[str]] = {}
    for name, f in files.items():
        text = _without_test_modules(f.read_text())
        paths = re.findall(r"crate::((?:\w+::)*\w+)", text)
        for base, group in re.findall(r"crate::((?:\w+::)*)\{([^}]*)\}", text):
            paths += [base + item for item in re.findall(r"\w+", group)]
        parent = name.rpartition("::")[0]
        paths += [f"{parent}::{m}" if parent else m for m in re.findall(r"\bsuper::(\w+)", text)]
        uses[name] = {k for p in paths if (k := known(p)) is not None and k != name}
    return uses


@pytest.mark.parametrize("crate", ["python", "runtime"])
def test_the_crate_modules_form_no_cycle(crate):
    """``crate::`` uses between the modules of the bindings and of the runtime: each uses only
    modules below it."""
    uses = _crate_uses(_CRATES / crate / "src")
    assert len(uses) > 5
    if crate == "runtime":
        assert "run::plan" in uses["run::launch"]  # nested modules are read
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"cycle: {' -> '.join((*path[path.index(m) :], m))}"
        if m in done:
            return
        for d in sorted(uses.get(m, ())):
            visit(d, (*path, m))
        done.add(m)

    for m in sorted(uses):
        visit(m, ())


#: The crates that are C libraries or call them: the driver (vendor libraries through their C
#: APIs) and the fake vendor libraries (C exports by nature). Every other crate forbids ``unsafe``.
_UNSAFE_CRATES = {"ffi-driver", "fake-cuda", "fake-ascend", "fake-vendor"}


def test_unsafe_code_is_a_rule_of_the_compiler():
    """Outside the driver and the fake vendor libraries, ``unsafe`` is the compiler's to refuse:
    the runtime forbids it; the bindings deny it and lift the lint for one module, ``capi`` (the
    interpreter's and numpy's C APIs, the DLPack ABI), the only module of theirs that writes
    ``unsafe``."""
    roots = {d.name: d / "src" / "lib.rs" for d in _CRATES.iterdir() if (d / "src" / "lib.rs").exists()}
    assert {"runtime", "python", "ffi-driver"} <= set(roots)
    for name, lib in roots.items():
        if name not in _UNSAFE_CRATES | {"python"}:
            assert "#![forbid(unsafe_code)]" in lib.read_text(), name
    bindings = roots["python"].read_text()
    assert "#![deny(unsafe_code)]" in bindings
    assert re.findall(r"#\[allow\(unsafe_code\)\]\s*mod (\w+);", bindings) == ["capi"]
    assert bindings.count("allow(unsafe_code)") == 1
    writes = {
        f.name
        for f in (_CRATES / "python" / "src").rglob("*.rs")
        if re.search(r"\bunsafe\s*(\{|fn\b|extern\b|impl\b)", f.read_text())
    }
    assert writes == {"capi.rs"}


_PACKAGE = Path(__file__).resolve().parent.parent / "python" / "simpler"


def _package_imports() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports, wherever the import
    stands (in a function too), except under ``if TYPE_CHECKING:`` (names for annotations only,
    never executed). ``from . import x`` counts as importing ``x`` when ``x`` is a module; the
    native module counts as ``simpler._core``."""
    files = {}
    for f in _PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(_PACKAGE.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    modules = {*files, "simpler._core"}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def walk(nodes: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
        out: list[ast.Import | ast.ImportFrom] = []
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                out += walk(node.orelse)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.append(node)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    out += walk([child])
        return out

    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        package = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in walk(ast.parse(f.read_text()).body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = package[: len(package) - node.level + 1] if node.level else []
                mod = ".".join([*base, *([node.module] if node.module else [])])
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [*subs, mod]
            deps |= {m for t in targets if (m := known(t)) is not None and m != name}
        graph[name] = deps
    return graph


def test_the_package_modules_form_no_cycle():
    """No module of the package imports, directly or through others, a module that imports it
    back (lazy imports inside functions included), so every module can be read, and loaded,
    after the ones it uses."""
    graph = _package_imports()
    assert len(graph) > 30 and "simpler.testing.scene" in graph["simpler.testing"]
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"cycle: {' -> '.join((*path[path.index(m) :], m))}"
        if m in done:
            return
        for d in sorted(graph.get(m, ())):
            visit(d, (*path, m))
        done.add(m)

    for m in sorted(graph):
        visit(m, ())


def test_import_simpler_loads_the_library_not_the_harness_nor_the_groups():
    """``import simpler`` loads the library; the harness and the device groups load when one of
    their names is first read from it."""
    code = (
        "import sys, simpler\n"
        "print(sorted(m for m in sys.modules if m.startswith('simpler.')))\n"
        "simpler.SceneTestCase, simpler.DeviceGroup\n"
        "print('simpler.testing' in sys.modules, 'simpler.group' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded, after = out.splitlines()
    assert not [m for m in ast.literal_eval(loaded) if m.startswith(("simpler.testing", "simpler.group"))], (
        loaded
    )
    assert after == "True True"


def test_the_typed_dicts_name_exactly_the_keys_the_native_module_returns():
    from typing import get_type_hints

    from simpler import worker as wm

    def keys(td):
        return set(get_type_hints(td))

    w = wm.Worker("sim")
    try:
        assert set(w.stats()) == keys(wm.WorkerStats)
        state = w.debug_state()
        assert set(state) == keys(wm.DebugState) and set(state["views"]) == keys(wm.HostViews)
    finally:
        summary = w.close()
    assert summary is not None and set(summary) == keys(wm.CloseSummary)
    assert set(wm.session_stats()) == keys(wm.SessionStats)
    assert set(wm.release_sessions()) == keys(wm.ReleaseSummary)
