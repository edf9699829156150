"""The exception hierarchy of simpler.

Every error raised by simpler derives from :class:`SimplerError`. Where a Python user expects a
built-in category the class also derives from it (``ArgumentError`` is a ``ValueError``,
``ArgumentTypeError`` a ``TypeError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "DeviceError",
    "GeometryError",
    "HazardError",
    "NoHostViewError",
    "PlatformUnavailableError",
    "SimplerError",
    "StateError",
]


class SimplerError(Exception):
    """Base class of every simpler error."""


class ArgumentError(SimplerError, ValueError):
    """A bad argument value: wrong count, bad index, a tensor larger than its buffer..."""


class ArgumentTypeError(SimplerError, TypeError):
    """An argument of the wrong kind: unsupported dtype, a float where an int is needed..."""


class GeometryError(ArgumentError):
    """A shape, stride, offset or size computation overflowed or is invalid for the tensor."""


class StateError(SimplerError, RuntimeError):
    """An operation invalid in the current state: use after free, release or close; a busy worker."""


class HazardError(SimplerError, RuntimeError):
    """An orchestrator access to bytes that a task submitted earlier in the run reads or writes."""


class NoHostViewError(SimplerError, LookupError):
    """An access to a device address that no host view of the run covers.

    Attributes:
        addr, nbytes: the device address and size of the access.
    """

    addr: int | None = None
    nbytes: int | None = None


class PlatformUnavailableError(SimplerError, RuntimeError):
    """The platform's vendor library is missing or failed to initialize."""


class DeviceError(SimplerError, RuntimeError):
    """A driver call failed.

    Attributes:
        op: the driver operation (``alloc``, ``free``, ``h2d``, ``d2h``, ``map``, ``unmap``).
        code: the driver's status code; ``code_name`` its symbolic name.
        call: the vendor (or sim) function that failed.
        phase: where it happened (``bind``, ``orchestrate``, ``execute``, ``copy_back``,
            ``cleanup``, ``resident_add``, ``release``, ``close``, ``buffer``).
        tensor: the tensor being handled, if any.
        addr, nbytes: the device address and size involved, if known.
    """

    op: str | None = None
    code: int | None = None
    code_name: str | None = None
    call: str | None = None
    phase: str | None = None
    tensor: str | None = None
    addr: int | None = None
    nbytes: int | None = None
