"""Argument specs and case-owned device buffers.

* :class:`TensorArg` / :class:`Scalar` name one argument of a callable; ``TensorArg(...,
  child_memory=True)`` declares that the tensor lives on the device for the whole case.
* :class:`TaskArgsBuilder` is an ordered set of specs (tensors first, then scalars) with access by
  name; :meth:`Worker.run <simpler.Worker.run>` takes it directly (everything host-staged).
* :class:`ResidentTaskArgs` owns the device buffers of resident tensors (the ownership itself is a
  resident set in the Rust core): one fixture at a time in, LIFO release, rollback of a partial
  construction.

Every place that rebuilds a spec uses :func:`dataclasses.replace`, so a field added to a spec is
never silently dropped (``clone()``, ``replace()``, ``with_child_memory()``).
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from .errors import ArgumentError, ArgumentTypeError, StateError
from .worker import ArgDirection, Buffer, Callable, DeviceTensor, Worker

__all__ = ["BuiltArgs", "ResidentTaskArgs", "Scalar", "TaskArgsBuilder", "TensorArg"]

log = logging.getLogger("simpler")


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"{what}: name must be a non-empty string, not {name!r}")
    return name


@dataclass(frozen=True, eq=False)
class TensorArg:
    """A tensor argument.

    Args:
        name: unique within its builder; used for access (``args.name``) and in messages.
        value: a numpy array (host-staged, or uploaded once when ``child_memory``) or a
            :class:`~simpler.DeviceTensor` (already resident).
        child_memory: declare the tensor resident: a case-owned device buffer, allocated (and,
            unless OUT, uploaded) once per case and passed through on every round.
    """

    name: str
    value: Any
    child_memory: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name, "TensorArg")
        if not isinstance(self.value, (np.ndarray, DeviceTensor)):
            raise ArgumentTypeError(
                f"TensorArg '{self.name}': value must be a numpy array or DeviceTensor, "
                f"not {type(self.value).__name__}"
            )
        if not isinstance(self.child_memory, (bool, np.bool_)):
            raise ArgumentTypeError(f"TensorArg '{self.name}': child_memory must be a bool")
        if self.child_memory and isinstance(self.value, DeviceTensor):
            raise ArgumentError(
                f"TensorArg '{self.name}': child_memory=True needs a host array "
                "(a DeviceTensor is already resident)"
            )

    is_tensor = True

    def _replace(self, **changes: Any) -> TensorArg:
        """A copy with ``changes`` applied (every other field kept)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        v = self.value
        desc = f"{v.dtype}{list(v.shape)}" if isinstance(v, np.ndarray) else repr(v)
        cm = ", child_memory=True" if self.child_memory else ""
        return f"TensorArg({self.name!r}, {desc}{cm})"


@dataclass(frozen=True, eq=False)
class Scalar:
    """A scalar argument (int, float or bool); scalars follow every tensor.

    ``child_memory`` is a read-only ``False`` so loops that read the flag over all specs work;
    use :meth:`TaskArgsBuilder.with_child_memory` to set it on tensors only.
    """

    name: str
    value: Any

    def __post_init__(self) -> None:
        _check_name(self.name, "Scalar")
        _core.check_scalar(self.value, f"Scalar '{self.name}'")

    is_tensor = False

    @property
    def child_memory(self) -> bool:
        """Always ``False``: a scalar has no device memory."""
        return False

    def _replace(self, **changes: Any) -> Scalar:
        """A copy with ``changes`` applied. ``child_memory`` is ignored: a scalar has no device
        memory, so ``[s._replace(child_memory=True) for s in specs]`` returns scalars unchanged."""
        changes.pop("child_memory", None)
        return dataclasses.replace(self, **changes) if changes else self

    def __repr__(self) -> str:
        return f"Scalar({self.name!r}, {self.value!r})"


Spec = TensorArg | Scalar


class BuiltArgs(Sequence[Any]):
    """Arguments ready for :meth:`Worker.run <simpler.Worker.run>`: values in order, with names.

    A read-only sequence of the values; ``names`` gives the names, ``_named_values()`` the pairs.
    """

    def __init__(self, pairs: Iterable[tuple[str, Any]]):
        self._pairs = list(pairs)

    @property
    def names(self) -> list[str]:
        """The argument names, in order."""
        return [n for n, _ in self._pairs]

    def _named_values(self) -> list[tuple[str, Any]]:
        return list(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [v for _, v in self._pairs[i]]
        return self._pairs[i][1]

    def __repr__(self) -> str:
        return f"BuiltArgs({self.names})"


class TaskArgsBuilder:
    """An ordered set of argument specs: tensors first, then scalars.

    ``args.query`` and ``args["query"]`` give the value of the spec named ``query``;
    ``args.query = arr`` is :meth:`replace`. Names must be unique and must not shadow a member
    of the builder (``clone``, ``specs``, ...) or start with ``_``.
    """

    def __init__(self, *specs: Spec):
        object.__setattr__(self, "_specs", {})
        self.add(*specs)

    # -- building --
    def add(self, *specs: Spec) -> TaskArgsBuilder:
        """Appends specs (a tensor after a scalar is an error); returns the builder."""
        for spec in specs:
            if not isinstance(spec, (TensorArg, Scalar)):
                raise ArgumentTypeError(
                    f"TaskArgsBuilder: expected TensorArg or Scalar, got {type(spec).__name__}"
                )
            name = spec.name
            if name.startswith("_") or hasattr(TaskArgsBuilder, name):
                raise ArgumentError(
                    f"TaskArgsBuilder: argument name '{name}' would shadow a builder member; rename it"
                )
            if name in self._specs:
                raise ArgumentError(f"TaskArgsBuilder: duplicate argument name '{name}'")
            if isinstance(spec, TensorArg) and any(isinstance(s, Scalar) for s in self._specs.values()):
                raise ArgumentError(
                    f"TaskArgsBuilder: tensor '{name}' after a scalar (tensors come before scalars)"
                )
            self._specs[name] = spec
        return self

    # -- access --
    @property
    def specs(self) -> tuple[Spec, ...]:
        """Every spec, in order."""
        return tuple(self._specs.values())

    @property
    def names(self) -> list[str]:
        """Every argument name, in order."""
        return list(self._specs)

    def tensors(self) -> list[TensorArg]:
        """The tensor specs, in order."""
        return [s for s in self._specs.values() if isinstance(s, TensorArg)]

    def scalars(self) -> list[Scalar]:
        """The scalar specs, in order."""
        return [s for s in self._specs.values() if isinstance(s, Scalar)]

    def spec(self, name: str) -> Spec:
        """The spec named ``name`` (``KeyError`` if none)."""
        try:
            return self._specs[name]
        except KeyError:
            raise KeyError(f"no argument named '{name}' (have: {', '.join(self._specs)})") from None

    def __getitem__(self, name: str) -> Any:
        return self.spec(name).value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        specs = self.__dict__.get("_specs", {})
        if name in specs:
            return specs[name].value
        raise AttributeError(f"TaskArgsBuilder has no argument or member '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._specs:
            self.replace(name, value)
        else:
            raise AttributeError(f"TaskArgsBuilder: no argument named '{name}' (use add() for new specs)")

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[Spec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"TaskArgsBuilder({', '.join(map(repr, self._specs.values()))})"

    # -- rebuilding (always dataclasses.replace: every other field is kept) --
    def replace(self, name: str, value: Any) -> Spec:
        """Replaces the value of ``name`` (tensor or scalar), keeping every other field; returns the spec."""
        spec = dataclasses.replace(self.spec(name), value=value)
        self._specs[name] = spec
        return spec

    def with_child_memory(self, *names: str, child_memory: bool = True) -> TaskArgsBuilder:
        """Sets ``child_memory`` on the named tensors (every tensor when no name is given).

        Scalars are skipped when no names are given; naming a scalar is an error.
        """
        targets = names or [s.name for s in self.tensors()]
        for n in targets:
            spec = self.spec(n)
            if not isinstance(spec, TensorArg):
                raise ArgumentError(f"with_child_memory: '{n}' is a scalar")
            self._specs[n] = dataclasses.replace(spec, child_memory=bool(child_memory))
        return self

    def clone(self) -> TaskArgsBuilder:
        """A copy with every numpy array deep-copied and every spec field kept.

        Device tensors are shared (there is nothing on the host to copy).
        """
        out = TaskArgsBuilder()
        for spec in self._specs.values():
            v = spec.value
            if isinstance(v, np.ndarray):
                v = v.copy(order="K")
            out._specs[spec.name] = dataclasses.replace(spec, value=v)
        return out

    def _named_values(self) -> list[tuple[str, Any]]:
        return [(s.name, s.value) for s in self._specs.values()]


def _no_orchestration(*_args: Any) -> None:
    """Stands in for an orchestration where only a signature is given."""


def _root(arr: np.ndarray) -> np.ndarray:
    """The outermost ndarray owning ``arr``'s storage (kept alive as long as that storage)."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


@dataclass
class _Entry:
    name: str
    direction: ArgDirection
    value: Any  # DeviceTensor for a resident entry; the host array for a zero-byte (staged) one

    @property
    def resident(self) -> bool:
        return isinstance(self.value, DeviceTensor)


class ResidentTaskArgs:
    """Case-owned device buffers for resident tensor arguments (see ``docs/concepts.md``).

    ``add(name, host, direction)`` allocates a device buffer, uploads ``host`` unless OUT, and
    keeps nothing of the host array (a weak reference only, to reject a later fixture whose
    storage overlaps it), so a streaming driver can drop each fixture before building the next.
    ``build_args()`` gives what :meth:`Worker.run <simpler.Worker.run>` takes; ``res[name]`` the
    device tensor of one argument (to mix with staged ones); ``copy_back(builder, names)``
    reads outputs back; ``release()`` frees in LIFO order (every free attempted, each failure
    logged, the first raised), idempotently. A context manager.
    """

    def __init__(self, worker: Worker):
        if not isinstance(worker, Worker):
            raise ArgumentTypeError(f"ResidentTaskArgs: expected a Worker, got {type(worker).__name__}")
        self._worker = worker
        self._set = worker._native._resident_open()
        self._entries: dict[str, _Entry] = {}
        # (name, weakref to the storage owner, first byte address, end address) of live fixtures
        self._extents: list[tuple[str, weakref.ref[np.ndarray], int, int]] = []
        self._released = False

    @classmethod
    def from_builder(
        cls,
        worker: Worker,
        builder: TaskArgsBuilder,
        signature: Callable | Sequence[Any],
    ) -> ResidentTaskArgs:
        """Makes every ``child_memory=True`` tensor of ``builder`` resident, directions from ``signature``.

        ``signature`` is a :class:`~simpler.Callable` or its signature. The tensor count must match
        it (checked before any device work). If an add fails, everything already allocated is
        released and the error re-raised.
        """
        if not isinstance(signature, Callable):
            signature = Callable(_no_orchestration, signature, name="ResidentTaskArgs.from_builder")
        tensors = builder.tensors()
        signature.check_tensor_count(len(tensors), "ResidentTaskArgs.from_builder")
        dirs = [d for d, _ in signature.signature]
        res = cls(worker)
        try:
            for spec, d in zip(tensors, dirs):
                if spec.child_memory:
                    res.add(spec.name, spec.value, d)
        except BaseException:
            try:
                res.release()
            except Exception:
                log.exception("rollback of a partial resident set also failed")
            raise
        return res

    # -- state --
    def _check_open(self, what: str) -> None:
        if self._released:
            raise StateError(f"ResidentTaskArgs.{what}: the set was released")

    @property
    def released(self) -> bool:
        """Whether :meth:`release` ran."""
        return self._released

    @property
    def names(self) -> list[str]:
        """Every added name, in add order (zero-byte fixtures included)."""
        return list(self._entries)

    @property
    def resident_names(self) -> list[str]:
        """The names that hold a device buffer, in add order."""
        return [n for n, e in self._entries.items() if e.resident]

    def direction(self, name: str) -> ArgDirection:
        """The direction ``name`` was added with."""
        return self._entry(name).direction

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"no resident argument named '{name}' (have: {', '.join(self._entries)})"
            ) from None

    def __getitem__(self, name: str) -> Any:
        """The device tensor of ``name`` (the host array for a zero-byte fixture)."""
        self._check_open(f"[{name!r}]")
        return self._entry(name).value

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        state = "released" if self._released else f"{len(self.resident_names)} resident"
        return f"ResidentTaskArgs({self.names}, {state})"

    # -- adding --
    def add(
        self,
        name: str,
        host: np.ndarray,
        direction: ArgDirection | str = ArgDirection.IN,
        host_view: str = "lazy",
        eager: bool = False,
    ) -> Any:
        """Makes ``host`` resident under ``name``; returns its :class:`~simpler.DeviceTensor`.

        ``host_view`` declares how the orchestrator reaches the tensor (``docs/host-views.md``):
        ``"mapping"``, ``"cached"`` (a mapping read through a host cache), ``"mirror"``, or
        ``"auto"`` / ``"lazy"`` (the worker's policy; the default). ``eager=True`` (or
        ``host_view="eager"``: the worker's policy, now) establishes the view when the tensor is
        added, so the first run that reads it pays nothing for it; otherwise it is established at
        the first access.

        Allocates ``host.nbytes``, uploads unless ``direction`` is OUT, keeps no reference to
        ``host``. A zero-byte fixture allocates nothing and stays host-staged: it is recorded and
        returned as is. Rejects duplicate names, non-numpy or non-contiguous arrays, unsupported
        dtypes, and storage that overlaps a still-alive earlier fixture. A failed upload frees
        what this call allocated.
        """
        self._check_open("add")
        _check_name(name, "ResidentTaskArgs.add")
        what = f"resident tensor '{name}'"
        if isinstance(host, np.ndarray) and host.nbytes:
            start = int(host.__array_interface__["data"][0])
            end = start + host.nbytes
            self._extents = [x for x in self._extents if x[1]() is not None]
            for other, ref, s, e in self._extents:
                # Storage still owned by that fixture's array: an alias.
                if start < e and s < end and ref() is not None:
                    raise ArgumentError(
                        f"{what}: its host storage overlaps resident fixture '{other}' "
                        "(an aliased layout cannot be made resident faithfully)"
                    )
        policies = ("lazy", "eager", *_core.VIEW_POLICIES)
        if host_view not in policies:
            raise ArgumentError(f"{what}: host_view must be one of {', '.join(policies)}, not {host_view!r}")
        eager = bool(eager) or host_view == "eager"
        d, added = self._worker._native._resident_add(self._set, name, host, direction)
        if added is None:  # no bytes: it stays host-staged
            self._entries[name] = _Entry(name, d, host)
            return host
        ptr, gen = added
        tensor = Buffer(self._worker, ptr, host.nbytes, owner=self, gen=gen).tensor(host.shape, host.dtype)
        self._entries[name] = _Entry(name, d, tensor)
        self._extents.append((name, weakref.ref(_root(host)), start, end))
        if host_view not in ("lazy", "eager", "auto"):
            self._worker._native._hint_view(ptr, gen, host_view)
        if eager:
            self._worker._native._establish_view(ptr, gen, name)
        return tensor

    # -- using --
    def build_args(self, expected_count: int | None = None, scalars: Sequence[Any] = ()) -> BuiltArgs:
        """Every added tensor in add order, then ``scalars`` (values or :class:`Scalar`).

        Raises ``ArgumentError`` when ``expected_count`` (the signature's tensor count) differs
        from the number of tensors added: a skipped fixture would shift every later argument.
        """
        self._check_open("build_args")
        if expected_count is not None and (
            isinstance(expected_count, bool) or not isinstance(expected_count, (int, np.integer))
        ):
            raise ArgumentTypeError(
                f"ResidentTaskArgs.build_args: expected_count must be an int, not {expected_count!r}"
            )
        if expected_count is not None and expected_count != len(self._entries):
            raise ArgumentError(
                f"ResidentTaskArgs.build_args: expected {expected_count} tensor arguments, "
                f"have {len(self._entries)} ({', '.join(self._entries) or 'none'}); "
                "was a fixture (e.g. an empty one) skipped instead of added?"
            )
        pairs: list[tuple[str, Any]] = [(n, e.value) for n, e in self._entries.items()]
        for i, s in enumerate(scalars):
            pairs.append((s.name, s.value) if isinstance(s, Scalar) else (f"scalar{i}", s))
        return BuiltArgs(pairs)

    def bind(self, builder: TaskArgsBuilder) -> BuiltArgs:
        """``builder``'s arguments in order, with every resident one replaced by its device tensor."""
        self._check_open("bind")
        pairs = []
        for spec in builder.specs:
            e = self._entries.get(spec.name)
            pairs.append((spec.name, e.value if e is not None and e.resident else spec.value))
        return BuiltArgs(pairs)

    def copy_back(self, builder: TaskArgsBuilder, names: Iterable[str] | None = None) -> None:
        """Reads resident tensors back into ``builder``'s arrays of the same names.

        ``names`` defaults to every resident OUT/INOUT tensor. A zero-byte fixture has nothing to
        read. The destination must be a writable C-contiguous array of the same shape and dtype.
        """
        self._check_open("copy_back")
        if names is None:
            names = [n for n, e in self._entries.items() if e.resident and e.direction is not ArgDirection.IN]
        elif isinstance(names, str):
            names = [names]
        for name in names:
            e = self._entry(name)
            if not e.resident:
                continue
            dst = builder[name]
            t: DeviceTensor = e.value
            what = f"copy_back '{name}'"
            if not isinstance(dst, np.ndarray):
                raise ArgumentTypeError(f"{what}: expected a numpy array, got {type(dst).__name__}")
            if tuple(dst.shape) != tuple(t.shape) or dst.dtype.name != t.dtype:
                raise ArgumentError(
                    f"{what}: destination is {dst.dtype}{list(dst.shape)}, resident tensor is "
                    f"{t.dtype}{list(t.shape)}"
                )
            self._worker.copy_from(dst, t.buffer)

    # -- releasing --
    def release(self) -> None:
        """Frees every buffer in LIFO order, attempting each even when one fails.

        Each failure is logged; after all were attempted the first is raised. Idempotent.
        """
        if self._released:
            return
        native = self._worker._native
        errors = native._resident_release(self._set)
        if native._resident_is_open(self._set):
            # Refused (a tensor is bound to the run in progress): nothing was freed; stay usable.
            raise errors[0]
        self._released = True
        self._extents.clear()
        self._entries.clear()
        if errors:
            first = errors[0]
            if len(errors) > 1:
                first.add_note(f"{len(errors) - 1} more release failure(s) were logged")
            raise first

    def __enter__(self) -> ResidentTaskArgs:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.release()
            return
        try:
            self.release()
        except Exception:
            log.exception("release after an error also failed")
