"""What a scene test declares, checked: platform names, case entries, and how a case's
arguments split across devices (the defaults behind ``SceneTestCase.SPLIT``).

It also says what makes a class a scene test (:func:`scene_base`, :func:`is_scene_test`) and
reads what the ``scene_test`` decorator recorded on it, so that the modules that run cases need
not import :mod:`simpler.testing.scene`, which sits above them (it runs its cases through them).

Internal to :mod:`simpler.testing`; :mod:`simpler.testing.scene` re-exports the public names.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import _arrays, _core
from ..args import Scalar, TaskArgsBuilder
from ..errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from .scene import SceneTestCase

#: The keys a case entry may have.
CASE_KEYS = {"name", "params", "platforms", "manual", "skip_golden", "config", "devices"}

#: Platform names of the upstream runtime (hw-native-sys/simpler) and the platform each one
#: means here. A case's ``platforms`` and ``manual`` may use them; they are mapped when the class
#: is decorated (so ``["a2a3sim", "a2a3"]`` becomes ``["sim", "ascend"]``).
PLATFORM_ALIASES: dict[str, str] = {"a2a3sim": "sim", "a2a3": "ascend", "a5sim": "sim", "a5": "ascend"}


def platform_name(name: object, where: str = "") -> str:
    """The platform ``name`` means here: one of ours (``simpler._core.PLATFORMS``) unchanged, or
    an upstream name mapped through :data:`PLATFORM_ALIASES`. Anything else raises
    ``ArgumentError`` naming both lists (``where`` prefixes the message)."""
    if isinstance(name, str):
        if name in _core.PLATFORMS:
            return name
        if name in PLATFORM_ALIASES:
            return PLATFORM_ALIASES[name]
    aliases = ", ".join(f"{k} -> {v}" for k, v in PLATFORM_ALIASES.items())
    raise ArgumentError(
        f"{where}unknown platform {name!r}: the platforms are {', '.join(_core.PLATFORMS)} "
        f"(upstream names map: {aliases})"
    )


def platform_list(names: Any, where: str) -> list[str]:
    """Our names for a collection of platform names, in order, without repeats."""
    out: list[str] = []
    for n in names:
        p = platform_name(n, where)
        if p not in out:
            out.append(p)
    return out


def case_platforms(case: Mapping[str, Any]) -> list[str] | None:
    """The platforms a case declares, in our names (``None``: every platform)."""
    plats = case.get("platforms")
    return None if plats is None else platform_list(plats, "")


def manual_on(case: Mapping[str, Any], platform: str) -> bool:
    """Whether a case is manual on ``platform``: ``manual`` is ``True`` / ``False`` (on every
    platform / none), one platform name, or a list / tuple / set of them (upstream names
    allowed): manual only on those, a regular case elsewhere."""
    m = case.get("manual", False)
    if isinstance(m, bool):
        return m
    names = [m] if isinstance(m, str) else m
    return platform_name(platform) in platform_list(names, "")


_NAME_COLLECTIONS = (list, tuple, set, frozenset)


def _ordered(names: Any) -> Any:
    """A set of names in a stable order; a list or tuple as given."""
    return sorted(names) if isinstance(names, (set, frozenset)) else names


def validate_case(cls: type, i: int, case: object) -> dict[str, Any]:
    """Checks one case; returns a copy with ``platforms`` and ``manual`` in our platform names."""
    where = f"{cls.__name__}.CASES[{i}]"
    if not isinstance(case, Mapping):
        raise ArgumentTypeError(f"{where}: a case is a dict, not {type(case).__name__}")
    unknown = set(case) - CASE_KEYS
    if unknown:
        raise ArgumentError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(CASE_KEYS)})")
    name = case.get("name")
    if not isinstance(name, str) or not name or "::" in name or "/" in name:
        raise ArgumentError(f"{where}: 'name' must be a non-empty string without '::' or '/'")
    if not isinstance(case.get("params", {}), Mapping):
        raise ArgumentTypeError(f"{where} ({name}): 'params' must be a dict")
    out = dict(case)
    plats = case.get("platforms")
    if plats is not None:
        if not isinstance(plats, _NAME_COLLECTIONS) or not all(isinstance(p, str) for p in plats):
            raise ArgumentTypeError(f"{where} ({name}): 'platforms' must be a list of platform names")
        out["platforms"] = platform_list(_ordered(plats), f"{where} ({name}): 'platforms': ")
    manual = case.get("manual", False)
    if isinstance(manual, str):
        out["manual"] = (platform_name(manual, f"{where} ({name}): 'manual': "),)
    elif isinstance(manual, _NAME_COLLECTIONS):
        if not all(isinstance(p, str) for p in manual):
            raise ArgumentTypeError(f"{where} ({name}): 'manual' lists platform names")
        out["manual"] = tuple(platform_list(_ordered(manual), f"{where} ({name}): 'manual': "))
    elif not isinstance(manual, bool):
        raise ArgumentTypeError(
            f"{where} ({name}): 'manual' must be True/False, a platform name or a list of them, "
            f"not {type(manual).__name__}"
        )
    if not isinstance(case.get("config", {}), Mapping):
        raise ArgumentTypeError(f"{where} ({name}): 'config' must be a dict")
    if "devices" in case:
        check_devices(case["devices"], f"{where} ({name}): 'devices'")
    return out


def compare_style(cls: type, base: Any) -> str:
    """How ``cls.compare_outputs`` is called: ``"ours"`` ``(actual, golden, params)`` or
    ``"upstream"`` ``(test_args, golden_args, output_names, params)``, from the override's
    signature (``base``: the method of ``SceneTestCase``, called the same way); any other signature
    raises ``ArgumentTypeError``."""
    fn = getattr(cls, "compare_outputs", None)
    if fn is base:
        return "ours"
    where = f"{cls.__name__}.compare_outputs"
    if not callable(fn):
        raise ArgumentTypeError(f"{where} must be a method")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "ours"  # a builtin or C callable: called the way it always was
    params = list(sig.parameters.values())
    if isinstance(inspect.getattr_static(cls, "compare_outputs"), (staticmethod, classmethod)):
        pass  # no self to drop
    elif params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]  # self
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    kw_required = [p for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]

    def takes(n: int) -> bool:
        return not kw_required and len(required) <= n and (variadic or len(positional) >= n)

    if len(positional) >= 3 and positional[2].name == "output_names" and takes(4):
        return "upstream"
    if takes(3):
        return "ours"
    if takes(4):
        return "upstream"
    raise ArgumentTypeError(
        f"{where}{sig}: a compare_outputs override takes (self, actual, golden, params) or "
        "upstream's (self, test_args, golden_args, output_names, params)"
    )


def check_devices(n: object, where: str) -> int:
    """``n`` as a device count (a positive int), or ``ArgumentError`` naming ``where``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ArgumentError(f"{where}: a device count is a positive int, not {n!r}")
    return int(n)


def check_split(split: object, where: str) -> None:
    """Checks a ``SPLIT`` declaration: a mapping of tensor names to an axis (int) or ``None``."""
    if not isinstance(split, Mapping) or not all(isinstance(k, str) for k in split):
        raise ArgumentTypeError(f"{where}: SPLIT maps tensor names to an axis or None, not {split!r}")
    for k, axis in split.items():
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
            raise ArgumentTypeError(f"{where}: SPLIT['{k}'] is an axis (int) or None, not {axis!r}")


def host_fixture(v: Any) -> Any:
    """A fixture's numpy view (a torch tensor's memory; anything else as it is)."""
    return _arrays.host_array(v, "fixture")


def split_by_axes(
    args: TaskArgsBuilder, split: Mapping[str, int | None], n: int, where: str
) -> list[TaskArgsBuilder]:
    """``n`` builders from ``args``: each tensor ``split`` names with an axis is cut along it
    (``np.array_split``: the first devices take one more row when it does not divide), each
    a copy; every other tensor goes whole to every device (one copy, the same array in every
    builder); scalars are shared. ``child_memory`` is kept."""
    unknown = sorted(set(split) - set(args.tensor_names()))
    if unknown:
        raise ArgumentError(f"{where}: SPLIT names no tensor of the case: {', '.join(unknown)}")
    # Every tensor is checked before anything is built: a device count far beyond what the case
    # splits into fails here, at once, not after n builders (and n copies of every shared array's
    # reference) were made.
    for spec in args.specs:
        if isinstance(spec, Scalar):
            continue
        arr = host_fixture(spec.value)
        if not isinstance(arr, np.ndarray):
            raise ArgumentError(
                f"{where}: tensor '{spec.name}' is a {type(arr).__name__}; a case on several devices "
                "splits host arrays only"
            )
        axis = split.get(spec.name)
        if axis is not None and (not -arr.ndim <= axis < arr.ndim or arr.shape[axis] < n):
            size = f"{arr.shape[axis]} along it" if -arr.ndim <= axis < arr.ndim else "no such axis"
            raise ArgumentError(
                f"{where}: cannot split '{spec.name}' of shape {arr.shape} along axis {axis} "
                f"over {n} devices ({size}; at most one device per element of the axis)"
            )
    parts = [TaskArgsBuilder() for _ in range(n)]
    for spec in args.specs:
        if isinstance(spec, Scalar):
            for p in parts:
                p.add(spec)
            continue
        arr = host_fixture(spec.value)
        axis = split.get(spec.name)
        if axis is None:
            whole = np.array(arr, copy=True, order="C")
            shards = [whole] * n
        else:
            shards = [np.array(s, copy=True, order="C") for s in np.array_split(arr, n, axis=axis)]
        for p, shard in zip(parts, shards):
            p.add(spec._replace(value=shard))
    return parts


def merge_by_axes(
    parts: Sequence[TaskArgsBuilder],
    args: TaskArgsBuilder,
    names: Sequence[str],
    split: Mapping[str, int | None] | None,
    where: str,
) -> None:
    """Writes outputs ``names`` of ``parts`` into ``args``, each joined along its axis (``split``'s,
    axis 0 without ``split``). An output ``split`` leaves whole on every device cannot be
    joined: ``ArgumentError`` (override ``merge_outputs``)."""
    for name in names:
        axis = 0 if split is None else split.get(name)
        if axis is None:
            raise ArgumentError(
                f"{where}: output '{name}' goes whole to every device (SPLIT gives it no axis), so "
                "the devices' outputs cannot be joined: split it, or override merge_outputs"
            )
        joined = np.concatenate([np.asarray(host_fixture(p[name])) for p in parts], axis=axis)
        target = host_fixture(args[name])
        if joined.shape != target.shape:
            raise ArgumentError(
                f"{where}: output '{name}': the devices' parts join to shape {joined.shape}, "
                f"the case's is {target.shape}"
            )
        np.copyto(target, joined)


log = logging.getLogger("simpler")


def release_then_close(label: str, resident: Any, close: Any, failed: bool) -> None:
    """The end of a case run: releases ``resident`` (a resident set, or None), then calls
    ``close`` (or nothing when None) whatever happened. When ``failed``, a release failure is
    logged instead of raised (the run's first error is the one that matters)."""
    try:
        if resident is not None:
            try:
                resident.release()
            except Exception:
                if not failed:
                    raise
                log.exception("%s: release after a failure also failed", label)
    finally:
        if close is not None:
            close()


# -- what makes a class a scene test -------------------------------------------------------------

#: What the ``scene_test`` decorator records in a class's own namespace.
LEVEL_ATTR = "_scene_test_level"
RUNTIME_ATTR = "_scene_test_runtime"
COMPARE_ATTR = "_scene_test_compare"  # "ours" or "upstream": how compare_outputs is called

#: Set in the base class's own namespace (``SceneTestCase``): the harness below it recognises a
#: scene test's class by it.
BASE_ATTR = "_scene_test_base"


def scene_base(cls: object) -> type[SceneTestCase] | None:
    """The scene-test base class (``SceneTestCase``) that ``cls`` derives from, or ``None`` when
    ``cls`` is not such a class."""
    if not isinstance(cls, type):
        return None
    # The class whose own namespace sets BASE_ATTR is SceneTestCase (see scene.py).
    base = next((c for c in cls.__mro__ if c.__dict__.get(BASE_ATTR)), None)
    return cast("type[SceneTestCase] | None", base)


def check_scene_class(cls: object, who: str = "run_case") -> None:
    """``ArgumentTypeError`` unless ``cls`` is a ``SceneTestCase`` subclass."""
    if scene_base(cls) is None:
        raise ArgumentTypeError(f"{who}: expected a SceneTestCase subclass")


def can_split(cls: type[SceneTestCase]) -> bool:
    """Whether a scene test can run on several devices: it sets ``SPLIT`` or overrides
    ``split_args``."""
    base = scene_base(cls)
    return cls.SPLIT is not None or (base is not None and cls.split_args is not base.split_args)


def case_devices(cls: type[SceneTestCase], case: Mapping[str, Any] | str, devices: int | None = None) -> int:
    """The device count a case runs on: ``devices`` (``--devices``) when given, else the case's
    ``devices``, else the class's ``DEVICES``."""
    if devices is not None:
        return check_devices(devices, "devices")
    c = find_case(cls, case)
    return int(c.get("devices", getattr(cls, "DEVICES", 1)))


def is_scene_test(obj: object) -> bool:
    """Whether ``obj`` is a class decorated with ``scene_test``."""
    return scene_base(obj) is not None and LEVEL_ATTR in obj.__dict__


def scene_level(cls: type) -> int:
    """The level a scene test was declared with."""
    return int(cls.__dict__[LEVEL_ATTR])


def scene_runtime(cls: type) -> str | None:
    """The ``runtime`` a scene test was declared with (upstream's runtime name; ``None`` when
    none was given). Recorded only: this harness has one runtime."""
    if not is_scene_test(cls):
        raise ArgumentTypeError(f"scene_runtime: {cls!r} is not a class decorated with scene_test")
    return cls.__dict__[RUNTIME_ATTR]


def find_case(cls: type[SceneTestCase], case: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """The case entry of ``cls`` that ``case`` names (or ``case`` itself, an entry)."""
    if isinstance(case, str):
        for c in cls.CASES:
            if c["name"] == case:
                return c
        raise ArgumentError(f"{cls.__name__}: no case named '{case}'")
    return case


def declared_level(cls: type) -> int:
    """The level a case of ``cls`` runs at: the decorator's, or 2 for an undecorated class."""
    return scene_level(cls) if LEVEL_ATTR in cls.__dict__ else 2


def declared_compare(cls: type) -> str:
    """How ``cls``'s ``compare_outputs`` is called (``"ours"`` or ``"upstream"``): as the
    decorator recorded it, or read from the override's signature for an undecorated class."""
    recorded = cls.__dict__.get(COMPARE_ATTR)
    if recorded:
        return str(recorded)
    base = scene_base(cls)
    if base is None:
        raise ArgumentTypeError(f"{cls!r} is not a SceneTestCase subclass")
    return compare_style(cls, base.compare_outputs)
