"""The exception hierarchy of simpler.

Every error raised by simpler derives from :class:`SimplerError`. Where a Python user expects a
built-in category the class also derives from it (``ArgumentError`` is a ``ValueError``,
``ArgumentTypeError`` a ``TypeError``), so ``except ValueError`` keeps working.

The classes are declared by the native module (which raises them) and re-exported here.
"""

from __future__ import annotations

from ._core import (
    ArgumentError,
    ArgumentTypeError,
    CompileError,
    DeviceError,
    GeometryError,
    HazardError,
    NoHostViewError,
    PlatformUnavailableError,
    SimplerError,
    StateError,
)

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CompileError",
    "DeviceError",
    "GeometryError",
    "HazardError",
    "NoHostViewError",
    "PlatformUnavailableError",
    "SimplerError",
    "StateError",
]
