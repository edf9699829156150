"""``DeviceTensor``: a tensor over a device buffer, and how the array ecosystem may see it.

A device tensor lives in device memory, which the host cannot read by address: numpy conversion
(``np.asarray``) is a ``TypeError``, as it is for CuPy arrays. On the cuda platform the memory is
CUDA device memory, so the tensor offers it without a copy through ``__cuda_array_interface__``
(version 3) and DLPack (``__dlpack__`` / ``__dlpack_device__``), which CuPy, PyTorch, JAX and
others consume. Device handles cannot be pickled.
"""

from __future__ import annotations

from typing import Any

from . import _core, _dlpack


class DeviceTensor(_core.DeviceTensor):
    """A tensor over a device buffer; passed to ``Worker.run`` it is resident (nothing is staged).

    ``DeviceTensor(buffer, shape, dtype, strides=None, offset=0)`` (``strides`` and ``offset`` in
    elements; usually made by ``Buffer.tensor``) is checked against the buffer when made:
    ``GeometryError`` on overflow, ``ArgumentError`` when it does not fit. Hashable; equal when it
    names the same elements of the same allocation.
    """

    __slots__ = ()

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise TypeError(
            "a DeviceTensor lives in device memory, which numpy cannot read: copy it to the host "
            "(worker.copy_from(np.empty(t.shape, t.np_dtype), t)) or read it in a run "
            "(orch.read_tensor)"
        )

    def __reduce__(self) -> Any:
        raise TypeError("a DeviceTensor names device memory of one worker and cannot be pickled")

    def _cuda_device(self) -> int:
        worker = self.buffer._worker
        if worker.platform != "cuda":
            raise AttributeError(
                f"__cuda_array_interface__ / DLPack: the tensor is on {worker.platform}, not cuda"
            )
        return worker.device_id

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) of the tensor, on the cuda platform only
        (``AttributeError`` elsewhere, so ``hasattr`` answers whether it is CUDA memory)."""
        self._cuda_device()
        dt = self.np_dtype
        item = dt.itemsize
        return {
            "shape": self.shape,
            "typestr": dt.str,
            "data": (self.buffer.ptr + self.offset * item, False),
            "strides": None if self.contiguous else tuple(s * item for s in self.strides),
            "version": 3,
            "stream": None,  # copies into device memory are synchronous: nothing to wait for
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCUDA, device id)``; ``BufferError`` off the cuda platform."""
        try:
            return (_dlpack.KDL_CUDA, self._cuda_device())
        except AttributeError as e:
            raise BufferError(str(e)) from None

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """A DLPack capsule of the tensor's device memory (no copy; cuda platform only).

        ``stream`` is accepted and needs no synchronization (nothing is pending on the tensor's
        memory); ``copy=True`` and a ``dl_device`` other than the tensor's are ``BufferError``s.
        The capsule is the unversioned ``dltensor`` kind, which every consumer accepts.
        """
        device = self.__dlpack_device__()
        if copy:
            raise BufferError("DeviceTensor.__dlpack__ cannot copy (copy=True)")
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"the tensor is on DLPack device {device}, not {tuple(dl_device)}")
        return _dlpack.export(self, self.buffer.ptr, device, self.np_dtype)
