//! The native worker object: buffers, resident sets, counters, close, and the run entry point.

use std::sync::Arc;
use std::time::Instant;

use numpy::{
    PyArrayMethods, PyReadonlyArray1, PyReadwriteArray1, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use simpler_driver::{open_device, DevPtr, Device, DeviceSpec, Op, OpenError};
use simpler_runtime::{BufferRef, Error, Geometry, RunReport, Worker, WorkerCell};

use crate::cell::Shared;
use crate::convert::{self, u64_arg, Dir, StagingMode, Svm, ViewPolicyArg};
use crate::errors::{to_py, value_err, PlatformUnavailableError, PyResultExt};
use crate::logging;
use crate::runhost;
use crate::tensors::{direction_py, Callable};

/// A buffer as Python sees it: `(ptr, gen)`.
type BufferHandle = (u64, u64);

/// Flushes queued log records, then converts a runtime result.
pub fn done<T>(py: Python<'_>, r: Result<T, Error>) -> PyResult<T> {
    logging::flush(py);
    r.py()
}

/// The native worker. Use ``simpler.Worker``.
#[pyclass(module = "simpler._core", name = "Worker", subclass, frozen)]
pub struct PyWorker {
    pub cell: Arc<Shared>,
    pub id: u64,
    dev: Arc<dyn Device>,
    platform: String,
}

impl PyWorker {
    fn buf(&self, ptr: u64, gen: u64) -> BufferRef {
        BufferRef {
            worker: self.id,
            ptr: DevPtr(ptr),
            gen,
        }
    }

    /// Checks that `geometry` fits the buffer (for `DeviceTensor`).
    pub fn check_tensor(&self, buf: BufferRef, geometry: &Geometry, what: &str) -> PyResult<()> {
        let r = self
            .cell
            .with(false, |w| w.check_tensor(buf, geometry, &what));
        Python::attach(|py| done(py, r))
    }
}

/// A dict of `(name, value)` pairs whose names are made into Python strings once.
fn dict_of<'py>(
    py: Python<'py>,
    keys: &'static PyOnceLock<Vec<Py<PyString>>>,
    entries: &[(&'static str, u64)],
) -> PyResult<Bound<'py, PyDict>> {
    let names = keys.get_or_init(py, || {
        entries
            .iter()
            .map(|(k, _)| PyString::intern(py, k).unbind())
            .collect()
    });
    let d = PyDict::new(py);
    for (k, (_, v)) in names.iter().zip(entries) {
        d.set_item(k.bind(py), v)?;
    }
    Ok(d)
}

fn report_py<'py>(py: Python<'py>, r: &RunReport) -> PyResult<Bound<'py, PyTuple>> {
    static PHASES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();
    static COUNTERS: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();
    let phases = dict_of(py, &PHASES, &r.phases.entries())?;
    let counters = dict_of(py, &COUNTERS, &r.counters.entries())?;
    let modeled = r
        .modeled
        .map(|m| dict_of(py, &PHASES, &m.entries()))
        .transpose()?;
    (phases, counters, r.ok, modeled).into_pyobject(py)
}

#[pymethods]
impl PyWorker {
    #[new]
    #[allow(clippy::too_many_arguments)] // the keyword options of `simpler.Worker`
    #[pyo3(signature = (platform, staging=None, svm=None, poison=None, capacity=None, device_id=None, malloc_policy=None, reuse_addresses=None, model=None, view_policy=None))]
    fn new(
        py: Python<'_>,
        platform: &str,
        staging: Option<StagingMode>,
        svm: Option<Svm>,
        poison: Option<bool>,
        capacity: Option<&Bound<'_, PyAny>>,
        device_id: Option<&Bound<'_, PyAny>>,
        malloc_policy: Option<String>,
        reuse_addresses: Option<bool>,
        model: Option<String>,
        view_policy: Option<ViewPolicyArg>,
    ) -> PyResult<Self> {
        let capacity = capacity
            .map(|c| u64_arg(c, "Worker", "capacity"))
            .transpose()?;
        let device_id = device_id
            .map(|d| {
                u64_arg(d, "Worker", "device_id").and_then(|v| {
                    u32::try_from(v)
                        .map_err(|_| value_err(format!("Worker: device_id {v} is out of range")))
                })
            })
            .transpose()?;
        let spec = DeviceSpec {
            platform: platform.to_owned(),
            svm: svm.map(|s| s.0),
            poison,
            capacity,
            device_id,
            malloc_policy,
            reuse_addresses,
            model,
        };
        let dev = py.detach(|| open_device(&spec));
        logging::flush(py);
        let dev = dev.map_err(|e| match e {
            OpenError::Invalid(m) => value_err(m),
            other => PlatformUnavailableError::new_err(other.to_string()),
        })?;
        let staging = staging.map_or(simpler_runtime::Staging::Arena, |s| s.0);
        let mut worker = Worker::new(dev.clone(), staging, poison.unwrap_or(true));
        if let Some(p) = view_policy {
            worker.set_view_policy(p.0);
        }
        Ok(PyWorker {
            id: worker.id(),
            cell: Arc::new(Shared::new(worker)),
            dev,
            platform: platform.to_owned(),
        })
    }

    /// ``"sim"``, ``"ascend"`` or ``"cuda"``.
    #[getter]
    fn platform(&self) -> &str {
        &self.platform
    }

    /// ``"arena"`` or ``"fresh"``.
    #[getter]
    fn staging(&self) -> &'static str {
        self.cell.with(false, |w| w.staging().name())
    }

    /// Whether ``close`` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.cell.with(false, |w| w.is_closed())
    }

    fn _malloc(&self, py: Python<'_>, nbytes: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
        let n = u64_arg(nbytes, "malloc", "size")?;
        let r = self.cell.with(true, |w| w.malloc(n));
        done(py, r).map(|b| (b.ptr.0, b.gen))
    }

    fn _free(&self, py: Python<'_>, ptr: u64, gen: u64) -> PyResult<()> {
        let b = self.buf(ptr, gen);
        let r = self.cell.with(true, |w| w.free(b));
        done(py, r)
    }

    fn _copy_to(
        &self,
        py: Python<'_>,
        ptr: u64,
        gen: u64,
        offset: &Bound<'_, PyAny>,
        src: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<()> {
        let off = u64_arg(offset, "copy_to", "byte offset")?;
        let s = src.as_slice()?;
        let b = self.buf(ptr, gen);
        let r = self.cell.with(true, |w| w.copy_to(b, off, s));
        done(py, r)
    }

    fn _copy_from(
        &self,
        py: Python<'_>,
        ptr: u64,
        gen: u64,
        offset: &Bound<'_, PyAny>,
        mut dst: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        let off = u64_arg(offset, "copy_from", "byte offset")?;
        let d = dst.as_slice_mut()?;
        let b = self.buf(ptr, gen);
        let r = self.cell.with(true, |w| w.copy_from(b, off, d));
        done(py, r)
    }

    /// Cumulative driver counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.dev.stats());
        let d = PyDict::new(py);
        for (k, v) in s.entries() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn _view_counts(&self) -> (u64, u64, u64) {
        self.cell.with(false, |w| w.view_counts())
    }

    fn _arena(&self) -> Option<(u64, u64)> {
        self.cell.with(false, |w| w.arena().map(|(p, c)| (p.0, c)))
    }

    /// Makes the ``nth`` next call of ``op`` fail with ``code`` (sim and the fake vendor libraries).
    #[pyo3(signature = (op, nth=None, code=None))]
    fn inject_fault(
        &self,
        op: &str,
        nth: Option<&Bound<'_, PyAny>>,
        code: Option<i64>,
    ) -> PyResult<()> {
        let o = Op::parse(op).ok_or_else(|| {
            value_err(format!(
                "unknown driver operation '{op}' (alloc, free, h2d, d2h, map, unmap)"
            ))
        })?;
        let nth = match nth {
            Some(n) => u64_arg(n, "inject_fault", "nth")?,
            None => 1,
        };
        self.dev
            .inject_fault(o, nth, code)
            .map_err(|e| value_err(e.to_string()))
    }

    /// Drops pending injected faults.
    fn clear_faults(&self) {
        self.dev.clear_faults();
    }

    /// Recent driver calls as ``(op, device address, bytes, code, phase)``, oldest first.
    fn call_log(&self, py: Python<'_>) -> Vec<(&'static str, u64, u64, i64, &'static str)> {
        py.detach(|| self.dev.call_log())
            .iter()
            .map(|c| (c.op.name(), c.addr, c.bytes, c.code, c.phase))
            .collect()
    }

    fn _host_view_info(
        &self,
        py: Python<'_>,
        ptr: u64,
        gen: u64,
    ) -> PyResult<Option<&'static str>> {
        let b = self.buf(ptr, gen);
        let r = self.cell.with(false, |w| w.host_view_info(b));
        done(py, r)
    }

    fn _trim_staging(&self, py: Python<'_>) -> PyResult<()> {
        let r = self.cell.with(true, |w| w.trim_staging());
        done(py, r)
    }

    fn _close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.cell.with(true, |w| w.close());
        logging::flush(py);
        let d = PyDict::new(py);
        d.set_item("user_buffers", s.user_buffers)?;
        d.set_item("resident_sets", s.resident_sets)?;
        d.set_item("leaked_allocations", s.device.leaked_allocations)?;
        d.set_item("leaked_mappings", s.device.leaked_mappings)?;
        let errs: Vec<String> = s
            .errors
            .iter()
            .map(|e| e.to_string())
            .chain(s.device.errors.iter().map(|e| e.to_string()))
            .collect();
        d.set_item("errors", errs)?;
        Ok(d)
    }

    // -- resident sets --

    fn _resident_open(&self, py: Python<'_>) -> PyResult<u64> {
        let r = self.cell.with(false, |w| w.resident_open());
        done(py, r)
    }

    /// Makes ``host`` resident; returns the ``ArgDirection`` member of ``direction`` and
    /// ``(ptr, gen)``, or ``None`` when it has no bytes (it stays host-staged).
    fn _resident_add<'py>(
        &self,
        py: Python<'py>,
        set: u64,
        name: &str,
        host: &Bound<'py, PyAny>,
        direction: Dir,
    ) -> PyResult<(Bound<'py, PyAny>, Option<BufferHandle>)> {
        let what = format!("resident tensor '{name}'");
        let arr = host.cast::<PyUntypedArray>().map_err(|_| {
            crate::errors::type_err(format!(
                "{what}: expected a numpy array, got {}",
                crate::errors::type_name(host)
            ))
        })?;
        let geometry = convert::array_geometry(arr, &what)?.ok_or_else(|| {
            value_err(format!(
                "{what}: array must be C-contiguous in native byte order (shape {:?}, strides {:?}); \
                 use np.ascontiguousarray",
                arr.shape(),
                arr.strides()
            ))
        })?;
        // The bytes, when the layout is one the runtime takes (it checks contiguity itself).
        let flat = runhost::flat_bytes(py, host, geometry.extent())?;
        let ro = flat.try_readonly()?;
        let bytes: &[u8] = if geometry.is_contiguous() {
            ro.as_slice()?
        } else {
            &[]
        };
        let r = self.cell.with(true, |w| {
            w.resident_add(set, name, &geometry, direction.0, bytes)
        });
        let added = done(py, r)?.map(|b| (b.ptr.0, b.gen));
        Ok((direction_py(py, direction.0)?, added))
    }

    /// The host-view policy of allocations without a hint.
    #[getter]
    fn view_policy(&self) -> &'static str {
        self.cell.with(false, |w| w.view_policy().name())
    }

    /// The cost model the device prices its operations with (sim), or ``None``.
    #[getter]
    fn model(&self) -> Option<&'static str> {
        self.dev.cost_model().map(|m| m.name)
    }

    fn _hint_view(
        &self,
        py: Python<'_>,
        ptr: u64,
        gen: u64,
        policy: ViewPolicyArg,
    ) -> PyResult<()> {
        let b = self.buf(ptr, gen);
        let r = self.cell.with(true, |w| w.hint_view(b, policy.0));
        done(py, r)
    }

    /// Establishes the host view of a buffer now; returns its kind (``"mapping"``,
    /// ``"mirror"`` or ``"cached"``).
    fn _establish_view(
        &self,
        py: Python<'_>,
        ptr: u64,
        gen: u64,
        name: &str,
    ) -> PyResult<&'static str> {
        let b = self.buf(ptr, gen);
        let r = self.cell.with(true, |w| w.establish_view(b, name));
        done(py, r)
    }

    fn _resident_release<'py>(&self, py: Python<'py>, set: u64) -> Vec<PyErr> {
        let errors = self.cell.with(true, |w| w.resident_release(set));
        logging::flush(py);
        errors.into_iter().map(|e| to_py(py, e)).collect()
    }

    fn _resident_is_open(&self, set: u64) -> bool {
        self.cell.with(false, |w| w.resident_is_open(set))
    }

    /// Runs ``callable`` once over ``args`` (values in signature order, or built args carrying
    /// names); returns ``(phases, counters, ok, modeled)`` (``modeled``: ``None`` without a cost model).
    fn run<'py>(
        &self,
        py: Python<'py>,
        callable: &Bound<'py, Callable>,
        args: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let started = Instant::now();
        let named = named_values(args)?;
        let report = runhost::run(py, &self.cell, callable, named, started);
        logging::flush(py);
        report_py(py, &report?)
    }
}

/// `(name, value)` pairs of run arguments: built args carry names; a plain sequence gets
/// positions.
fn named_values<'py>(args: &Bound<'py, PyAny>) -> PyResult<Vec<(Arc<str>, Bound<'py, PyAny>)>> {
    // A plain list or tuple (the common case) is not asked for names: no failed lookup per run.
    let plain = args.is_exact_instance_of::<PyList>() || args.is_exact_instance_of::<PyTuple>();
    if !plain {
        if let Ok(f) = args.getattr(pyo3::intern!(args.py(), "_named_values")) {
            let pairs = f.call0()?;
            return pairs
                .try_iter()?
                .map(|p| {
                    let (name, v) = p?.extract::<(Bound<'py, PyString>, Bound<'py, PyAny>)>()?;
                    Ok((Arc::from(&*name.to_cow()?), v))
                })
                .collect();
        }
        if args.cast::<PyList>().is_err() && args.cast::<PyTuple>().is_err() {
            return Err(crate::errors::type_err(
                "run: args must be a sequence (tensors, then scalars) or built args",
            ));
        }
    }
    args.try_iter()?
        .enumerate()
        .map(|(i, v)| Ok((Arc::from(format!("arg{i}")), v?)))
        .collect()
}
