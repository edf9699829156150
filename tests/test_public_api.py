"""The public surface: every exported name and its public methods carry a docstring."""

from __future__ import annotations

import inspect

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
