"""What the devices of the state machine in tests/test_device_group.py run: module-level, so
that a device process imports them by name, in a module that imports little (every group the
state machine opens starts processes that import it)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import simpler as sp


def stamp(ctx, token, out):
    """Writes ``token + device index`` into the device's own output; returns it with the device."""
    out[...] = token + ctx.index
    return ctx.device, token + ctx.index


def stamp_and_alloc(ctx, token, out):
    """As :func:`stamp`, after a malloc and free on the device's worker (an armed fault fires)."""
    ctx.worker.free(ctx.worker.malloc(64))
    return stamp(ctx, token, out)


def hold_next(ctx, index, method, marker):
    """On the device at ``index``: its next call of ``DeviceHost.<method>`` touches ``marker``
    and then waits (a minute: the parent ends it first) before it runs."""
    if ctx.index != index:
        return
    from simpler.group._host import DeviceHost

    real = getattr(DeviceHost, method)

    def held(self, *args):
        setattr(DeviceHost, method, real)
        Path(marker).touch()
        time.sleep(60)
        return real(self, *args)

    setattr(DeviceHost, method, held)


def make_acc():
    k = sp.Kernel(lambda w, acc: np.add(acc, w, out=acc), [sp.IN, sp.INOUT], name="acc")
    return sp.Callable(lambda o, w, acc: o.submit(k, w, acc), [sp.IN, sp.INOUT], name="acc")
