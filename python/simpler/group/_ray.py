"""The ``ray`` backend: one Ray actor per device, each running a
:class:`~simpler.group._host.DeviceHost`, arrays through Ray's object store.

Placement. Each device is one actor (``max_concurrency=1``: calls run in order, as in a
process of the ``multiprocessing`` backend; ``max_restarts=0``: a dead device stays dead),
named ``simpler-<platform>-<device>-<token>``. On ``sim`` an actor asks Ray for nothing beyond
an actor's default (placed on any node with a CPU, holding none while it runs). On ``cuda`` an
actor takes one ``GPU`` and on ``ascend`` one ``NPU`` (Ray's names for them): Ray places it on
a node with a free device, assigns one, and narrows the process's visible devices
(``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``) to it, and the child opens that
device. So on the vendor platforms the group's ``devices`` name the group's devices while Ray
picks the physical ones (one each, never shared with another Ray task); a group asks for no
more devices than the cluster has, else it is refused before anything starts.

Ray itself. ``address=None`` uses the Ray already initialized in this process, or starts a
local one (``ray.init()``); an address joins that cluster (``ray.init(address=...)``). A Ray
the group started stays up for later groups and ends with the process (Ray's own exit hook);
a Ray someone else started is never shut down by a group.

Arrays. :meth:`RayBackend.arena` gives the group an :class:`ObjectStoreArrays`: each array of a
call is put into the object store once (``ray.put``), whatever the number of devices reading
it, and crosses as a :class:`Stored` key, its ``ObjectRef`` passed beside the pickled call as a
top-level argument, which Ray resolves before the call runs (numpy from the object store: a
read-only view, without a copy); a small array rides in the call itself. In a round's call,
an array the caller holds writable may be written: the actor gives the function a private
writable copy, and after the call returns the copies whose bytes changed; the parent copies
those into the caller's arrays after the round. An array the caller holds read-only is given
as the read-only view, without a copy (how to share a large input across devices without a
copy per device). Other calls (a resident ``add``) only read their arrays: views, no copies.

Failures. A dead actor (killed, crashed, its node gone) answers ``("dead", <cause>)``, the
cause taken from Ray's error. Ctrl+C kills every actor (``ray.kill``); a close asks each actor
to exit (``__ray_terminate__``: Python's exit hooks run) and kills the ones that do not.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import re
import secrets
import sys
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PlatformUnavailableError
from ._errors import RemoteError, crossing
from ._host import DeviceHost

if TYPE_CHECKING:
    from .._core import _Platform

#: The Ray release the backend is tested with (``requirements/ray.txt`` pins the same).
RAY_VERSION = "2.52.1"

#: Arrays up to this size ride in the call itself (pickled once per device) instead of the
#: object store (a ``ray.put`` costs more than copying a few KiB).
INLINE_BYTES = 16 << 10

#: The Ray resource and the visibility variable of each vendor platform.
_ACCELERATORS = {
    "cuda": ("GPU", "CUDA_VISIBLE_DEVICES"),
    "ascend": ("NPU", "ASCEND_RT_VISIBLE_DEVICES"),
}


def _ray() -> Any:
    """The ``ray`` module, imported on first use."""
    try:
        import ray
    except ImportError as e:
        raise PlatformUnavailableError(f"the ray backend needs ray: pip install 'ray=={RAY_VERSION}'") from e
    return ray


@dataclasses.dataclass(frozen=True)
class Stored:
    """An array of a call, as it crosses to an actor: ``key`` names it among the round's arrays
    (an object in the store, passed beside the message), or ``value`` carries it; ``writable``
    says whether the caller's array may be written (it then gets written back)."""

    key: int
    value: np.ndarray | None
    writable: bool


class ObjectStoreArrays:
    """The parent's arrays of one round, in Ray's object store: the interface of
    :class:`~simpler.group._transport.SharedArrays` (``reserve``, ``place``, ``block_name``,
    ``write_back``, ``close``), plus :meth:`received`, which the backend calls with what the
    actors wrote."""

    def __init__(self) -> None:
        self._placed: dict[int, tuple[np.ndarray, Stored]] = {}
        self._refs: dict[int, Any] = {}
        self._keys = itertools.count()
        self._written: list[tuple[int, np.ndarray]] = []

    def reserve(self, arrays: list[np.ndarray]) -> None:
        """Starts a round: the previous round's objects are let go."""
        self.close()

    def place(self, arr: np.ndarray, writable: bool) -> Stored:
        """``arr`` for the actors: put once per round, whatever reads it."""
        held = self._placed.get(id(arr))
        if held is not None:
            s = held[1]
            if writable and not s.writable:
                s = dataclasses.replace(s, writable=True)
                self._placed[id(arr)] = (arr, s)
            return s
        key = next(self._keys)
        if arr.nbytes <= INLINE_BYTES:
            # A copy in C order, of the array's own shape (``np.ascontiguousarray`` would make a
            # 0-d array 1-d: numpy's docs of it).
            s = Stored(key, np.array(arr, order="C", copy=True), writable)
        else:
            s = Stored(key, None, writable)
            self._refs[key] = _ray().put(arr)
        self._placed[id(arr)] = (arr, s)
        return s

    def block_name(self) -> str | None:
        """No shared-memory block: ``None``."""
        return None

    def ref(self, key: int) -> Any:
        """The ``ObjectRef`` of a stored array."""
        return self._refs[key]

    def received(self, written: dict[int, np.ndarray]) -> None:
        """What an actor's call wrote (by key), copied back at :meth:`write_back`."""
        self._written.extend(written.items())

    def write_back(self) -> None:
        """Copies what the actors wrote into the caller's arrays."""
        by_key = {s.key: arr for arr, s in self._placed.values()}
        for key, data in self._written:
            arr = by_key.get(key)
            if arr is not None:
                arr[...] = data
        self._written.clear()

    def close(self) -> None:
        """Lets every object go."""
        self._placed.clear()
        self._refs.clear()
        self._written.clear()


def _stored(value: Any, out: list[Stored]) -> None:
    """Collects the :class:`Stored` arrays in ``value`` (lists, tuples and dicts walked)."""
    if isinstance(value, Stored):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _stored(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _stored(v, out)


def _replace(value: Any, arrays: dict[int, np.ndarray]) -> Any:
    """``value`` with every :class:`Stored` replaced by its array."""
    if isinstance(value, Stored):
        return arrays[value.key]
    if isinstance(value, list):
        return [_replace(v, arrays) for v in value]
    if isinstance(value, tuple):
        return tuple(_replace(v, arrays) for v in value)
    if isinstance(value, dict):
        return {k: _replace(v, arrays) for k, v in value.items()}
    return value


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte for byte (NaNs and bfloat16 included)."""
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    )


class DeviceActor:
    """One device's actor (wrapped by ``ray.remote`` at first use): a
    :class:`~simpler.group._host.DeviceHost` and the arrays of its calls."""

    def __init__(
        self, platform: _Platform, device: int, index: int, options: dict[str, Any], path: list[str]
    ):
        # The parent's import path: a round's function is pickled by reference to its module.
        sys.path.extend(p for p in path if p not in sys.path)
        self.host = DeviceHost(platform, device, index, options)

    def dispatch(self, message: bytes, *fetched: np.ndarray) -> tuple[str, Any, dict[int, np.ndarray] | None]:
        """One call: ``message`` is the pickled ``(method, args, keys)``, ``fetched`` the
        arrays of the store named by ``keys`` (Ray resolved them: read-only views). The answer
        of ``DeviceHost.dispatch`` and the writable arrays the call changed (by key), or None."""
        method, args, keys = pickle.loads(message)
        if method == "open" and self.host.platform in _ACCELERATORS and "device_id" not in self.host.options:
            try:
                self.host.options["device_id"] = _assigned_device(self.host.platform)
            except Exception as e:  # carried back, as DeviceHost.dispatch does
                return "err", crossing(e), None
        stored: list[Stored] = []
        _stored(args, stored)
        if not stored:
            status, result = self.host.dispatch(method, args)
            return (*_crossable(method, status, result), None)
        originals = dict(zip(keys, fetched))
        originals.update((s.key, s.value) for s in stored if s.value is not None)
        arrays = dict(originals)
        mine: set[int] = set()
        if method == "call":  # only a round's function may write its arrays
            for s in stored:
                if s.writable and s.key not in mine:
                    arrays[s.key] = np.array(originals[s.key], copy=True)
                    mine.add(s.key)
        for k, a in arrays.items():
            if k not in mine and a.flags.writeable:  # an inline copy: read-only like the store's
                a.setflags(write=False)
        status, result = self.host.dispatch(method, _replace(args, arrays))
        written = {k: arrays[k] for k in mine if not _same_bytes(arrays[k], originals[k])}
        return (*_crossable(method, status, result), written or None)


def _crossable(method: str, status: str, result: Any) -> tuple[str, Any]:
    """The answer, or, when the result cannot be serialized back, an error of the call (not the
    actor's death)."""
    if status != "ok":
        return status, result
    try:
        _ray().cloudpickle.dumps(result)
    except Exception as e:
        return "err", crossing(TypeError(f"the result of {method} cannot be pickled: {e}"))
    return status, result


def _assigned_device(platform: str) -> int:
    """The ordinal, among the devices this process sees, of the one Ray assigned to it."""
    resource, var = _ACCELERATORS[platform]
    ids = _ray().get_runtime_context().get_accelerator_ids().get(resource) or []
    if not ids:
        raise PlatformUnavailableError(f"Ray assigned no {resource} to this {platform} device's actor")
    visible = os.environ.get(var)
    if visible:
        seen = [v.strip() for v in visible.split(",")]
        if ids[0] in seen:
            return seen.index(ids[0])
    return int(ids[0])


def _dead_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's errors that mean the actor (its process, its node) is gone."""
    x = ray.exceptions
    return (x.RayActorError, x.WorkerCrashedError, x.NodeDiedError, x.LocalRayletDiedError)


def _death(e: BaseException) -> str:
    """What a dead actor's error says of the cause, in one line."""
    text = str(e)
    m = re.search(r"Worker exit type: (\S+) Worker exit detail: (.*?)(?: Some common causes|$)", text, re.S)
    if m:
        return f"Ray: its process ended, {m.group(1)}: {m.group(2).strip()}"
    lines = text.strip().splitlines()
    return f"Ray: {lines[0]}" if lines else f"Ray: {type(e).__name__}"


def _own_copies(value: Any) -> Any:
    """``value`` with read-only arrays (views of the object store) copied, so the caller owns
    what it is given, as with the other backend."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if isinstance(value, list):
        return [_own_copies(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_own_copies(v) for v in value)
    if isinstance(value, dict):
        return {k: _own_copies(v) for k, v in value.items()}
    return value


_ACTOR_CLASS: Any = None


def _actor_class(ray: Any) -> Any:
    """:class:`DeviceActor` as a Ray actor class, made once per process."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(DeviceActor)
    return _ACTOR_CLASS


def connect(address: str | None) -> Any:
    """The ``ray`` module, initialized: the Ray already up in this process, else the cluster at
    ``address``, else a new local Ray."""
    ray = _ray()
    if not ray.is_initialized():
        with warnings.catch_warnings():
            # A notice about the accelerator variables of future Ray releases, at every init.
            warnings.simplefilter("ignore", FutureWarning)
            ray.init(address=address, logging_level="WARNING")
    return ray


class RayBackend:
    """One Ray actor per device (see the module docs; a :class:`~simpler.group._backend.Backend`)."""

    name = "ray"

    def __init__(self, platform: str, devices: list[int], options: dict[str, Any], address: str | None):
        ray = connect(address)
        self._ray = ray
        self._store = ObjectStoreArrays()
        accel = _ACCELERATORS.get(platform)
        if accel is not None:
            have = ray.cluster_resources().get(accel[0], 0)
            if have < len(devices):
                raise PlatformUnavailableError(
                    f"the Ray cluster has {have:g} {accel[0]}(s); a {platform} group of "
                    f"{len(devices)} device(s) on ray takes one each"
                )
        actor_class = _actor_class(ray)
        token = secrets.token_hex(4)
        self.actors = []
        for i, d in enumerate(devices):
            opts: dict[str, Any] = {
                "name": f"simpler-{platform}-{d}-{token}",
                "max_concurrency": 1,
                "max_restarts": 0,
            }
            if accel is not None and accel[0] == "GPU":
                opts["num_gpus"] = 1
            elif accel is not None:
                opts["resources"] = {accel[0]: 1}
            self.actors.append(actor_class.options(**opts).remote(platform, d, i, options, list(sys.path)))
        n = len(devices)
        self._calls: list[tuple[str, Any] | None] = [None] * n
        self._answers: list[tuple[str, Any] | None] = [None] * n
        self._pids: list[int | None] = [None] * n
        self._gone = [False] * n

    # -- calls -------------------------------------------------------------------------------

    def _message(self, method: str, args: tuple[Any, ...]) -> tuple[bytes, list[Any]]:
        """A call as it goes to an actor: pickled once (``cloudpickle``: a function of a script's
        ``__main__`` travels by value), and the ``ObjectRef`` of each stored array it holds,
        passed beside it so that Ray fetches them before the call runs."""
        stored: list[Stored] = []
        _stored(args, stored)
        keys = list(dict.fromkeys(s.key for s in stored if s.value is None))
        message = self._ray.cloudpickle.dumps((method, args, keys))
        return message, [self._store.ref(k) for k in keys]

    def _submit(self, index: int, method: str, message: bytes, refs: list[Any]) -> None:
        self._answers[index] = None
        self._calls[index] = (method, self.actors[index].dispatch.remote(message, *refs))

    def encode(self, method: str, args: tuple[Any, ...]) -> tuple[str, bytes, list[Any]]:
        """A call, pickled for an actor (raises, before anything is sent, when it cannot be)."""
        return (method, *self._message(method, args))

    def start(self, index: int, message: tuple[str, bytes, list[Any]]) -> None:
        """Starts an encoded call on device ``index``'s actor (its answer: :meth:`finish`)."""
        self._submit(index, *message)

    def wait_any(self, indices: list[int], timeout: float | None) -> list[int]:
        """The calls among ``indices`` that have an answer (or a dead actor). Without a timeout:
        every one, once all have answered (the caller needs them all)."""
        ray = self._ray
        calls = {i: c for i in indices if (c := self._calls[i]) is not None}
        if timeout is None:
            if len(calls) < len(indices):  # a stopped actor: finish answers at once
                return list(indices)
            try:
                values = ray.get([c[1] for c in calls.values()])
            except ray.exceptions.RayError:
                return list(indices)  # each answer read by itself in finish
            for (i, c), v in zip(calls.items(), values):
                self._answers[i] = self._answered(i, c[0], v)
            return list(indices)
        by_ref = {c[1]: i for i, c in calls.items()}
        ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout)
        return [i for i in indices if i not in calls] + [by_ref[r] for r in ready]

    def finish(self, index: int) -> tuple[str, Any]:
        """The answer of device ``index``'s call: ``("ok", result)``, ``("err", (exception,
        trace))`` or ``("dead", cause)``."""
        answer = self._answers[index]
        if answer is not None:
            self._answers[index] = None
            self._calls[index] = None
            return answer
        call = self._calls[index]
        self._calls[index] = None
        if call is None:
            return "dead", "no call in progress (the actor was stopped)"
        ray = self._ray
        try:
            value = ray.get(call[1])
        except _dead_errors(ray) as e:
            self._gone[index] = True
            return "dead", _death(e)
        except ray.exceptions.RayTaskError as e:  # the actor's own code (not DeviceHost's)
            cause = e.cause if e.cause is not None else e
            trace = getattr(e, "traceback_str", None) or str(e)
            return "err", crossing(cause, trace)
        except ray.exceptions.RayError as e:  # an argument lost by the object store, ...
            return "err", (RemoteError(str(e), type(e).__name__), "")
        return self._answered(index, call[0], value)

    def _answered(self, index: int, method: str, value: tuple[str, Any, Any]) -> tuple[str, Any]:
        """A call's answer: arrays it wrote handed to the store, read-only results copied."""
        status, result, written = value
        if written:
            self._store.received(written)
        if status == "ok" and method == "open":
            self._pids[index] = result
        if status == "ok" and isinstance(result, (np.ndarray, list, tuple, dict)):
            result = _own_copies(result)
        return status, result

    # -- processes ---------------------------------------------------------------------------

    def pid(self, index: int) -> int | None:
        """The actor's process id (from its ``open`` answer), on its node."""
        return self._pids[index]

    def alive(self, index: int) -> bool:
        """Whether the actor was neither seen dead nor stopped."""
        return not self._gone[index]

    def kill(self, index: int) -> None:
        """Ends the actor at once (its device memory goes with its process)."""
        self._gone[index] = True
        self._calls[index] = self._answers[index] = None
        try:
            self._ray.kill(self.actors[index], no_restart=True)
        except Exception:  # gone already
            pass

    def reap(self, index: int, timeout: float) -> None:
        """After :meth:`kill`: nothing to wait for here (Ray ends the actor's process)."""

    def stop(self, index: int, timeout: float) -> None:
        """After ``close``: the actor exits (its exit hooks run), or is killed after ``timeout``."""
        if self._gone[index]:
            self.kill(index)
            return
        ray = self._ray
        try:
            done = self.actors[index].__ray_terminate__.remote()
            ready, _ = ray.wait([done], timeout=timeout)
        except Exception:
            ready = []
        if not ready:
            self.kill(index)
        self._gone[index] = True
        self._calls[index] = self._answers[index] = None

    def shutdown(self) -> None:
        """Lets the round's objects go (every actor has ended)."""
        self._store.close()

    def forget(self) -> None:
        """In a forked child: nothing to let go (the group's copy is inert)."""

    def arena(self) -> ObjectStoreArrays:
        """Where the group places a round's arrays: Ray's object store, each array once."""
        return self._store

    def shared_blocks(self) -> tuple[list[str], str | None]:
        """No shared memory: none."""
        return [], None
