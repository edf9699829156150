"""The parent's side of a device group: :class:`DeviceGroup` and :class:`GroupResidentSet`."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import secrets
import threading
import warnings
import weakref
from collections.abc import Callable as Fn
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import errors
from .._core import PLATFORMS
from ..worker import CloseSummary, RunReport, WorkerStats
from ._backend import Backend
from ._errors import DeviceGroupError, raised_on
from ._host import DeviceContext
from ._transport import GroupTensor, SharedArrays, walk

if TYPE_CHECKING:
    from .._core import _Platform

log = logging.getLogger("simpler.group")

#: The backends a group runs on.
BACKENDS = ("multiprocessing", "ray")

#: How long a closing child may take to release its device before it is killed.
_CLOSE_TIMEOUT_S = 60.0

#: How long a killed child may take to end before it is waited for without a limit.
_KILL_TIMEOUT_S = 10.0

#: How many interruptions a stop outlasts before it leaves the rest to ``close()``.
_STOP_ATTEMPTS = 100


def _start_backend(
    name: str, platform: _Platform, devices: list[int], options: dict[str, Any], address: str | None
) -> Backend:
    """The processes of a group's devices on backend ``name`` (imported when first used)."""
    if name == "multiprocessing":
        from ._mp import MultiprocessingBackend

        return MultiprocessingBackend(platform, devices, options, address)
    from ._ray import RayBackend

    return RayBackend(platform, devices, options, address)


def _run_callable(ctx: DeviceContext, make: Fn[[], Any], args: Any) -> RunReport:
    """A round's function for :meth:`DeviceGroup.run`."""
    return ctx.run(make, args)


class _NotSent(errors.ArgumentError):
    """A call that could not be encoded for a device's process: nothing was sent."""


# -- the groups of this process: closed at exit, inert in a forked child ---------------------------

#: The open groups of this process, oldest first.
_OPEN: dict[int, weakref.ref[DeviceGroup]] = {}
_KEYS = itertools.count()


def _open_groups() -> list[DeviceGroup]:
    """The open groups, newest first."""
    return [g for ref in reversed(list(_OPEN.values())) if (g := ref()) is not None]


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork``: every group's copy becomes inert (its device processes
    are the parent's), and lets go of what would reach them."""
    for g in _open_groups():
        try:
            g._backend.forget()
        except Exception:  # a copy that cannot let go is still inert
            log.exception("forgetting the parent's device processes in a forked child")
    _OPEN.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_at_exit() -> None:
    """At interpreter exit: closes every group still open, newest first, in order (resident sets,
    then workers), with a ``ResourceWarning`` each, as an unclosed ``Worker`` warns."""
    for g in _open_groups():
        if g._owner != os.getpid() or g.closed:
            continue
        warnings.warn(
            f"unclosed {g!r} at exit: closing it (close it, or use it as a context manager)",
            ResourceWarning,
            stacklevel=1,
        )
        try:
            # A daemon thread may be in a call still: it is waited for, not forever.
            if not g._lock.acquire(timeout=_CLOSE_TIMEOUT_S):
                log.error("%r was still in a call at exit: its device processes are killed", g)
                g._stop_all(kill=True)
                continue
            try:
                g.close()
            finally:
                g._lock.release()
        except BaseException as e:  # every group is attempted; the error says what went wrong
            log.error("closing %r at exit: %s: %s", g, type(e).__name__, e)


def _hook_exit() -> None:
    """Registers :func:`_close_at_exit` as the last exit hook, so that it runs first (``atexit``
    runs hooks last in, first out: https://docs.python.org/3/library/atexit.html): before the
    hooks the backends registered, multiprocessing's (which terminates the daemonic processes it
    started) and Ray's (which shuts Ray down)."""
    atexit.unregister(_close_at_exit)
    atexit.register(_close_at_exit)


def _references(value: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], np.ndarray] | None:
    """The first array in ``value`` (walked as :func:`walk` does) whose dtype holds Python object
    references, and its path."""
    if isinstance(value, np.ndarray):
        return (path, value) if value.dtype.hasobject else None
    args = getattr(value, "__simpler_args__", None)
    if args is not None and not isinstance(value, type):
        items: Any = args()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, v in items:
        found = _references(v, (*path, key))
        if found is not None:
            return found
    return None


def _where(path: tuple[Any, ...]) -> str:
    """``("x", 2)`` as ``argument 'x'[2]``."""
    if not path:
        return "the value"
    return f"argument {path[0]!r}" + "".join(f"[{k!r}]" for k in path[1:])


class DeviceGroup:
    """Several devices, one worker process per device, with residency in each of them.

    ``DeviceGroup(platform="sim", devices=None, *, backend="multiprocessing", address=None,
    **worker_options)``

    Args:
        platform: ``"sim"``, ``"ascend"`` or ``"cuda"``; on ``sim`` each child simulates one
            device.
        devices: the device ids, one child each (default ``[0]``; on sim any distinct ids).
        backend: ``"multiprocessing"`` (the standard library, ``spawn`` start method, arrays
            through shared memory; one machine) or ``"ray"`` (one Ray actor per device, arrays
            through Ray's object store; a group can span machines).
        address: ray only: the cluster to join (``"auto"``, ``"ray://host:10001"``); ``None``
            joins or starts a local Ray.
        worker_options: passed to each child's :class:`~simpler.Worker` (``staging``,
            ``model``, ``view_policy``, ...). ``device_id`` is refused: each child's device is
            its entry of ``devices``.

    ``round(fn, per_device)`` runs ``fn(ctx, *args)`` on every device at once (``ctx`` a
    :class:`DeviceContext`: ``ctx.worker``, ``ctx.device``; ``fn`` must be importable by the
    children: a module-level function) and returns the results in device order. ``run(make,
    per_device)`` runs the :class:`~simpler.Callable` that the module-level ``make()`` builds on
    every device with that device's arguments, and returns each device's :class:`~simpler.RunReport`.
    Arguments may hold numpy arrays (placed once in shared memory, whatever the number of
    devices; a staged output is copied back into the caller's array after the round) and the
    resident tensors of a :meth:`resident_set` (only on their own device). An array whose dtype
    holds Python object references is refused, and so is an argument that cannot be pickled:
    nothing is sent, and the group stays open.

    Calls from several threads are serialized: one call at a time, each with its own answers.
    A child that dies in the middle of a call raises :class:`DeviceGroupError` naming the
    device, the phase and the exit code, after the other devices have finished the call; the
    group is then closed, every device's memory released. Ctrl+C during a call stops every
    child (a second one while they stop does not leave any behind). ``close()`` releases every
    resident set (newest first, each in LIFO order on every device), then every worker; a group
    left open at interpreter exit is closed so, with a ``ResourceWarning``. A process forked
    from the one that opened the group holds an inert copy of it. A context manager.
    """

    def __init__(
        self,
        platform: _Platform = "sim",
        devices: Sequence[int] | None = None,
        *,
        backend: str = "multiprocessing",
        address: str | None = None,
        **worker_options: Any,
    ):
        if platform not in PLATFORMS:
            raise errors.ArgumentError(f"platform must be one of {', '.join(PLATFORMS)}, not {platform!r}")
        ids = [0] if devices is None else list(devices)
        if not ids or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in ids):
            raise errors.ArgumentError(f"devices must be a non-empty list of device ids, not {devices!r}")
        if len(set(ids)) != len(ids):
            raise errors.ArgumentError(f"devices lists a device twice: {ids}")
        if backend not in BACKENDS:
            raise errors.ArgumentError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        if "device_id" in worker_options:
            raise errors.ArgumentError(
                f"device_id={worker_options['device_id']!r} is not an option of a group: each "
                f"device's process opens its entry of devices={ids} (name the devices there)"
            )
        self.platform = platform
        self.devices = ids
        self.backend_name = backend
        self._closed = True  # until the children exist
        self._stop_pending = False
        self._owner = os.getpid()
        self._lock = threading.RLock()
        self._sets: list[GroupResidentSet] = []
        self._set_ids = itertools.count(1)
        self._backend = _start_backend(backend, platform, ids, worker_options, address)
        # Where a round's arrays go: shared memory (multiprocessing), or Ray's object store, each
        # array put once.
        self._arena = self._backend.arena()
        #: Bytes the last round placed in shared memory (each array once, whatever reads it).
        self.shared_bytes = 0
        self._key = next(_KEYS)
        # The default argument binds the key; typeshed's one-argument callback type has no room for it.
        _OPEN[self._key] = weakref.ref(self, lambda _, key=self._key: _OPEN.pop(key, None))  # type: ignore[misc]
        _hook_exit()  # after the backend's start: its own exit hooks are registered by now
        self._closed = False
        try:
            self.pids: list[int] = self._all("open", [()] * len(ids), "open")
        except BaseException:
            self._stop_all(kill=True)
            raise

    def __len__(self) -> int:
        return len(self.devices)

    def __del__(self) -> None:
        if getattr(self, "_closed", True) or getattr(self, "_owner", None) != os.getpid():
            return
        warnings.warn(
            f"unclosed {self!r}: close it (or use it as a context manager)", ResourceWarning, stacklevel=2
        )
        try:
            self.close()
        except Exception:
            log.exception("closing an unclosed device group")

    def __repr__(self) -> str:
        if getattr(self, "_owner", os.getpid()) != os.getpid():
            state = f"inert: a forked copy of process {self._owner}'s"
        else:
            state = "closed" if self._closed else "open"
        return (
            f"DeviceGroup({self.platform!r}, devices={self.devices}, backend={self.backend_name!r}, {state})"
        )

    def __enter__(self) -> DeviceGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether the group was closed (by ``close``, or by a device's failure)."""
        return self._closed

    # -- calls -------------------------------------------------------------------------------

    def _check_owner(self) -> None:
        if os.getpid() != self._owner:
            raise errors.StateError(
                f"{self!r}: this process ({os.getpid()}) was forked from the one that opened the "
                f"group ({self._owner}), whose device processes it is not to touch; open a group here"
            )

    def _check_open(self) -> None:
        self._check_owner()
        if self._closed:
            raise errors.StateError(f"{self!r} is closed")

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """One call at a time: calls from several threads are serialized (each reads its own
        answers); the group is checked open once it is this call's turn."""
        self._check_owner()  # before the lock: a forked copy's lock may have been held at the fork
        with self._lock:
            self._check_open()
            yield

    def _all(
        self,
        method: str,
        per_device: Sequence[tuple[Any, ...]],
        phase: str,
        indices: Sequence[int] | None = None,
    ) -> list[Any]:
        """``method`` on every device (or on ``indices``) at once, with each device's arguments;
        the answers in that order. A call that cannot be encoded: ``ArgumentError``, nothing sent.
        A dead child: the others finish, the group closes, DeviceGroupError. A child's
        exception: raised (rebuilt), the first one in device order. Anything that stops the
        parent half-way (Ctrl+C, an answer it cannot read) leaves calls and answers out of step:
        every child is stopped and the group closed."""
        b = self._backend
        idx = list(range(len(self.devices))) if indices is None else list(indices)
        # Every message is encoded before anything is sent: one that cannot be fails the call,
        # and the group (no device has seen it) stays as it was.
        encoded: dict[int, Any] = {}
        messages = []
        for i, args in zip(idx, per_device):
            m = encoded.get(id(args))
            if m is None:
                try:
                    m = encoded[id(args)] = b.encode(method, args)
                except Exception as e:
                    raise _NotSent(
                        f"device {self.devices[i]} ({phase}): an argument cannot be sent to the "
                        f"device's process ({type(e).__name__}: {e}); nothing was sent, the group "
                        "stays open"
                    ) from e
            messages.append(m)
        answers: dict[int, Any] = {}
        pending = list(idx)
        try:
            for i, m in zip(idx, messages):
                b.start(i, m)
            while pending:
                for i in b.wait_any(pending, None):
                    answers[i] = b.finish(i)
                    pending.remove(i)
        except BaseException as e:
            what = "interrupted" if isinstance(e, KeyboardInterrupt) else f"failed ({e!r})"
            log.warning("%s during %s: stopping every device of %r", what, phase, self)
            self._stop_all(kill=True)
            if isinstance(e, DeviceGroupError) and not e.phase:
                raise DeviceGroupError(f"{e} during {phase}; the group is closed", e.device, phase) from e
            raise
        dead = [(i, answers[i][1]) for i in idx if answers[i][0] == "dead"]
        if dead:
            i, cause = dead[0]
            d = self.devices[i]
            how = f"exit code {cause}" if cause is None or isinstance(cause, int) else str(cause)
            others = ", ".join(f"device {self.devices[j]}" for j, _ in dead[1:])
            msg = (
                f"device {d} (process {b.pid(i)}) died during {phase} ({how})"
                + (f"; so did {others}" if others else "")
                + "; the group is closed and every other device's memory released"
            )
            self._close_after_failure()
            raise DeviceGroupError(msg, d, phase)
        for i in idx:
            if answers[i][0] == "err":
                raise raised_on(self.devices[i], phase, *answers[i][1])
        return [answers[i][1] for i in idx]

    def _pack(self, per_device: Sequence[Any], what: str) -> tuple[list[Any], str | None]:
        """Arrays in shared memory (each placed once), handles kept; the current block. An array
        whose dtype holds object references is refused before anything is placed."""
        if not any(per_device):
            self._arena.reserve([])  # nothing of an earlier round is written back
            self.shared_bytes = 0
            return list(per_device), self._arena.block_name()
        arrays: dict[int, np.ndarray] = {}
        rows_of: dict[int, set[int]] = {}
        refs = False
        for row, value in enumerate(per_device):

            def collect(x: Any, row: int = row) -> Any:
                nonlocal refs
                if isinstance(x, np.ndarray):
                    refs = refs or x.dtype.hasobject
                    arrays[id(x)] = x
                    rows_of.setdefault(id(x), set()).add(row)
                return x

            walk(value, collect)
        if refs:
            self._refuse_references(per_device, what)
        self._arena.reserve(list(arrays.values()))

        def place(x: Any) -> Any:
            if isinstance(x, np.ndarray):
                # An array given to several devices reaches them read-only: two devices writing
                # one array would race, and one of them would silently win.
                writable = x.flags.writeable and len(rows_of[id(x)]) == 1
                return self._arena.place(x, writable)
            return x

        packed = walk(list(per_device), place)
        self.shared_bytes = sum(a.nbytes for a in arrays.values())
        return packed, self._arena.block_name()

    def _refuse_references(self, per_device: Sequence[Any], what: str) -> None:
        """ArgumentError for the first array whose dtype holds Python object references (an
        ``object`` array, a structured dtype with an object field): its bytes are addresses in
        this process, which mean nothing in a device's."""
        for i, value in enumerate(per_device):
            found = _references(value)
            if found is not None:
                path, arr = found
                raise errors.ArgumentError(
                    f"device {self.devices[i]} ({what}): {_where(path)} is an array of dtype "
                    f"{arr.dtype}, whose elements are references to Python objects of this process; "
                    "it cannot cross to a device's process (convert it to a numeric dtype); nothing "
                    "was sent"
                )

    def _per_device(
        self, per_device: Sequence[Any] | None, args: tuple[Any, ...], what: str
    ) -> list[tuple[Any, ...]]:
        if per_device is None:
            return [tuple(args)] * len(self.devices)
        if args:
            raise errors.ArgumentError(f"{what}: give per_device or args, not both")
        rows = [tuple(a) if isinstance(a, (list, tuple)) else (a,) for a in per_device]
        if len(rows) != len(self.devices):
            raise errors.ArgumentError(
                f"{what}: per_device has {len(rows)} entries for {len(self.devices)} devices"
            )
        return rows

    def round(
        self, fn: Fn[..., Any], per_device: Sequence[Any] | None = None, *, args: tuple[Any, ...] = ()
    ) -> list[Any]:
        """Runs ``fn(ctx, *args_i)`` on every device at once; the results in device order.

        ``per_device`` gives each device its argument tuple; or ``args``, the same for all. Arrays
        in them reach the children through shared memory, each placed once; an array given to
        several devices reaches them read-only (give each device its own output array). Arrays a
        device wrote are copied back into the caller's arrays once every device has finished the
        round (a round that raised copies nothing back). An array of Python object references,
        or an argument that cannot be pickled, fails the call before anything is sent (the group
        stays open). Calls from several threads run one at a time."""
        with self._call():
            rows = self._per_device(per_device, args, "round")
            packed, block = self._pack(rows, "round")
            first = packed[0]
            same = all(r is first for r in packed)
            calls = [(fn, first, block)] * len(packed) if same else [(fn, r, block) for r in packed]
            results = self._all("call", calls, "round")
            # Only after a round every device finished: a failed round leaves the caller's arrays
            # as they were.
            self._arena.write_back()
            return results

    def run(
        self, make: Fn[[], Any], per_device: Sequence[Any] | None = None, *, args: Any = None
    ) -> list[RunReport]:
        """Runs the callable ``make()`` builds on every device, each with its argument list
        (``per_device[i]``, or ``args`` for all); the devices' reports, in device order."""
        rows = [list(args or [])] * len(self.devices) if per_device is None else list(per_device)
        if len(rows) == len(self.devices):
            self._refuse_references(rows, "run")
        return self.round(_run_callable, [(make, r) for r in rows])

    def inject_fault(self, device: int, op: str, nth: int | None = None, code: int | None = None) -> None:
        """Arms a fault on ``device``'s worker (its ``Worker.inject_fault``). A device whose
        process died closes the group, as in every other call (``DeviceGroupError``)."""
        with self._call():
            i = self._index(device)
            self._all("inject_fault", [(op, nth, code)], "inject_fault", indices=[i])

    def stats(self) -> list[WorkerStats]:
        """Every device's worker counters, in device order."""
        with self._call():
            return self._all("stats", [()] * len(self.devices), "stats")

    def resident_set(self) -> GroupResidentSet:
        """A new, empty resident set across the group's devices."""
        with self._call():
            s = GroupResidentSet(self, next(self._set_ids))
            self._sets.append(s)
            return s

    def _index(self, device: int) -> int:
        try:
            return self.devices.index(device)
        except ValueError:
            raise errors.ArgumentError(f"device {device} is not in {self!r}") from None

    # -- close -------------------------------------------------------------------------------

    def close(self) -> list[CloseSummary]:
        """Releases every resident set (newest first), then every worker; the children exit.
        Idempotent; returns each device's close summary. After a stop that was interrupted
        more often than it could outlast, finishes it. In a forked copy: does nothing."""
        if os.getpid() != self._owner:
            return []
        with self._lock:
            if self._closed:
                if self._stop_pending:
                    self._stop_all(kill=True)
                return []
            errs: list[BaseException] = []
            for s in reversed(list(self._sets)):
                try:
                    s.release()
                except BaseException as e:  # every set is attempted
                    errs.append(e)
            if self._closed:  # a device died (or Ctrl+C) during a release: the group closed itself
                raise errs[0]
            try:
                summaries = self._all("close", [()] * len(self.devices), "close")
            finally:
                if not self._closed or self._stop_pending:
                    self._stop_all(kill=False)
            if errs:
                raise errs[0]
            return summaries

    def _close_after_failure(self) -> None:
        """After a child died: the others release everything and exit."""
        b = self._backend
        sent = [i for i in range(len(self.devices)) if b.alive(i)]
        try:
            message = b.encode("close", ())
            for i in sent:
                b.start(i, message)
            for i in sent:
                status, result = b.finish(i)
                if status == "err":
                    log.error("device %s close after a failure: %s", self.devices[i], result[0])
        except BaseException:
            self._stop_all(kill=True)
            raise
        self._stop_all(kill=False)

    def _stop_all(self, kill: bool) -> None:
        """Ends every device process and lets go of the group's shared memory. Whatever
        interrupts it (a second Ctrl+C) makes it kill instead of wait, and it goes on; the
        interruption is raised once everything is released."""
        self._closed = True
        self._stop_pending = True
        for s in self._sets:
            s._released = True
        first: BaseException | None = None
        for _ in range(_STOP_ATTEMPTS):
            try:
                self._stop_once(kill)
            except BaseException as e:
                if first is None:
                    first = e
                kill = True
                continue
            self._stop_pending = False
            _OPEN.pop(self._key, None)
            break
        if first is not None:
            raise first

    def _stop_once(self, kill: bool) -> None:
        """One attempt at :meth:`_stop_all`; every step is safe to repeat."""
        b = self._backend
        n = len(self.devices)
        if kill:
            for i in range(n):
                b.kill(i)  # a signal: every child is on its way out before any is waited for
            for i in range(n):
                b.reap(i, _KILL_TIMEOUT_S)
        else:
            for i in range(n):
                b.stop(i, _CLOSE_TIMEOUT_S)
        self._arena.close()
        b.shutdown()

    def _resources(self) -> dict[str, list[Any]]:
        """What the group started, for an account of it: ``pids`` (its device processes),
        ``blocks`` (every shared-memory block it created, by name, whether or not it still
        exists) and ``held`` (the blocks it holds now: none once closed)."""
        blocks, holds = self._backend.shared_blocks()
        held = [] if holds is None else [holds]
        if isinstance(self._arena, SharedArrays):
            blocks += self._arena.blocks
            current = self._arena.block_name()
            if current is not None:
                held.append(current)
        return {"pids": list(getattr(self, "pids", [])), "blocks": blocks, "held": held}


class GroupResidentSet:
    """Resident tensors across a group's devices: each device holds its own allocation.

    ``add(name, value, direction, layout="replicated")`` adds one argument on every device:

    * ``layout="replicated"``: ``value`` whole on every device;
    * ``layout="stacked"``: ``value`` split along ``axis`` (``np.array_split``), shard ``i`` on
      device ``i``;
    * a list of arrays (one per device): shard ``i`` on device ``i``, as given.

    ``group_tensor = set[name]`` is the per-device list of handles; ``build_args(names)`` the
    per-device argument lists for :meth:`DeviceGroup.run`. ``gather(name)`` reads a tensor back:
    a stacked one joined along its axis, a replicated or listed one as the per-device list.
    ``release()`` frees every device's tensors in LIFO order. If an ``add`` fails on any device,
    the whole set is released on every device (the rollback of a single worker's resident set)
    and the error raised, naming the device. A context manager.
    """

    def __init__(self, group: DeviceGroup, set_id: int):
        self._group = group
        self.set_id = set_id
        # Unique across groups and sets: a handle kept from a released set, or from another
        # group on the same device ids, never names this set's tensors.
        self.generation = secrets.randbits(62)
        self._released = False
        self._entries: dict[str, tuple[str, int]] = {}
        group._all("open_set", [(set_id, self.generation)] * len(group), "resident set open")

    def __enter__(self) -> GroupResidentSet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    @property
    def released(self) -> bool:
        """Whether ``release`` ran."""
        return self._released

    def names(self) -> list[str]:
        """The arguments added, in order."""
        return list(self._entries)

    def _check(self) -> None:
        if self._released:
            raise errors.StateError(f"resident set {self.set_id} of the group was released")
        self._group._check_open()

    def add(
        self, name: str, value: Any, direction: Any, *, layout: str = "replicated", axis: int = 0
    ) -> list[GroupTensor]:
        """Adds ``name`` on every device (see the class docs); its per-device handles."""
        with self._group._call():
            return self._add(name, value, direction, layout, axis)

    def _add(self, name: str, value: Any, direction: Any, layout: str, axis: int) -> list[GroupTensor]:
        self._check()
        n = len(self._group)
        if name in self._entries:
            raise errors.ArgumentError(f"resident set {self.set_id}: {name!r} was added already")
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise errors.ArgumentError(f"{name!r}: {len(value)} shards for {n} devices")
            shards, layout = [np.asarray(v) for v in value], "listed"
        elif layout == "stacked":
            arr = np.asarray(value)
            if not -arr.ndim <= axis < arr.ndim or arr.shape[axis] < n:
                raise errors.ArgumentError(
                    f"{name!r}: cannot stack shape {arr.shape} along axis {axis} over {n} devices"
                )
            shards = np.array_split(arr, n, axis=axis)
        elif layout == "replicated":
            shards = [np.asarray(value)] * n
        else:
            raise errors.ArgumentError(f"layout must be 'replicated' or 'stacked', not {layout!r}")
        phase = f"add {name!r}"
        for d, shard in zip(self._group.devices, shards):
            if shard.dtype.hasobject:
                raise errors.ArgumentError(
                    f"device {d} ({phase}): an array of dtype {shard.dtype}, whose elements are "
                    "references to Python objects of this process, cannot be resident on a device "
                    "(convert it to a numeric dtype); nothing was sent"
                )
        packed, _ = self._group._pack([(s,) for s in shards], phase)
        try:
            self._group._all("add", [(self.set_id, name, row[0], direction) for row in packed], phase)
        except _NotSent:  # no device saw it: the set stays as it was
            raise
        except (errors.SimplerError, ValueError, TypeError, KeyError):
            # The rollback of a single worker's set: everything, on every device.
            self._release_quietly()
            raise
        self._entries[name] = (layout, axis)
        return self[name]

    def __getitem__(self, name: str) -> list[GroupTensor]:
        if name not in self._entries:
            raise KeyError(name)
        return [GroupTensor(d, self.set_id, name, self.generation) for d in self._group.devices]

    def build_args(self, names: Sequence[str] | None = None) -> list[list[GroupTensor]]:
        """Per device, the handles of ``names`` (default: every argument, in order)."""
        self._group._check_owner()
        self._check()
        names = self.names() if names is None else list(names)
        per_name = [self[n] for n in names]
        return [[h[i] for h in per_name] for i in range(len(self._group))]

    def gather(self, name: str) -> Any:
        """The current contents of ``name``: a stacked tensor joined along its axis, else the
        per-device list."""
        with self._group._call():
            self._check()
            return self._gather(name)

    def _gather(self, name: str) -> Any:
        layout, axis = self._entries[name]
        parts = [
            r[name] for r in self._group._all("read", [(self.set_id, [name])] * len(self._group), "gather")
        ]
        return np.concatenate(parts, axis=axis) if layout == "stacked" else parts

    def release(self) -> None:
        """Frees the set on every device, in LIFO order; idempotent."""
        g = self._group
        if os.getpid() != g._owner:  # a forked copy: inert
            return
        with g._lock:
            if self._released or g.closed:
                self._released = True
                return
            self._released = True
            g._sets.remove(self)
            g._all("release_set", [(self.set_id,)] * len(g), "resident set release")

    def _release_quietly(self) -> None:
        try:
            self.release()
        except BaseException:
            log.exception("rollback of group resident set %s also failed", self.set_id)
