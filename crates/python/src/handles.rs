//! The handles users hold between runs: device buffers, device tensors, and the host
//! windows numpy arrays are made over. A buffer holds the worker it was allocated on (an `Arc`
//! of the worker cell) and its allocation's handle (address and generation); a device tensor
//! holds its buffer. Every rule about them (ownership, generations, extents) is the runtime's.

use std::sync::{Arc, OnceLock};

use numpy::{
    PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadwriteArray1, PyUntypedArray,
    PyUntypedArrayMethods,
};
use std::ffi::CString;

use pyo3::exceptions::{PyAttributeError, PyBufferError, PyRuntimeWarning, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use simpler_runtime::{BufferRef, Error, ExportGuard, Geometry, HostWindow, WorkerCell};

use crate::arrays;
use crate::capi;
use crate::cell::Shared;
use crate::convert;
use crate::errors::{done, state_err, type_err, type_name, Exc, PyResultExt};
use crate::exporting::{self, KDL_CUDA};

/// What a copy or a free names: a ``Buffer``, or a ``DeviceTensor`` (its buffer, and for a copy
/// its elements).
pub struct BufferArg {
    pub buffer: Py<Buffer>,
    pub tensor: Option<Geometry>,
}

impl BufferArg {
    /// The whole of `buffer`.
    fn of(buffer: &Bound<'_, Buffer>) -> BufferArg {
        BufferArg {
            buffer: buffer.clone().unbind(),
            tensor: None,
        }
    }

    pub fn buf(&self) -> BufferRef {
        self.buffer.get().buf
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for BufferArg {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = obj.cast::<Buffer>() {
            return Ok(BufferArg::of(&b.to_owned()));
        }
        if let Ok(t) = obj.cast::<DeviceTensor>() {
            let t = t.get();
            return Ok(BufferArg {
                buffer: t.buffer.clone_ref(obj.py()),
                tensor: Some(t.geometry),
            });
        }
        Err(type_err(format!(
            "expected a Buffer or DeviceTensor, got {}",
            type_name(&obj)
        )))
    }
}

/// The byte offset in the allocation of a copy of `len` bytes `off` bytes into `target`.
fn window(target: &BufferArg, what: &str, off: u64, len: u64) -> PyResult<u64> {
    match &target.tensor {
        Some(g) => g.copy_window(&what, off, len).py(),
        None => Ok(off),
    }
}

/// Copies a C-contiguous array into `target` at byte `offset` (from the start of a tensor's
/// elements), through the worker behind `cell` (which refuses another worker's buffer).
pub fn copy_to(
    py: Python<'_>,
    cell: &Shared,
    target: &BufferArg,
    arr: &Bound<'_, PyAny>,
    offset: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let off = convert::u64_arg(offset, "copy_to", "byte offset")?;
    let bytes = contiguous_bytes(arr, "copy_to")?;
    let ro: PyReadonlyArray1<'_, u8> = bytes.extract()?;
    let s = ro.as_slice()?;
    let off = window(target, "copy_to", off, s.len() as u64)?;
    let buf = target.buf();
    done(py, cell.with(true, |w| w.copy_to(buf, off, s)))
}

/// Fills a C-contiguous, writable array from `source` at byte `offset` (from the start of a
/// tensor's elements).
pub fn copy_from(
    py: Python<'_>,
    cell: &Shared,
    arr: &Bound<'_, PyAny>,
    source: &BufferArg,
    offset: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let off = convert::u64_arg(offset, "copy_from", "byte offset")?;
    let bytes = contiguous_bytes(arr, "copy_from")?;
    let mut rw: PyReadwriteArray1<'_, u8> = bytes
        .cast::<PyArray1<u8>>()?
        .try_readwrite()
        .map_err(|_| Exc::Argument.err("copy_from: destination array is read-only"))?;
    let d = rw.as_slice_mut()?;
    let off = window(source, "copy_from", off, d.len() as u64)?;
    let buf = source.buf();
    done(py, cell.with(true, |w| w.copy_from(buf, off, d)))
}

/// The bytes of a numpy array whose bytes are its elements in order, as a flat uint8 view.
fn contiguous_bytes<'py>(arr: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyAny>> {
    let a = &convert::ndarray(arr, &what)?;
    let g = convert::array_geometry(a, &what)?
        .ok_or_else(|| not_native(a, &what))
        .and_then(|g| g.require_contiguous(&what).map(|_| g).py())?;
    Ok(capi::flat_bytes(a, g.extent())?.into_any())
}

/// The refusal of an array the runtime cannot take byte for byte (numpy's own layout named).
pub fn not_native(a: &Bound<'_, PyUntypedArray>, what: &dyn std::fmt::Display) -> PyErr {
    crate::errors::PyRuntimeErr(Error::not_contiguous(
        what,
        &format_args!(
            "shape {:?}, byte strides {:?}, dtype {}",
            a.shape(),
            a.strides(),
            a.dtype()
        ),
    ))
    .into()
}

/// A device allocation made by ``Worker.malloc`` (or owned by a resident set).
///
/// A buffer names its allocation by address and generation: after ``free`` (or the release of
/// its resident set, or the worker's close) every use of it is a ``StateError`` saying so, even
/// if a newer allocation starts at the same address. It holds its worker, so it can be used on
/// its own: ``free``, ``copy_to``, ``copy_from``, ``tensor``; a context manager that frees it.
#[pyclass(module = "simpler._core", name = "Buffer", frozen, weakref)]
pub struct Buffer {
    pub cell: Arc<Shared>,
    pub buf: BufferRef,
    pub nbytes: u64,
}

impl Buffer {
    pub fn new(cell: Arc<Shared>, buf: BufferRef, nbytes: u64) -> Buffer {
        Buffer { cell, buf, nbytes }
    }
}

#[pymethods]
impl Buffer {
    /// The device address.
    #[getter]
    fn ptr(&self) -> u64 {
        self.buf.ptr.0
    }

    /// The allocation's size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// A device tensor over this buffer: ``strides`` and ``offset`` in elements.
    ///
    /// Raises ``GeometryError`` on overflow and ``ArgumentError`` when the tensor's extent does
    /// not fit the buffer.
    #[pyo3(signature = (shape, dtype, strides=None, offset=None))]
    fn tensor(
        slf: &Bound<'_, Self>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        strides: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<DeviceTensor> {
        DeviceTensor::over(slf, shape, dtype, strides, offset)
    }

    /// Frees the buffer (its host view first).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let b = self.buf;
        done(py, self.cell.with(true, |w| w.free(b)))
    }

    /// Copies a C-contiguous array into the buffer at byte ``offset``.
    #[pyo3(signature = (arr, offset=None))]
    fn copy_to(
        slf: &Bound<'_, Self>,
        arr: &Bound<'_, PyAny>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (py, b, me) = (slf.py(), slf.get(), BufferArg::of(slf));
        copy_to(py, &b.cell, &me, arr, &zero_or(py, offset))
    }

    /// Fills a C-contiguous, writable array from the buffer at byte ``offset``.
    #[pyo3(signature = (arr, offset=None))]
    fn copy_from(
        slf: &Bound<'_, Self>,
        arr: &Bound<'_, PyAny>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (py, b, me) = (slf.py(), slf.get(), BufferArg::of(slf));
        copy_from(py, &b.cell, arr, &me, &zero_or(py, offset))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Frees the buffer, unless it was freed already (by hand, with its resident set, or by
    /// the worker's close). A buffer that cannot be freed (owned by a resident set, bound to
    /// the run in progress) raises, or, when the block raised already, warns and lets that
    /// exception through.
    #[pyo3(signature = (*exc_info))]
    fn __exit__(&self, py: Python<'_>, exc_info: &Bound<'_, PyTuple>) -> PyResult<()> {
        let b = self.buf;
        let r = done(py, self.cell.with(true, |w| w.free_if_live(b)));
        match r {
            Err(e) if exc_info.get_item(1).is_ok_and(|x| !x.is_none()) => {
                let msg = format!("leaving the buffer's block: {}", e.value(py));
                PyErr::warn(
                    py,
                    &py.get_type::<PyRuntimeWarning>(),
                    &CString::new(msg)?,
                    1,
                )
            }
            r => r.map(|_| ()),
        }
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a Buffer names device memory of one worker and cannot be pickled",
        ))
    }

    fn __repr__(&self) -> String {
        format!("Buffer({}, {} bytes)", self.buf.ptr, self.nbytes)
    }
}

/// `offset`, or 0.
pub fn zero_or<'py>(py: Python<'py>, offset: Option<&Bound<'py, PyAny>>) -> Bound<'py, PyAny> {
    match offset {
        Some(o) => o.clone(),
        None => 0u64
            .into_pyobject(py)
            .map(|o| o.into_any())
            .unwrap_or_else(|e| match e {}),
    }
}

/// A tensor over a device buffer; passed to ``Worker.run`` it is resident (nothing is staged).
///
/// ``DeviceTensor(buffer, shape, dtype, strides=None, offset=0)`` (``strides`` and ``offset``
/// in elements; usually made by ``Buffer.tensor``) is checked against the buffer when made:
/// ``GeometryError`` on overflow, ``ArgumentError`` when it does not fit. Hashable; equal when
/// it names the same elements of the same allocation.
///
/// Device memory is not host memory: ``np.asarray(t)`` is a ``TypeError`` (as for CuPy arrays).
/// On the cuda platform the tensor offers its memory without a copy through
/// ``__cuda_array_interface__`` (version 3) and DLPack, which CuPy, PyTorch and JAX consume.
/// An export keeps its memory from being freed: while a DLPack capsule (or the array made from
/// it) is alive, or a tensor whose ``__cuda_array_interface__`` was read is alive, freeing the
/// buffer, releasing its resident set and closing the worker raise ``StateError``. Device
/// handles cannot be pickled.
#[pyclass(
    module = "simpler._core",
    name = "DeviceTensor",
    frozen,
    eq,
    hash,
    weakref
)]
pub struct DeviceTensor {
    pub buffer: Py<Buffer>,
    pub buf: BufferRef,
    pub geometry: Geometry,
    /// The export made when `__cuda_array_interface__` was first read; it ends with the tensor.
    pub cai_export: OnceLock<ExportGuard>,
}

impl PartialEq for DeviceTensor {
    fn eq(&self, other: &Self) -> bool {
        self.buf == other.buf && self.geometry == other.geometry
    }
}

impl std::hash::Hash for DeviceTensor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.buf.hash(state);
        self.geometry.shape().hash(state);
        self.geometry.strides().hash(state);
        self.geometry.offset().hash(state);
    }
}

impl DeviceTensor {
    /// A tensor over `buffer`, checked against its allocation.
    pub fn over(
        buffer: &Bound<'_, Buffer>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        strides: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<DeviceTensor> {
        let b = buffer.get();
        let what = format!("tensor over buffer {}", b.buf.ptr);
        let dt = convert::dtype(dtype, &what)?;
        let shape = convert::shape(shape, &what)?;
        let strides = strides.map(|s| convert::strides(s, &what)).transpose()?;
        let offset = match offset {
            Some(o) => convert::element_offset(o, &what)?,
            None => 0,
        };
        let geometry = Geometry::new(&what, dt, &shape, strides.as_deref(), offset).py()?;
        Self::checked(buffer, geometry, &what)
    }

    /// A tensor over `buffer` from the parts of one made (and checked) before.
    pub fn from_parts(buffer: Py<Buffer>, buf: BufferRef, geometry: Geometry) -> DeviceTensor {
        DeviceTensor {
            buffer,
            buf,
            geometry,
            cai_export: OnceLock::new(),
        }
    }

    /// A tensor of `geometry` over `buffer`, checked against its allocation.
    pub fn checked(
        buffer: &Bound<'_, Buffer>,
        geometry: Geometry,
        what: &str,
    ) -> PyResult<DeviceTensor> {
        let b = buffer.get();
        let buf = b.buf;
        let r = b
            .cell
            .with(false, |w| w.check_tensor(buf, &geometry, &what));
        done(buffer.py(), r)?;
        Ok(DeviceTensor {
            buffer: buffer.clone().unbind(),
            buf,
            geometry,
            cai_export: OnceLock::new(),
        })
    }

    /// The device id, on the cuda platform; `AttributeError` elsewhere (so `hasattr` answers
    /// whether the tensor is CUDA memory).
    fn cuda_device(&self, py: Python<'_>) -> PyResult<u32> {
        let cell = &self.buffer.bind(py).get().cell;
        if cell.platform != "cuda" {
            return Err(PyAttributeError::new_err(format!(
                "__cuda_array_interface__ / DLPack: the tensor is on {}, not cuda",
                cell.platform
            )));
        }
        Ok(cell.device_id)
    }

    /// A new export of the tensor's allocation (refused for a freed buffer or a closed worker).
    fn export(&self, py: Python<'_>) -> PyResult<ExportGuard> {
        let cell = &self.buffer.bind(py).get().cell;
        let buf = self.buf;
        // Heavy: it first waits for a run left pending.
        done(py, cell.with(true, |w| w.export(buf)))
    }

    /// The device address of the first element; 0 for a tensor without elements (as the CUDA
    /// Array Interface and DLPack ask).
    fn data_ptr(&self) -> u64 {
        if self.geometry.numel() == 0 {
            return 0;
        }
        self.buf.ptr.0 + self.geometry.offset() * self.geometry.dtype().size()
    }

    fn np_dtype_of<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(arrays::np_dtype(py, self.geometry.dtype())?.into_any())
    }
}

#[pymethods]
impl DeviceTensor {
    #[new]
    #[pyo3(signature = (buffer, shape, dtype, strides=None, offset=None))]
    fn new(
        buffer: &Bound<'_, PyAny>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        strides: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let buffer = buffer.cast::<Buffer>().map_err(|_| {
            type_err(format!(
                "DeviceTensor: expected a Buffer, not {}",
                type_name(buffer)
            ))
        })?;
        Self::over(buffer, shape, dtype, strides, offset)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.buffer)
    }

    /// The ``Buffer`` the tensor lives in.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> Py<Buffer> {
        self.buffer.clone_ref(py)
    }

    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.geometry.shape())
    }

    /// The dtype's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.geometry.dtype().name()
    }

    /// Element strides.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.geometry.strides())
    }

    /// Start offset in elements.
    #[getter]
    fn offset(&self) -> u64 {
        self.geometry.offset()
    }

    /// Bytes of its elements.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.geometry.nbytes()
    }

    /// Whether its elements are laid out C-contiguously (dimensions of one element aside).
    #[getter]
    fn contiguous(&self) -> bool {
        self.geometry.is_contiguous()
    }

    /// The numpy dtype.
    #[getter]
    fn np_dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.np_dtype_of(py)
    }

    /// Always a ``TypeError``: numpy cannot read device memory.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__(
        &self,
        dtype: Option<&Bound<'_, PyAny>>,
        copy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _ = (dtype, copy);
        Err(PyTypeError::new_err(
            "a DeviceTensor lives in device memory, which numpy cannot read: copy it to the host \
             (worker.copy_from(np.empty(t.shape, t.np_dtype), t), for a contiguous tensor) or \
             read it in a run (orch.read_tensor)",
        ))
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a DeviceTensor names device memory of one worker and cannot be pickled",
        ))
    }

    /// The CUDA Array Interface (version 3) of the tensor, on the cuda platform only
    /// (``AttributeError`` elsewhere, so ``hasattr`` answers whether it is CUDA memory).
    ///
    /// ``stream`` is the worker's stream, on which the memory is ready. Reading the interface
    /// exports the memory for the life of this tensor object (see the class docs). bfloat16 and
    /// the float8 kinds have no typestr a consumer reads correctly: ``TypeError``, use DLPack.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.cuda_device(py)?;
        let dt = self.np_dtype_of(py)?;
        let stream = self.buffer.bind(py).get().cell.dev.stream_handle();
        let d = exporting::cai_dict(py, &self.geometry, &dt, self.data_ptr(), false, stream)?;
        if self.cai_export.get().is_none() {
            let g = self.export(py)?;
            let _ = self.cai_export.set(g);
        }
        Ok(d)
    }

    /// ``(kDLCUDA, device id)``; ``BufferError`` off the cuda platform.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, u32)> {
        let dev = self
            .cuda_device(py)
            .map_err(|e| PyBufferError::new_err(e.value(py).to_string()))?;
        Ok((KDL_CUDA, dev))
    }

    /// A DLPack capsule of the tensor's device memory (no copy; cuda platform only).
    ///
    /// ``stream`` is the consumer's stream (``None``: the legacy default stream, 1; 2: the
    /// per-thread default; -1: no ordering; 0 is refused as ambiguous): it is made to wait for
    /// the worker's stream (an event), without blocking the host. ``copy=True`` and a
    /// ``dl_device`` other than the tensor's are ``BufferError``s; ``max_version`` must be a
    /// ``(major, minor)`` pair. The capsule is the unversioned ``dltensor`` kind, which every
    /// consumer accepts; the export lasts until its deleter runs (see the class docs).
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
        let t = slf.get();
        let device = t.__dlpack_device__(py)?;
        let consumer = exporting::dlpack_request("tensor", device, stream, dl_device, copy)?;
        let guard = t.export(py)?;
        exporting::order_after(py, &*t.buffer.bind(py).get().cell.dev, consumer)?;
        capi::dlpack_capsule(slf.as_any(), t.data_ptr(), device, &t.geometry, Some(guard))
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceTensor(buffer {}, shape={:?}, dtype={}, strides={:?}, offset={})",
            self.buf.ptr,
            self.geometry.shape(),
            self.geometry.dtype().name(),
            self.geometry.strides(),
            self.geometry.offset()
        )
    }
}

/// Bytes of host memory (device memory on sim, a mirror, or a copy) exposed to numpy through
/// ``__array_interface__``; the window keeps the memory alive for as long as any array uses it.
#[pyclass(module = "simpler._core", name = "HostWindow", frozen)]
pub struct PyHostWindow {
    pub win: HostWindow,
    pub readonly: bool,
}

#[pymethods]
impl PyHostWindow {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let addr = self
            .win
            .mem
            .owned_addr()
            .ok_or_else(|| state_err("host window over revocable memory"))?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.win.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (addr + self.win.offset, self.readonly))?;
        Ok(d)
    }

    /// (dtype name, shape, byte strides) of the tensor laid over the bytes.
    #[getter]
    fn layout(&self) -> (&'static str, Vec<u64>, Vec<u64>) {
        let g = &self.win.geometry;
        let es = g.dtype().size();
        (
            g.dtype().name(),
            g.shape().to_vec(),
            g.strides().iter().map(|s| s * es).collect(),
        )
    }

    /// True when no copy was made to produce these bytes.
    #[getter]
    fn zero_copy(&self) -> bool {
        self.win.zero_copy
    }
}

/// A numpy array over a host window (no copy).
pub fn window_array<'py>(
    py: Python<'py>,
    win: HostWindow,
    readonly: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let dtype = arrays::np_dtype(py, win.geometry.dtype())?;
    let w = Bound::new(py, PyHostWindow { win, readonly })?;
    capi::array_over_window(w.as_any(), &w.get().win, !readonly, dtype)
}
