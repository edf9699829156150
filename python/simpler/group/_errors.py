"""The errors of device groups, and how an exception raised in a device's process is rebuilt in
the caller's: simpler's own errors (and ``ValueError``, ``TypeError``, ``KeyError``) by type
name, anything else as a :class:`RemoteError`."""

from __future__ import annotations

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

    def __init__(self, message: str, kind: str, device: int, phase: str):
        super().__init__(message)
        self.kind = kind
        self.device = device
        self.phase = phase


#: Exceptions a child raised, rebuilt by type name (anything else: RemoteError).
_ERRORS = {name: getattr(errors, name) for name in errors.__all__}
_ERRORS.update({"ValueError": ValueError, "TypeError": TypeError, "KeyError": KeyError})


def rebuild_remote(device: int, phase: str, kind: str, message: str, trace: str) -> BaseException:
    """The exception a device's process raised (``kind`` its type name, ``trace`` its traceback),
    rebuilt here with the device and the phase in its message and the trace as a note."""
    cls = _ERRORS.get(kind)
    text = f"device {device} ({phase}): {message}"
    e = cls(text) if cls is not None else RemoteError(f"{text} [{kind}]", kind, device, phase)
    e.__notes__ = [f"raised in the process of device {device}:\n{trace}"]  # type: ignore[attr-defined]
    return e
