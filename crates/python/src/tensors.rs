//! The native classes users hold between runs: kernels, callables, device tensors, and the host
//! windows that numpy arrays are made over.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use simpler_runtime::{BufferRef, Geometry, HostWindow, Signature};

use crate::convert::{self, arrays_fn};
use crate::errors::{type_err, PyResultExt, StateError};
use crate::worker::PyWorker;

/// The `ArgDirection` member of a direction.
pub fn direction_py(py: Python<'_>, d: simpler_runtime::Direction) -> PyResult<Bound<'_, PyAny>> {
    static ENUM: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let e = ENUM.get_or_try_init(py, || {
        py.import("simpler.worker")?
            .getattr("ArgDirection")
            .map(|c| c.unbind())
    })?;
    e.bind(py).getattr(d.name())
}

fn signature_py<'py>(py: Python<'py>, sig: &Signature) -> PyResult<Bound<'py, PyTuple>> {
    let entries = sig
        .params()
        .iter()
        .map(|p| {
            let d = direction_py(py, p.dir)?;
            let dt = p.dtype.map(|t| t.name());
            Ok((d, dt).into_pyobject(py)?.into_any())
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, entries)
}

/// What a `Kernel` and a `Callable` are made of: the function (callable, else an error naming
/// `class` and `arg`), the name (`name`, else the function's `__name__`, else `noun`) and the
/// signature (errors name `noun` and the name).
fn function_parts(
    class: &str,
    arg: &str,
    noun: &str,
    func: &Bound<'_, PyAny>,
    signature: &Bound<'_, PyAny>,
    name: Option<String>,
) -> PyResult<(Py<PyAny>, String, Signature)> {
    if !func.is_callable() {
        return Err(type_err(format!(
            "{class}: {arg} must be callable, not {}",
            func.get_type().name()?
        )));
    }
    let name = name.unwrap_or_else(|| {
        func.getattr("__name__")
            .and_then(|n| n.extract())
            .unwrap_or_else(|_| noun.to_owned())
    });
    let sig = convert::signature(signature, &format!("{noun} {name}"))?;
    Ok((func.clone().unbind(), name, sig))
}

/// `Class(name, ['IN', ...])`.
fn function_repr(class: &str, name: &str, sig: &Signature) -> String {
    let dirs: Vec<&str> = sig.params().iter().map(|p| p.dir.name()).collect();
    format!("{class}({name}, {dirs:?})")
}

/// A task body: ``fn(*arrays, *scalars)`` runs once per submitted task.
///
/// ``fn`` receives one numpy array per tensor (in ``signature`` order), then the scalars. On
/// ``sim`` the arrays view device memory directly; on other platforms they are host copies
/// (inputs copied in before, outputs copied out after), a correctness path.
/// ``signature`` lists the direction of each tensor, optionally with a dtype:
/// ``[IN, (OUT, "float32")]``. ``name`` defaults to ``fn.__name__``.
#[pyclass(module = "simpler._core", name = "Kernel", frozen, subclass)]
pub struct Kernel {
    pub func: Py<PyAny>,
    pub name: String,
    pub sig: Signature,
}

#[pymethods]
impl Kernel {
    #[new]
    #[pyo3(signature = (fn_, signature, name=None))]
    fn new(
        fn_: &Bound<'_, PyAny>,
        signature: &Bound<'_, PyAny>,
        name: Option<String>,
    ) -> PyResult<Self> {
        let (func, name, sig) = function_parts("Kernel", "fn", "kernel", fn_, signature, name)?;
        Ok(Kernel { func, name, sig })
    }

    /// The task body.
    #[getter(r#fn)]
    fn func(&self, py: Python<'_>) -> Py<PyAny> {
        self.func.clone_ref(py)
    }

    /// The kernel's name (used in messages).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// ``(ArgDirection, dtype or None)`` per tensor.
    #[getter]
    fn signature<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        signature_py(py, &self.sig)
    }

    fn __repr__(&self) -> String {
        function_repr("Kernel", &self.name, &self.sig)
    }
}

/// A device program: an orchestration function over tensor arguments.
///
/// ``orchestration(orch, *tensors, *scalars)`` reads and writes tensor data through ``orch``
/// and submits kernels. ``signature`` lists the direction of each tensor argument (scalars are
/// not listed), optionally with a dtype: ``[IN, IN, (OUT, "float32")]``. ``name`` defaults to
/// the function's name.
#[pyclass(module = "simpler._core", name = "Callable", frozen, subclass)]
pub struct Callable {
    pub func: Py<PyAny>,
    pub name: String,
    pub sig: Signature,
}

#[pymethods]
impl Callable {
    #[new]
    #[pyo3(signature = (orchestration, signature, name=None))]
    fn new(
        orchestration: &Bound<'_, PyAny>,
        signature: &Bound<'_, PyAny>,
        name: Option<String>,
    ) -> PyResult<Self> {
        let (func, name, sig) = function_parts(
            "Callable",
            "orchestration",
            "callable",
            orchestration,
            signature,
            name,
        )?;
        Ok(Callable { func, name, sig })
    }

    /// The orchestration function.
    #[getter]
    fn orchestration(&self, py: Python<'_>) -> Py<PyAny> {
        self.func.clone_ref(py)
    }

    /// The callable's name (used in messages and reports).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// ``(ArgDirection, dtype or None)`` per tensor argument.
    #[getter]
    fn signature<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        signature_py(py, &self.sig)
    }

    /// Checks that ``n`` tensor arguments fit the signature (``who`` names the caller in the
    /// error); raises ``ArgumentError`` otherwise. The rule a run applies, for callers that
    /// prepare arguments before running (resident setup).
    fn check_tensor_count(&self, n: usize, who: &str) -> PyResult<()> {
        self.sig.check_count(&who, n).py()
    }

    fn __repr__(&self) -> String {
        function_repr("Callable", &self.name, &self.sig)
    }
}

/// A tensor over a device buffer; passed to ``Worker.run`` it is resident (nothing is staged).
///
/// ``DeviceTensor(buffer, shape, dtype, strides=None, offset=0)`` (``strides`` and ``offset``
/// in elements; usually made by ``Buffer.tensor``) is checked against the buffer when made:
/// ``GeometryError`` on overflow, ``ArgumentError`` when it does not fit. Hashable; equal when
/// it names the same elements of the same allocation.
#[pyclass(
    module = "simpler._core",
    name = "DeviceTensor",
    frozen,
    subclass,
    eq,
    hash
)]
pub struct DeviceTensor {
    pub buffer: Py<PyAny>,
    pub buf: BufferRef,
    pub geometry: Geometry,
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

/// The `(worker, handle)` of a Python `Buffer`.
pub fn buffer_ref<'py>(buffer: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyWorker>, BufferRef)> {
    let worker = buffer
        .getattr("_worker")
        .and_then(|w| w.getattr("_native"))
        .map_err(|_| {
            type_err(format!(
                "expected a Buffer, not {}",
                crate::errors::type_name(buffer)
            ))
        })?;
    let worker = worker.cast_into::<PyWorker>().map_err(|e| {
        type_err(format!(
            "expected a Buffer of a simpler Worker, not {} (its _worker._native is {})",
            crate::errors::type_name(buffer),
            crate::errors::type_name(&e.into_inner())
        ))
    })?;
    let ptr: u64 = buffer.getattr("ptr")?.extract()?;
    let gen: u64 = buffer.getattr("_gen")?.extract()?;
    let id = worker.get().id;
    Ok((
        worker,
        BufferRef {
            worker: id,
            ptr: simpler_driver::DevPtr(ptr),
            gen,
        },
    ))
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
        let (worker, buf) = buffer_ref(buffer)?;
        let what = format!("tensor over buffer {}", buf.ptr);
        let dt = convert::dtype(dtype, &what)?;
        let shape = convert::shape(shape, &what)?;
        let strides = strides.map(|s| convert::strides(s, &what)).transpose()?;
        let offset = match offset {
            Some(o) => convert::element_offset(o, &what)?,
            None => 0,
        };
        let geometry = Geometry::new(&what, dt, &shape, strides.as_deref(), offset).py()?;
        worker.get().check_tensor(buf, &geometry, &what)?;
        Ok(DeviceTensor {
            buffer: buffer.clone().unbind(),
            buf,
            geometry,
        })
    }

    /// The ``Buffer`` the tensor lives in.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> Py<PyAny> {
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
        static NP_DTYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        arrays_fn(py, &NP_DTYPE, "np_dtype")?.call1((self.geometry.dtype().name(),))
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
            .ok_or_else(|| StateError::new_err("host window over revocable memory"))?;
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
    static WINDOW_ARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let w = Bound::new(py, PyHostWindow { win, readonly })?;
    arrays_fn(py, &WINDOW_ARRAY, "window_array")?.call1((w,))
}
