"""Argument specs and case-owned device buffers.

* :class:`TensorArg` / :class:`Scalar` name one argument of a callable; ``TensorArg(...,
  child_memory=True)`` declares that the tensor lives on the device for the whole case.
  Values written for upstream's runtime (hw-native-sys/simpler) are taken too and kept as
  given: a CPU torch tensor (runs read and write it through a numpy view of its memory), a ctypes
  scalar (runs pass its Python value); both conversions live in ``_arrays``.
* :class:`TaskArgsBuilder` is an ordered set of specs (tensors first, then scalars) with access by
  name; :meth:`Worker.run <simpler.Worker.run>` takes it directly (everything host-staged).
* :class:`ResidentTaskArgs` owns the device buffers of resident tensors: the native resident set
  (one fixture at a time in, LIFO release), plus construction from a builder with rollback.

Every place that rebuilds a spec uses :func:`dataclasses.replace`, so a field added to a spec is
never silently dropped (``clone()``, ``replace()``, ``with_child_memory()``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays, _core
from .errors import ArgumentError, ArgumentTypeError
from .worker import Callable, DeviceTensor, Worker

__all__ = ["BuiltArgs", "ResidentTaskArgs", "Scalar", "TaskArgsBuilder", "TensorArg"]

log = logging.getLogger("simpler")


@dataclass(frozen=True, eq=False)
class TensorArg:
    """A tensor argument.

    Args:
        name: unique within its builder; used for access (``args.name``) and in messages.
        value: a numpy array (host-staged, or uploaded once when ``child_memory``) or a
            :class:`~simpler.DeviceTensor` (already resident). A CPU, contiguous
            ``torch.Tensor`` (as upstream's tests build their fixtures) is taken too and kept as
            it is (``args.name`` is the tensor, so goldens written with torch work); runs read
            and write it through a numpy view of its memory, no copy, so what a run copies back
            lands in the tensor. :func:`simpler.as_numpy` gives that view. A CUDA or
            non-contiguous tensor is an ``ArgumentError``. torch is not a dependency and is never
            imported.
        child_memory: declare the tensor resident: a case-owned device buffer, allocated (and,
            unless OUT, uploaded) once per case and passed through on every round.
    """

    name: str
    value: Any
    child_memory: bool = False

    def __post_init__(self) -> None:
        _core.check_name(self.name, "TensorArg")
        host = self.value
        if not isinstance(host, (np.ndarray, DeviceTensor)):
            # A torch tensor is checked now (its numpy view is made at each use).
            host = _arrays.host_array(host, f"TensorArg '{self.name}'")
        if not isinstance(host, (np.ndarray, DeviceTensor)):
            raise ArgumentTypeError(
                f"TensorArg '{self.name}': value must be a numpy array or DeviceTensor "
                f"(or a CPU torch tensor), not {type(self.value).__name__}"
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
    """A scalar argument (int, float or bool, numpy scalars included); scalars follow every tensor.

    A numeric ctypes value (``ctypes.c_float(1.0)``, ``c_double``, ``c_int32``, ``c_int64``,
    ``c_uint32``, ``c_bool``, ...: how upstream's tests write scalars) is taken too and kept as
    it is (``args.scale.value`` works, as upstream's goldens read it); runs pass its Python
    value. ``c_float`` keeps its float32 rounding.

    ``child_memory`` is a read-only ``False`` so loops that read the flag over all specs work;
    use :meth:`TaskArgsBuilder.with_child_memory` to set it on tensors only.
    """

    name: str
    value: Any

    def __post_init__(self) -> None:
        _core.check_name(self.name, "Scalar")
        # The native check takes a ctypes value as its Python value (runs pass that).
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


BuiltArgs = _core.BuiltArgs
Sequence.register(BuiltArgs)


class TaskArgsBuilder:
    """An ordered set of argument specs: tensors first, then scalars.

    ``args.query`` and ``args["query"]`` give the value of the spec named ``query``;
    ``args.query = arr`` is :meth:`replace`. Names must be unique and must not shadow a member
    of the builder (``clone``, ``specs``, ...) or start with ``_``.

    Upstream's builder surface (hw-native-sys/simpler ``simpler_setup.TaskArgsBuilder``) works
    as there: ``TaskArgsBuilder(*specs)``, :meth:`add_tensor`, :meth:`add_scalar`,
    :meth:`tensor_names`, :attr:`specs`, :meth:`clone`, ``args.name``; a tensor after a scalar,
    a duplicate name or a name shadowing a member raises ``ArgumentError`` (a ``ValueError``,
    as upstream). Unlike upstream, a constructor argument that is not a spec is an error, not
    ignored, and the values are numpy arrays (torch tensors are converted, see
    :class:`TensorArg`).
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

    def add_tensor(self, name: str, value: Any, child_memory: bool = False) -> TaskArgsBuilder:
        """Appends ``TensorArg(name, value, child_memory)`` (upstream's ``add_tensor``); returns
        the builder. A tensor after a scalar is an ``ArgumentError``."""
        return self.add(TensorArg(name, value, child_memory))

    def add_scalar(self, name: str, value: Any) -> TaskArgsBuilder:
        """Appends ``Scalar(name, value)`` (upstream's ``add_scalar``; a ctypes value is taken as
        its Python value); returns the builder. Every tensor must be added before it."""
        return self.add(Scalar(name, value))

    # -- access --
    @property
    def specs(self) -> tuple[Spec, ...]:
        """Every spec (:class:`TensorArg` / :class:`Scalar`), in order."""
        return tuple(self._specs.values())

    def tensor_names(self) -> list[str]:
        """The tensor names, in order (upstream's ``tensor_names()``)."""
        return [s.name for s in self._specs.values() if isinstance(s, TensorArg)]

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
            elif _arrays.is_torch_tensor(v):
                v = v.clone()
            out._specs[spec.name] = dataclasses.replace(spec, value=v)
        return out

    def __simpler_args__(self) -> list[tuple[str, Any]]:
        """``(name, value)`` pairs: what :meth:`Worker.run <simpler.Worker.run>` reads from
        named arguments."""
        return [(s.name, s.value) for s in self._specs.values()]


def _no_orchestration(*_args: Any) -> None:
    """Stands in for an orchestration where only a signature is given."""


class ResidentTaskArgs(_core.ResidentSet):
    """Case-owned device buffers for resident tensor arguments (see ``docs/concepts.md``).

    ``ResidentTaskArgs(worker)`` opens an empty set. ``add(name, host, direction)`` allocates a
    device buffer, uploads ``host`` unless OUT, and keeps nothing of the host array (a weak
    reference only, to reject a later fixture whose storage overlaps it), so a streaming driver
    can drop each fixture before building the next. ``build_args()`` gives what
    :meth:`Worker.run <simpler.Worker.run>` takes; ``res[name]`` the device tensor of one
    argument (to mix with staged ones); ``bind(builder)`` a builder's arguments with the resident
    ones replaced; ``copy_back(builder, names)`` reads outputs back; ``release()`` frees in LIFO
    order (every free attempted, each failure logged, the first raised; refused while a tensor is
    bound to the run in progress), idempotently. A context manager.

    ``add`` takes a CPU torch tensor as ``host`` (uploaded from a numpy view of its memory) and
    ``build_args`` ctypes scalars, as every native entry point does (``simpler.as_numpy``).
    """

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
