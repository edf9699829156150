"""What crosses the process boundary of a device group, and how.

Only three kinds of value cross it:

* plain picklable values (scalars, strings, small tuples, dicts): pickled;
* numpy arrays (staged tensors, fixtures): placed once in shared memory by the parent
  (:class:`SharedArrays`) and sent as a :class:`ShmRef` (block name, offset, shape, dtype). Each
  child maps the block and views the bytes in place, so an array given to every device is copied
  once, into shared memory, never once per device. An array the child writes (a staged output)
  is written in place and copied back into the caller's array after the round;
* resident tensors, as a :class:`GroupTensor`: (device, set, name, generation). Never a host or
  device address: the child that owns the allocation resolves it, and refuses a handle of
  another device.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np

#: Arrays are placed at this alignment inside a block.
_ALIGN = 64


@dataclasses.dataclass(frozen=True)
class ShmRef:
    """An array in a shared-memory block: what a child needs to view it in place."""

    block: str
    offset: int
    shape: tuple[int, ...]
    #: The dtype itself (byte order, fields and ml_dtypes types included; it pickles).
    dtype: np.dtype
    strides: tuple[int, ...]
    #: Whether the child may write it (else its view is read-only).
    writable: bool = True


@dataclasses.dataclass(frozen=True)
class GroupTensor:
    """A resident tensor of a device group, as it crosses the process boundary: the device that
    owns it, the resident set, the argument's name and the set's generation (a handle kept past
    the set's release is refused). It carries no address."""

    device: int
    set_id: int
    name: str
    generation: int


def _span(nbytes: int) -> int:
    """The bytes an array takes in a block: its size rounded up to the alignment, at least one
    alignment (an empty array too, so that offsets stay distinct)."""
    return max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)


class SharedArrays:
    """The parent's shared-memory arena for one round: every array placed in it once.

    ``place(arr)`` copies ``arr`` (C-contiguous copy of its elements) into the arena and returns
    its :class:`ShmRef`; the same array object placed twice is placed once. ``write_back()``
    copies the arena's bytes of the arrays marked writable back into the caller's arrays.
    ``close()`` unlinks the blocks. A block is sized for the round's arrays; the arena keeps its
    last block for the next round when it is large enough (no new block, no unlink, per round).
    """

    def __init__(self) -> None:
        self._block: shared_memory.SharedMemory | None = None
        self._used = 0
        self._placed: dict[int, tuple[np.ndarray, ShmRef, bool]] = {}
        #: Every block this arena created, by name (for an account of what it holds).
        self.blocks: list[str] = []

    def reserve(self, arrays: list[np.ndarray]) -> None:
        """Makes room for ``arrays`` (one block for the round; reused when large enough)."""
        need = sum(_span(a.nbytes) for a in arrays) or _ALIGN
        self._placed.clear()
        self._used = 0
        if self._block is not None and self._block.size >= need:
            return
        self.close()
        # Named after this process, so that a block left behind says whose it was.
        self._block = shared_memory.SharedMemory(
            name=f"simpler-{os.getpid()}-{secrets.token_hex(6)}", create=True, size=max(need, 1 << 16)
        )
        self.blocks.append(self._block.name)

    def place(self, arr: np.ndarray, writable: bool) -> ShmRef:
        """The arena's copy of ``arr`` (copied in once per round, whatever reads it)."""
        key = id(arr)
        if key in self._placed:
            return self._placed[key][1]
        assert self._block is not None, "reserve() first"
        view = np.ndarray(arr.shape, arr.dtype, buffer=self._block.buf, offset=self._used)
        view[...] = arr
        ref = ShmRef(self._block.name, self._used, tuple(arr.shape), arr.dtype, view.strides, writable)
        self._used += _span(arr.nbytes)
        self._placed[key] = (arr, ref, writable)
        return ref

    def block_name(self) -> str | None:
        """The current block's name (children keep it mapped between rounds)."""
        return None if self._block is None else self._block.name

    def write_back(self) -> None:
        """Copies every writable array's bytes back into the caller's array."""
        if self._block is None:
            return
        for arr, ref, writable in self._placed.values():
            if not writable:
                continue
            shared = np.ndarray(ref.shape, arr.dtype, buffer=self._block.buf, offset=ref.offset)
            # Byte for byte (NaNs and bfloat16 included): an input nobody wrote is not copied.
            mine = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if not np.array_equal(shared.reshape(-1).view(np.uint8), mine):
                arr[...] = shared

    def close(self) -> None:
        """Unlinks the arena's block. Idempotent, and safe to call again after an interruption."""
        self._placed.clear()
        block = self._block
        if block is not None:
            block.close()
            try:
                block.unlink()
            except FileNotFoundError:  # unlinked by an earlier, interrupted close
                pass
            self._block = None


class Attached:
    """A child's view of the parent's blocks: each block mapped once, kept while in use."""

    def __init__(self) -> None:
        self._blocks: dict[str, shared_memory.SharedMemory] = {}

    def view(self, ref: ShmRef) -> np.ndarray:
        """The array ``ref`` names, in place (writes reach the parent)."""
        block = self._blocks.get(ref.block)
        if block is None:
            block = attach(ref.block)
            self._blocks[ref.block] = block
        arr = np.ndarray(ref.shape, ref.dtype, buffer=block.buf, offset=ref.offset, strides=ref.strides)
        if not ref.writable:
            arr.setflags(write=False)
        return arr

    def release(self, keep: str | None = None) -> None:
        """Unmaps every block but ``keep`` (the parent's current one)."""
        for name in [n for n in self._blocks if n != keep]:
            self._blocks.pop(name).close()


def attach(name: str) -> shared_memory.SharedMemory:
    """Maps the parent's block ``name`` without taking ownership of it (the parent unlinks it)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    # Before 3.13 attaching registers the block with the resource tracker: a spawned child shares
    # its parent's tracker, where the block is registered already (a set: nothing changes), and
    # the parent's unlink unregisters it.
    return shared_memory.SharedMemory(name=name)


def walk(value: Any, leaf: Any) -> Any:
    """``value`` with every leaf (an array, a handle) replaced by ``leaf(x)``; lists, tuples and
    dicts are walked, an argument builder (``__simpler_args__``: ``TaskArgsBuilder``) becomes the
    list of its values, other values are kept."""
    if isinstance(value, (np.ndarray, GroupTensor, ShmRef)):
        return leaf(value)
    args = getattr(value, "__simpler_args__", None)
    if args is not None and not isinstance(value, type):
        return [walk(v, leaf) for _, v in args()]
    if isinstance(value, list):
        return [walk(v, leaf) for v in value]
    if isinstance(value, tuple):
        return tuple(walk(v, leaf) for v in value)
    if isinstance(value, dict):
        return {k: walk(v, leaf) for k, v in value.items()}
    return value
