"""What a group needs of a backend (:mod:`~simpler.group._mp`, :mod:`~simpler.group._ray`): the
interface both satisfy, which :class:`~simpler.group.DeviceGroup` is written against."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Arena(Protocol):
    """Where a round's arrays go on their way to the devices, each array once: shared memory
    (:class:`~simpler.group._transport.SharedArrays`) or Ray's object store
    (:class:`~simpler.group._ray.ObjectStoreArrays`)."""

    def reserve(self, arrays: list[np.ndarray]) -> None:
        """Starts a round that places ``arrays``: what the previous round placed is let go."""
        ...

    def place(self, arr: np.ndarray, writable: bool) -> Any:
        """``arr`` as it crosses to a device (placed once, whatever reads it)."""
        ...

    def block_name(self) -> str | None:
        """The shared-memory block the round's arrays are in, or ``None``."""
        ...

    def write_back(self) -> None:
        """Copies what the devices wrote into the caller's writable arrays."""
        ...

    def close(self) -> None:
        """Lets every placed array go; idempotent."""
        ...


class Backend(Protocol):
    """The processes of a group's devices, one per device (by index), and the calls to them.

    A call is encoded once (:meth:`encode`, which raises before anything is sent when it
    cannot be), started on each device (:meth:`start`), and its answers read
    (:meth:`wait_any`, then :meth:`finish`): ``("ok", result)``, ``("err", (exception,
    trace))`` or ``("dead", cause)``."""

    #: The backend's name (``DeviceGroup(backend=...)``).
    name: str

    def encode(self, method: str, args: tuple[Any, ...]) -> Any:
        """A call of the device host's ``method`` with ``args``, ready to start."""
        ...

    def start(self, index: int, message: Any) -> None:
        """Starts an encoded call on device ``index``."""
        ...

    def wait_any(self, indices: list[int], timeout: float | None) -> list[int]:
        """The devices among ``indices`` whose answers to read next."""
        ...

    def finish(self, index: int) -> tuple[str, Any]:
        """The answer of device ``index``'s call in progress."""
        ...

    def pid(self, index: int) -> int | None:
        """The process id of device ``index``'s process, if known."""
        ...

    def alive(self, index: int) -> bool:
        """Whether device ``index``'s process was neither seen dead nor stopped."""
        ...

    def kill(self, index: int) -> None:
        """Ends device ``index``'s process at once (its memory goes with it)."""
        ...

    def reap(self, index: int, timeout: float) -> None:
        """After :meth:`kill`: waits for the process to end, killing it after ``timeout``."""
        ...

    def stop(self, index: int, timeout: float) -> None:
        """After a ``close`` call: the process exits, or is killed after ``timeout``."""
        ...

    def shutdown(self) -> None:
        """Lets go of what the backend holds once every process has ended; idempotent."""
        ...

    def forget(self) -> None:
        """In a forked child: this copy never touches the parent's processes."""
        ...

    def arena(self) -> Arena:
        """Where the group places its rounds' arrays (made once per group)."""
        ...

    def shared_blocks(self) -> tuple[list[str], str | None]:
        """The shared-memory blocks the backend created (by name, whether or not they still
        exist), and the one it holds now, if any."""
        ...
