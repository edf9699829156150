"""The ``multiprocessing`` backend: one spawned process per device, each running a
:class:`~simpler.group._host.DeviceHost`, driven through a shared-memory mailbox. Standard
library only.

Each child is started with the ``spawn`` method (never ``fork``: a device context cannot cross a
fork), and serves calls in order.

The mailbox. The group holds one shared-memory block with two slots per child, one for the call
and one for its answer. A call is pickled once (only what is not an array: a round's arrays are
in the group's shared arrays already, :mod:`~simpler.group._transport`), written into the
child's call slot with a call id, and the child is woken by one byte on a pipe of its own; it
answers into its answer slot, echoing the call id, and wakes the parent with one byte on
another pipe. A message larger than its slot follows the byte on the pipe. A round writes every
child's call first and then reads every answer, so the devices work at once. Waking a sleeping
process costs tens of microseconds on a small virtual machine, so the parent first looks for the
answers in the mailbox for a short while (``_ANSWER_POLL_S``, yielding its core between looks)
and sleeps on the pipes only after that; it reads an answer's bytes only after its wake-up byte,
which the child writes after them (the pipe orders the two, on any processor). The parent checks
each answer's call id: an answer of another call closes the group (calls and answers out of
step).

Deaths. A child that dies (killed, crashed, out of memory) closes its end of its answer pipe:
the parent's read ends, and the error names the device, the phase and the exit code. A parent
that dies closes its end of each child's call pipe: a thread of the child watching that pipe
(``poll`` for ``POLLHUP``, see poll(2)) ends the child at once, whatever it is doing, so a
device is never held by an orphan. When the parent closes the pipe itself (a stop without a
``close`` call), the child releases what it holds and exits.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import secrets
import select
import signal
import struct
import threading
import time
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ._errors import DeviceGroupError, crossing
from ._host import DeviceHost
from ._transport import SharedArrays, attach

if TYPE_CHECKING:
    from .._core import _Platform

#: Bytes of each slot of the mailbox (a call, or an answer); a larger message follows on the pipe.
SLOT_BYTES = 64 << 10

#: A slot's header: the call id and the message's length.
_HEAD = struct.Struct("<QQ")

#: The wake-up byte: the message is in the slot, or follows on the pipe.
_IN_SLOT, _ON_PIPE = b"m", b"p"

#: The exit status of a child whose parent died.
ORPHANED_EXIT = 75

#: How often a child checks for its parent once the parent closed the call pipe itself.
_PARENT_POLL_S = 0.2

#: How long the parent looks for answers in the mailbox (giving up its core between looks) before
#: it sleeps on the answer pipes: a call answered within it costs the parent no wake-up.
_ANSWER_POLL_S = 200e-6


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or None at its end."""
    out = bytearray(n)
    view = memoryview(out)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return None
        got += k
    return bytes(out)


class _Slot:
    """One slot of the mailbox: a header and room for a message."""

    def __init__(self, buf: memoryview, offset: int):
        self._buf = buf
        self._offset = offset

    def put(self, call_id: int, message: bytes) -> bool:
        """Writes the message (True), or only its header when it is too large (False)."""
        fits = len(message) <= SLOT_BYTES
        if fits:
            start = self._offset + _HEAD.size
            self._buf[start : start + len(message)] = message
        _HEAD.pack_into(self._buf, self._offset, call_id, len(message))
        return fits

    def head(self) -> tuple[int, int]:
        """The call id and the message's length."""
        return _HEAD.unpack_from(self._buf, self._offset)

    def take(self, n: int) -> bytes:
        start = self._offset + _HEAD.size
        return bytes(self._buf[start : start + n])

    def release(self) -> None:
        self._buf = memoryview(b"")


def _slots(buf: memoryview, index: int) -> tuple[_Slot, _Slot]:
    """Child ``index``'s call slot and answer slot."""
    size = _HEAD.size + SLOT_BYTES
    return _Slot(buf, 2 * index * size), _Slot(buf, (2 * index + 1) * size)


def _mailbox_bytes(n: int) -> int:
    return 2 * n * (_HEAD.size + SLOT_BYTES)


def _watch_parent(fd: int, parent: int) -> None:
    """Ends this process when the parent dies: ``fd`` is the call pipe, whose only writer is the
    parent (a poll with no events asked reports only its hang-up, poll(2))."""

    def watch() -> None:
        p = select.poll()
        p.register(fd, 0)
        while True:
            try:
                p.poll()
                break
            except InterruptedError:  # pragma: no cover - retried by Python itself (PEP 475)
                continue
        # The pipe's end: the parent died, or closed it on purpose (then the main loop releases
        # what this process holds and exits; the parent is watched by its id meanwhile).
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="simpler-parent-watch", daemon=True).start()


def _serve(
    call: Connection,
    answer: Connection,
    mailbox: str,
    parent: int,
    platform: _Platform,
    device: int,
    index: int,
    options: dict[str, Any],
) -> None:
    """The child's loop: calls in order until ``close`` (or the parent goes away)."""
    # Ctrl+C in a terminal reaches the whole process group: the parent decides what the children
    # do (it closes them), so a child does not die of it half-way through a release.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    call_fd, answer_fd = call.fileno(), answer.fileno()
    _watch_parent(call_fd, parent)
    block = attach(mailbox)
    assert block.buf is not None  # an attached block is mapped
    inbox, outbox = _slots(block.buf, index)
    host = DeviceHost(platform, device, index, options)
    while True:
        kind = os.read(call_fd, 1)
        call_id, n = inbox.head()
        message = inbox.take(n) if kind == _IN_SLOT else _read_exact(call_fd, n) if kind else None
        if message is None:  # the parent closed the pipe: release what we hold
            host.close()
            return
        try:
            method, args = pickle.loads(message)
        except BaseException as e:  # a message this process cannot read: an error of the call
            method, status, result = "", "err", crossing(e)
        else:
            status, result = host.dispatch(method, args)
        try:
            reply = _dumps((status, result))
        except Exception as e:  # an answer that cannot cross is an error of the call, not a death
            reply = _dumps(("err", crossing(TypeError(f"the result of {method} cannot be pickled: {e}"))))
        try:
            if outbox.put(call_id, reply):
                os.write(answer_fd, _IN_SLOT)
            else:
                _write_all(answer_fd, _ON_PIPE + reply)
        except OSError:  # the parent is gone
            host.close()
            return
        if method == "close":
            return


class Child:
    """One device's process, seen from the parent."""

    def __init__(
        self,
        ctx: Any,
        mailbox: shared_memory.SharedMemory,
        platform: _Platform,
        device: int,
        index: int,
        options: dict[str, Any],
    ):
        self.device = device
        self.gone = False
        self._call_id = 0
        assert mailbox.buf is not None  # an open block is mapped
        self.inbox, self.outbox = _slots(mailbox.buf, index)
        call_r, self.call_w = os.pipe()
        answer_r, answer_w = os.pipe()
        self.answer_r = answer_r
        try:
            theirs = (Connection(call_r, writable=False), Connection(answer_w, readable=False))
            self.proc = ctx.Process(
                target=_serve,
                args=(*theirs, mailbox.name, os.getpid(), platform, device, index, options),
                name=f"simpler-device-{device}",
                daemon=True,
            )
            try:
                self.proc.start()
            finally:
                for c in theirs:  # the child has its own copies now
                    c.close()
        except BaseException:
            self._close_fds()
            raise

    def send(self, call_id: int, message: bytes) -> None:
        """Starts a call (the answer is read by :meth:`recv`). A child that is gone is noted,
        and its answer reads as its death."""
        self._call_id = call_id
        if self.gone:
            return
        try:
            if self.inbox.put(call_id, message):
                os.write(self.call_w, _IN_SLOT)
            else:
                _write_all(self.call_w, _ON_PIPE + message)
        except OSError:
            self.gone = True

    def recv(self) -> tuple[str, Any]:
        """The answer of the call in progress; ``("dead", exitcode)`` if the child died. An
        answer of another call raises ``DeviceGroupError``."""
        if not self.gone:
            try:
                kind = os.read(self.answer_r, 1)
            except OSError:
                kind = b""
            if kind:
                call_id, n = self.outbox.head()
                if call_id != self._call_id:
                    raise DeviceGroupError(
                        f"device {self.device} (process {self.pid()}) answered call {call_id} while "
                        f"call {self._call_id} was in progress: calls and answers are out of step",
                        self.device,
                    )
                reply = self.outbox.take(n) if kind == _IN_SLOT else _read_exact(self.answer_r, n)
                if reply is not None:
                    return pickle.loads(reply)
            self.gone = True
        self.proc.join(timeout=5)
        return "dead", self.proc.exitcode

    def answered(self) -> bool:
        """Whether the answer of the call in progress is in the mailbox (a hint only: its bytes
        are read once the wake-up byte is, which orders them after the child's writes)."""
        return self.gone or self.outbox.head()[0] == self._call_id

    def alive(self) -> bool:
        return not self.gone and self.proc.is_alive()

    def pid(self) -> int | None:
        return self.proc.pid

    def signal_kill(self) -> None:
        """Sends SIGKILL (its device memory goes with its process); does not wait."""
        self.gone = True
        if self.proc.exitcode is None:
            try:
                self.proc.kill()
            except (ProcessLookupError, ValueError):  # gone, or never started
                pass

    def reap(self, timeout: float) -> None:
        """Waits for the process to end (killing it after ``timeout``), then lets its pipes go.
        Idempotent."""
        # Our end of the call pipe first: a child that never got "close" sees the end of its
        # pipe and releases what it holds at once.
        self._close_fds()
        if self.proc.exitcode is None:
            self.proc.join(timeout=timeout)
        if self.proc.exitcode is None:
            self.signal_kill()
            self.proc.join()

    def _close_fds(self) -> None:
        for name in ("call_w", "answer_r"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)

    def forget(self) -> None:
        """In a forked child: lets go of this process's copies of the pipes, and of the
        process object, so nothing here reaches the parent's device process (multiprocessing's
        exit hook terminates the daemonic processes it knows of: CPython's
        ``Lib/multiprocessing/util.py``, ``_exit_function``)."""
        self.gone = True
        self._close_fds()
        from multiprocessing import process

        process._children.discard(self.proc)  # type: ignore[attr-defined]


class MultiprocessingBackend:
    """Spawns and drives the children of a group (a :class:`~simpler.group._backend.Backend`)."""

    name = "multiprocessing"

    def __init__(self, platform: _Platform, devices: list[int], options: dict[str, Any], address: str | None):
        if address is not None:
            raise ValueError("the multiprocessing backend runs on this machine: address is a ray option")
        ctx = mp.get_context("spawn")
        self.children: list[Child] = []
        self._ids = 0
        self.mailbox: shared_memory.SharedMemory | None = shared_memory.SharedMemory(
            name=f"simpler-{os.getpid()}-{secrets.token_hex(6)}-mailbox",
            create=True,
            size=_mailbox_bytes(len(devices)),
        )
        #: Every shared-memory block this backend created (for an account of what it holds).
        self.blocks = [self.mailbox.name]
        try:
            for i, d in enumerate(devices):
                self.children.append(Child(ctx, self.mailbox, platform, d, i, options))
        except BaseException:
            for c in self.children:  # the ones already started
                c.signal_kill()
            for c in self.children:
                c.reap(10)
            self.shutdown()
            raise

    # -- calls -------------------------------------------------------------------------------

    def encode(self, method: str, args: tuple[Any, ...]) -> bytes:
        """A call, pickled (raises, before anything is sent, when it cannot be)."""
        return _dumps((method, args))

    def start(self, index: int, message: bytes) -> None:
        self._ids += 1
        self.children[index].send(self._ids, message)

    def finish(self, index: int) -> tuple[str, Any]:
        return self.children[index].recv()

    def wait_any(self, indices: list[int], timeout: float | None) -> list[int]:
        """The children among ``indices`` to read next: those whose answer is in the mailbox,
        looked for during ``_ANSWER_POLL_S`` (yielding this core between looks, so that a child
        sharing it runs); after that the first one, whose read then sleeps until it answers or
        dies. The caller comes back for the rest."""
        children = self.children
        end = time.perf_counter() + _ANSWER_POLL_S
        while True:
            ready = [i for i in indices if children[i].answered()]
            if ready:
                return ready
            if time.perf_counter() >= end:
                return indices[:1]
            os.sched_yield()

    # -- processes ---------------------------------------------------------------------------

    def pid(self, index: int) -> int | None:
        return self.children[index].pid()

    def alive(self, index: int) -> bool:
        return self.children[index].alive()

    def kill(self, index: int) -> None:
        """Sends the child SIGKILL; :meth:`reap` waits for it."""
        self.children[index].signal_kill()

    def reap(self, index: int, timeout: float) -> None:
        """Waits for the child to end, killing it after ``timeout``."""
        self.children[index].reap(timeout)

    def stop(self, index: int, timeout: float) -> None:
        """After ``close``: the child exits, or is killed after ``timeout``."""
        self.children[index].reap(timeout)

    def shutdown(self) -> None:
        """Lets the mailbox go (every child has ended). Idempotent."""
        for c in self.children:
            c.inbox.release()
            c.outbox.release()
        if self.mailbox is not None:
            block, self.mailbox = self.mailbox, None
            block.close()
            block.unlink()

    def forget(self) -> None:
        """In a forked child: this copy of the backend never touches the parent's children."""
        for c in self.children:
            c.forget()

    def arena(self) -> SharedArrays:
        """Where the group places a round's arrays: shared memory, each array once."""
        return SharedArrays()

    def shared_blocks(self) -> tuple[list[str], str | None]:
        """Every block this backend created (the mailbox), and the one it holds now."""
        return list(self.blocks), None if self.mailbox is None else self.mailbox.name
