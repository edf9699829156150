"""Several devices: one worker process per device, with residency in each of them.

:class:`DeviceGroup` starts one child per device (the standard library's ``multiprocessing``
with the ``spawn`` method, or Ray actors), each owning one :class:`~simpler.Worker` and its
resident sets; :class:`GroupResidentSet` declares resident tensors across the devices (stacked
or replicated). See ``docs/device-groups.md``.
"""

from __future__ import annotations

from ._errors import DeviceGroupError, RemoteError
from ._group import BACKENDS, DeviceGroup, GroupResidentSet
from ._host import DeviceContext
from ._transport import GroupTensor

__all__ = [
    "BACKENDS",
    "DeviceContext",
    "DeviceGroup",
    "DeviceGroupError",
    "GroupResidentSet",
    "GroupTensor",
    "RemoteError",
]
