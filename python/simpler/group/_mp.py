"""The ``multiprocessing`` backend: one spawned process per device, each running a
:class:`~simpler.group._host.DeviceHost` behind a pipe. Standard library only.

Each child is started with the ``spawn`` method (never ``fork``: a device context cannot cross a
fork), and serves calls in order: the parent writes one pickled ``(method, args)`` and reads one
``(status, result)`` back. A round sends to every child first and then reads every answer, so
the devices work at once. A child that dies (killed, crashed, out of memory) closes its end of the
pipe: the parent's read fails, and the error names the device, the phase and the exit code.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from multiprocessing.connection import Connection, wait
from typing import Any

from ._host import DeviceHost


def _pickle(obj: Any) -> bytes:
    """What ``Connection.send`` would write."""
    from multiprocessing.reduction import ForkingPickler

    return bytes(ForkingPickler.dumps(obj))


def _serve(conn: Connection, platform: str, device: int, index: int, options: dict[str, Any]) -> None:
    """The child's loop: calls in order until ``close`` (or the parent goes away)."""
    # Ctrl+C in a terminal reaches the whole process group: the parent decides what the children
    # do (it closes them), so a child does not die of it half-way through a release.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host = DeviceHost(platform, device, index, options)
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):  # the parent is gone: release what we hold
            host.close()
            return
        status, result = host.dispatch(method, args)
        try:
            answer = _pickle((status, result))
        except Exception as e:  # an answer that cannot cross is an error of the call, not a death
            from ._host import capture

            answer = _pickle(("err", capture(TypeError(f"the result of {method} cannot be pickled: {e}"))))
        try:
            conn.send_bytes(answer)
        except (BrokenPipeError, OSError):
            host.close()
            return
        if method == "close":
            return


class Child:
    """One device's process, seen from the parent."""

    def __init__(self, ctx: Any, platform: str, device: int, index: int, options: dict[str, Any]):
        self.device = device
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve,
            args=(theirs, platform, device, index, options),
            name=f"simpler-device-{device}",
            daemon=True,
        )
        self.proc.start()
        theirs.close()

    def send(self, method: str, args: tuple[Any, ...]) -> None:
        """Starts a call (the answer is read by :meth:`recv`)."""
        self.send_bytes(_pickle((method, args)))

    def send_bytes(self, message: bytes) -> None:
        """Starts a call already pickled (one pickling for every device of a round). A child
        that is gone is noted, and its answer reads as its death."""
        try:
            self.conn.send_bytes(message)
        except (BrokenPipeError, OSError):
            self.gone = True

    gone = False

    def recv(self) -> tuple[str, Any]:
        """The answer of the call in progress; ``("dead", exitcode)`` if the child died."""
        if not self.gone:
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                self.gone = True
        self.proc.join(timeout=5)
        return "dead", self.proc.exitcode

    def ready(self) -> Any:
        """What :func:`multiprocessing.connection.wait` waits on."""
        return self.conn

    def alive(self) -> bool:
        return not self.gone and self.proc.is_alive()

    def pid(self) -> int | None:
        return self.proc.pid

    def kill(self) -> None:
        """Ends the child at once (its device memory goes with its process)."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        if not self.conn.closed:
            self.conn.close()

    def join(self, timeout: float) -> None:
        # Our end first: a child that never got "close" sees the end of its pipe and releases
        # what it holds at once.
        self.conn.close()
        self.proc.join(timeout=timeout)
        if self.proc.is_alive():
            self.kill()


class Backend:
    """Spawns and drives the children of a group."""

    name = "multiprocessing"

    def __init__(self, platform: str, devices: list[int], options: dict[str, Any], address: str | None):
        if address is not None:
            raise ValueError("the multiprocessing backend runs on this machine: address is a ray option")
        ctx = mp.get_context("spawn")
        self.children: list[Child] = []
        try:
            for i, d in enumerate(devices):
                self.children.append(Child(ctx, platform, d, i, options))
        except BaseException:
            for c in self.children:  # the ones already started
                c.kill()
            raise

    def start(self, index: int, method: str, args: tuple[Any, ...]) -> None:
        self.children[index].send(method, args)

    def start_all(self, method: str, per_device: list[tuple[Any, ...]]) -> None:
        """Starts ``method`` on every child; a message the same for all is pickled once."""
        first = per_device[0]
        if all(a is first for a in per_device):
            message = _pickle((method, first))
            for c in self.children:
                c.send_bytes(message)
            return
        for c, a in zip(self.children, per_device):
            c.send(method, a)

    def finish(self, index: int) -> tuple[str, Any]:
        return self.children[index].recv()

    def wait_any(self, indices: list[int], timeout: float | None) -> list[int]:
        """The children among ``indices`` whose answer (or death) is ready. With every child
        working, the first one is simply waited for (a blocking read costs less than a
        selector); the caller comes back for the rest."""
        if timeout is None:
            return indices[:1]
        conns = {id(self.children[i].ready()): i for i in indices}
        ready = wait([self.children[i].ready() for i in indices], timeout)
        return [conns[id(c)] for c in ready]

    def pid(self, index: int) -> int | None:
        return self.children[index].pid()

    def alive(self, index: int) -> bool:
        return self.children[index].alive()

    def kill(self, index: int) -> None:
        self.children[index].kill()

    def stop(self, index: int, timeout: float) -> None:
        self.children[index].join(timeout)

    def shared_arrays(self) -> bool:
        """Whether arrays travel through the parent's shared memory (else by value)."""
        return True
