"""The public surface: every exported name and its public methods carry a docstring."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

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
    `atexit` for the exit hook):
    exceptions are declared natively and the numpy helpers handed over at import."""
    imported = {
        m for f in _NATIVE_SRC.glob("*.rs") for m in re.findall(r'\.import\("([^"]+)"\)', f.read_text())
    }
    assert imported <= {"logging", "builtins", "atexit"}, imported
    assert not any("import_exception!" in f.read_text() for f in _NATIVE_SRC.glob("*.rs"))


def test_the_native_crate_modules_form_no_cycle():
    """`crate::` uses between the bindings' modules: each uses only modules above it."""
    uses = {
        f.stem: set(re.findall(r"crate::([a-z_]+)", f.read_text())) - {f.stem}
        for f in _NATIVE_SRC.glob("*.rs")
    }
    assert len(uses) > 5
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"cycle: {' -> '.join((*path, m))}"
        if m in done:
            return
        for d in uses.get(m, ()):
            visit(d, (*path, m))
        done.add(m)

    for m in sorted(uses):
        visit(m, ())
