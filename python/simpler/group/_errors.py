"""The errors of device groups, and how an exception raised in a device's process reaches the
caller's: the library's own errors (and ``ValueError``, ``TypeError``, ``KeyError``) cross as
themselves, pickled with their attributes; anything else as a :class:`RemoteError`."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

from .. import errors


class DeviceGroupError(errors.SimplerError, RuntimeError):
    """A device of a group failed as a process: it died (killed, crashed, out of memory) or
    could not be reached. ``device`` and ``phase`` say which and when; the group is closed."""

    def __init__(self, message: str, device: int | None = None, phase: str = ""):
        super().__init__(message)
        self.device = device
        self.phase = phase


class RemoteError(errors.SimplerError, RuntimeError):
    """An exception a device's process raised whose type is not one of simpler's (a
    ``RuntimeError``, an ``AssertionError`` of a kernel, ...): ``kind`` is its type name,
    ``device`` and ``phase`` say where. The group stays usable."""

    def __init__(self, message: str, kind: str, device: int | None = None, phase: str = ""):
        super().__init__(message)
        self.kind = kind
        self.device = device
        self.phase = phase

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickling: the message and the fields, handed back to the constructor."""
        message = self.args[0] if self.args else ""
        return type(self), (message, self.kind, self.device, self.phase), self.__dict__


#: Built-in exceptions a caller catches by category, which cross as themselves too.
_CATEGORIES = (ValueError, TypeError, KeyError)


def _crosses_as_itself(e: BaseException) -> bool:
    """The library's own errors (from the ``simpler`` package, importable by the caller) and the
    built-in categories."""
    if type(e) in _CATEGORIES:
        return True
    return isinstance(e, errors.SimplerError) and type(e).__module__.split(".")[0] == "simpler"


def crossing(e: BaseException, trace: str | None = None) -> tuple[BaseException, str]:
    """What crosses back to the caller of an exception raised in a device's process: the
    exception itself when it is the library's own (or a built-in ``ValueError``, ``TypeError``,
    ``KeyError``) and it pickles, else a :class:`RemoteError` with its type name and message;
    and its traceback text (``trace``, or the exception's own)."""
    if trace is None:
        trace = "".join(traceback.format_exception(e))
    if _crosses_as_itself(e):
        try:
            pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # an attribute that cannot cross: the exception as a RemoteError
            pass
        else:
            return e, trace
    return RemoteError(str(e), type(e).__name__), trace


def raised_on(device: int, phase: str, e: BaseException, trace: str) -> BaseException:
    """The exception that crossed from ``device`` (:func:`crossing`), for the caller: the device
    and the phase in its message (and on a :class:`RemoteError`, with its type name), the
    device's traceback as a note."""
    text = f"device {device} ({phase}): {e}"
    if isinstance(e, RemoteError):
        text = f"{text} [{e.kind}]"
        e.device, e.phase = device, phase
    e.args = (text,)
    e.__notes__ = [f"raised in the process of device {device}:\n{trace}"]
    return e
