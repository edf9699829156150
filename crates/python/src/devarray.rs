//! `DeviceArray`: what a kernel declared with ``device_arrays`` receives per tensor on a device
//! whose memory the host cannot reach (cuda): the task's view of device memory, exported
//! through the CUDA Array Interface and DLPack, valid only during the kernel's call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use simpler_runtime::Geometry;

use crate::arrays;
use crate::capi;
use crate::cell::Shared;
use crate::errors::state_err;
use crate::exporting::{self, KDL_CUDA};

/// One tensor of a task, as device memory: hand it to CuPy (``cupy.asarray(a)``) or PyTorch
/// (``torch.from_dlpack(a)``) without a copy. ``stream`` is the worker's stream, on which the
/// memory is ready (the runtime has also waited for it before the call). Valid only during
/// the kernel's call: afterwards every export raises ``StateError``. The arrays of IN tensors
/// are read-only (the interface says so, and torch's reader of the interface refuses read-only
/// arrays: give them to torch with ``torch.from_dlpack(a)``, as ``device_arrays="torch"`` does).
#[pyclass(module = "simpler._core", name = "DeviceArray", frozen)]
pub struct DeviceArray {
    cell: Arc<Shared>,
    addr: u64,
    geometry: Geometry,
    writable: bool,
    name: Arc<str>,
    live: Arc<AtomicBool>,
}

impl DeviceArray {
    pub fn new(
        cell: Arc<Shared>,
        (addr, geometry, writable): (u64, Geometry, bool),
        name: Arc<str>,
        live: Arc<AtomicBool>,
    ) -> DeviceArray {
        DeviceArray {
            cell,
            addr,
            geometry,
            writable,
            name,
            live,
        }
    }

    fn check_live(&self) -> PyResult<()> {
        if self.live.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(state_err(format!(
            "device array of tensor {}: its task is over (a DeviceArray is valid only during \
             the kernel's call)",
            self.name
        )))
    }

    fn np_dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(arrays::np_dtype(py, self.geometry.dtype())?.into_any())
    }
}

#[pymethods]
impl DeviceArray {
    /// The view's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.geometry.shape())
    }

    /// Strides in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.geometry.strides())
    }

    /// The numpy dtype of the elements.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.np_dtype(py)
    }

    /// The worker's stream (a ``CUstream`` handle as an int).
    #[getter]
    fn stream(&self) -> Option<u64> {
        self.cell.dev.stream_handle()
    }

    /// Whether the kernel may write the tensor (OUT or INOUT).
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// The CUDA Array Interface (version 3); ``stream`` is the worker's stream.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.check_live()?;
        let dt = self.np_dtype(py)?;
        let stream = self.cell.dev.stream_handle();
        exporting::cai_dict(py, &self.geometry, &dt, self.addr, !self.writable, stream)
    }

    /// ``(kDLCUDA, device id)``.
    fn __dlpack_device__(&self) -> (i32, u32) {
        (KDL_CUDA, self.cell.device_id)
    }

    /// A DLPack capsule of the view (no copy); ``stream`` as for ``DeviceTensor.__dlpack__``.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, u32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = max_version;
        let py = slf.py();
        let a = slf.get();
        a.check_live()?;
        let device = a.__dlpack_device__();
        let consumer = exporting::dlpack_request("array", device, stream, dl_device, copy)?;
        exporting::order_after(py, &*a.cell.dev, consumer)?;
        capi::dlpack_capsule(slf.as_any(), a.addr, device, &a.geometry, None)
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceArray({}, shape={:?}, dtype={}, address={:#x})",
            self.name,
            self.geometry.shape(),
            self.geometry.dtype().name(),
            self.addr
        )
    }
}
