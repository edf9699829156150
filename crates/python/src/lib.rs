//! `simpler._core`: pyo3 classes over the runtime. Glue only — argument conversion, the
//! exception mapping, and releasing the GIL around device work. All behaviour lives in
//! `simpler-runtime` and `simpler-driver`.

use std::sync::{Arc, Mutex, MutexGuard};

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use simpler_driver::{open_device, DevPtr, DeviceSpec, Op, OpenError};
use simpler_runtime::{
    BindArg, DType, Direction, Error, Geometry, HostWindow, RunReport, Staging, Value, Worker,
};

// ---- errors -----------------------------------------------------------------------------

fn raise(py: Python<'_>, class: &str, msg: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("simpler.errors")?.getattr(class)?;
        let exc = cls.call1((msg.clone(),))?;
        for (k, v) in attrs {
            exc.setattr(*k, v)?;
        }
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| e)
}

fn to_py(e: Error) -> PyErr {
    Python::attach(|py| {
        let msg = e.to_string();
        match e {
            Error::Device {
                phase,
                tensor,
                source,
            } => {
                let attrs = [
                    (
                        "op",
                        source
                            .op
                            .name()
                            .into_pyobject(py)
                            .unwrap()
                            .into_any()
                            .unbind(),
                    ),
                    (
                        "code",
                        source.code.into_pyobject(py).unwrap().into_any().unbind(),
                    ),
                    (
                        "code_name",
                        source
                            .code_name
                            .into_pyobject(py)
                            .unwrap()
                            .into_any()
                            .unbind(),
                    ),
                    (
                        "call",
                        source.call.into_pyobject(py).unwrap().into_any().unbind(),
                    ),
                    (
                        "phase",
                        phase.name().into_pyobject(py).unwrap().into_any().unbind(),
                    ),
                    (
                        "tensor",
                        tensor.into_pyobject(py).unwrap().into_any().unbind(),
                    ),
                    (
                        "addr",
                        source.addr.into_pyobject(py).unwrap().into_any().unbind(),
                    ),
                    (
                        "nbytes",
                        source.bytes.into_pyobject(py).unwrap().into_any().unbind(),
                    ),
                ];
                raise(py, "DeviceError", msg, &attrs)
            }
            Error::Geometry { .. } => raise(py, "GeometryError", msg, &[]),
            Error::NoHostView { addr, .. } => raise(
                py,
                "NoHostViewError",
                msg,
                &[("addr", addr.into_pyobject(py).unwrap().into_any().unbind())],
            ),
            Error::Value(_) => raise(py, "ArgumentError", msg, &[]),
            Error::Type(_) => raise(py, "ArgumentTypeError", msg, &[]),
            Error::State(_) => raise(py, "StateError", msg, &[]),
            Error::Hazard(_) => raise(py, "HazardError", msg, &[]),
            _ => raise(py, "SimplerError", msg, &[]),
        }
    })
}

trait IntoPy<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

fn value_err(msg: String) -> PyErr {
    to_py(Error::Value(msg))
}

// ---- conversions --------------------------------------------------------------------------

fn direction(d: &str) -> PyResult<Direction> {
    match d {
        "IN" => Ok(Direction::In),
        "OUT" => Ok(Direction::Out),
        "INOUT" => Ok(Direction::InOut),
        _ => Err(value_err(format!(
            "direction must be IN, OUT or INOUT, not {d}"
        ))),
    }
}

fn geometry(
    what: &str,
    dtype: &str,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    offset: i64,
) -> PyResult<Geometry> {
    let nonneg = |v: &[i64], field: &str| -> PyResult<Vec<u64>> {
        v.iter()
            .map(|&x| {
                u64::try_from(x).map_err(|_| {
                    to_py(Error::geometry(
                        what,
                        format!("negative {field} entry {x} in {v:?}"),
                    ))
                })
            })
            .collect()
    };
    let shape = nonneg(&shape, "shape")?;
    let strides = strides.map(|s| nonneg(&s, "stride")).transpose()?;
    let offset = u64::try_from(offset)
        .map_err(|_| to_py(Error::geometry(what, format!("negative offset {offset}"))))?;
    Geometry::new(what, DType::parse(dtype).py()?, shape, strides, offset).py()
}

/// The index of an element access of tensor `name`: an int, or a tuple/list of ints.
fn index(idx: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    let one = |o: &Bound<'_, PyAny>| -> PyResult<i64> {
        let not_int = || {
            to_py(Error::Type(format!(
                "tensor {name}: index entries must be integers, not {o}"
            )))
        };
        if o.is_instance_of::<pyo3::types::PyBool>() || o.is_instance_of::<pyo3::types::PyFloat>() {
            return Err(not_int());
        }
        let i = o.call_method0("__index__").map_err(|_| not_int())?;
        i.extract::<i64>().map_err(|_| {
            to_py(Error::Value(format!(
                "tensor {name}: index entry {o} out of bounds (it does not fit 64 bits)"
            )))
        })
    };
    if let Ok(t) = idx.cast::<PyTuple>() {
        return t.iter().map(|o| one(&o)).collect();
    }
    if let Ok(l) = idx.cast::<PyList>() {
        return l.iter().map(|o| one(&o)).collect();
    }
    Ok(vec![one(idx)?])
}

/// A value written into tensor `name`.
fn value(v: &Bound<'_, PyAny>, name: &str) -> PyResult<Value> {
    if let Ok(b) = v.extract::<bool>() {
        if v.is_instance_of::<pyo3::types::PyBool>() || v.get_type().name()?.to_str()? == "bool" {
            return Ok(Value::Bool(b));
        }
    }
    if v.is_instance_of::<pyo3::types::PyFloat>() {
        return Ok(Value::Float(v.extract()?));
    }
    if let Ok(i) = v.call_method0("__index__") {
        if let Ok(x) = i.extract::<i64>() {
            return Ok(Value::Int(x));
        }
        if let Ok(x) = i.extract::<u64>() {
            return Ok(Value::UInt(x));
        }
        return Err(to_py(Error::Value(format!(
            "tensor {name}: value {v} out of range: it does not fit 64 bits"
        ))));
    }
    if let Ok(f) = v.call_method0("__float__") {
        return Ok(Value::Float(f.extract()?));
    }
    Err(to_py(Error::Type(format!(
        "tensor {name}: values must be int, float or bool, not {}",
        v.get_type().name()?
    ))))
}

fn value_py(py: Python<'_>, v: Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        Value::UInt(u) => u.into_pyobject(py)?.into_any().unbind(),
        Value::Float(f) => f.into_pyobject(py)?.into_any().unbind(),
        Value::Bool(b) => pyo3::types::PyBool::new(py, b)
            .to_owned()
            .into_any()
            .unbind(),
    })
}

fn report_py(py: Python<'_>, r: &RunReport) -> PyResult<Py<PyAny>> {
    let phases = PyDict::new(py);
    for (k, v) in r.phases.entries() {
        phases.set_item(k, v)?;
    }
    let counters = PyDict::new(py);
    for (k, v) in r.counters.entries() {
        counters.set_item(k, v)?;
    }
    Ok((phases, counters, r.ok)
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

// ---- host windows ---------------------------------------------------------------------------

/// Bytes of host memory (device memory on sim, a mirror, or a copy) exposed to numpy through
/// `__array_interface__`; the window keeps the memory alive for as long as any array uses it.
#[pyclass(module = "simpler._core", name = "HostWindow", frozen)]
struct PyHostWindow {
    win: HostWindow,
    readonly: bool,
}

#[pymethods]
impl PyHostWindow {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let addr = self
            .win
            .mem
            .owned_addr()
            .ok_or_else(|| to_py(Error::State("host window over revocable memory".into())))?;
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

// ---- worker ---------------------------------------------------------------------------------

type Shared = Arc<Mutex<Worker>>;

fn lock(w: &Shared) -> MutexGuard<'_, Worker> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// The native worker. Use `simpler.Worker`.
#[pyclass(module = "simpler._core", name = "Worker", subclass)]
struct PyWorker {
    inner: Shared,
    platform: String,
}

#[pymethods]
impl PyWorker {
    #[new]
    #[pyo3(signature = (platform, staging="arena", svm=None, poison=None, capacity=None, device_id=None, malloc_policy=None))]
    fn new(
        platform: &str,
        staging: &str,
        svm: Option<String>,
        poison: Option<bool>,
        capacity: Option<u64>,
        device_id: Option<u32>,
        malloc_policy: Option<String>,
    ) -> PyResult<Self> {
        let staging = Staging::parse(staging).py()?;
        let spec = DeviceSpec {
            platform: platform.to_owned(),
            svm,
            poison,
            capacity,
            device_id,
            malloc_policy,
        };
        let dev = open_device(&spec).map_err(|e| match e {
            OpenError::Invalid(m) => value_err(m),
            other => {
                Python::attach(|py| raise(py, "PlatformUnavailableError", other.to_string(), &[]))
            }
        })?;
        Ok(PyWorker {
            inner: Arc::new(Mutex::new(Worker::new(dev, staging))),
            platform: platform.to_owned(),
        })
    }

    #[getter]
    fn platform(&self) -> &str {
        &self.platform
    }

    #[getter]
    fn staging(&self) -> &'static str {
        match lock(&self.inner).staging() {
            Staging::Arena => "arena",
            Staging::Fresh => "fresh",
        }
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_closed()
    }

    fn _malloc(&self, py: Python<'_>, nbytes: u64) -> PyResult<u64> {
        py.detach(|| lock(&self.inner).malloc(nbytes))
            .py()
            .map(|p| p.0)
    }

    fn _free(&self, py: Python<'_>, ptr: u64) -> PyResult<()> {
        py.detach(|| lock(&self.inner).free(DevPtr(ptr))).py()
    }

    fn _copy_to(
        &self,
        py: Python<'_>,
        ptr: u64,
        offset: u64,
        src: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<()> {
        let s = src.as_slice()?;
        py.detach(|| lock(&self.inner).copy_to(DevPtr(ptr), offset, s))
            .py()
    }

    fn _copy_from(
        &self,
        py: Python<'_>,
        ptr: u64,
        offset: u64,
        mut dst: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        let d = dst.as_slice_mut()?;
        py.detach(|| lock(&self.inner).copy_from(DevPtr(ptr), offset, d))
            .py()
    }

    #[pyo3(signature = (what, ptr, dtype, shape, strides, offset))]
    fn _check_tensor(
        &self,
        what: &str,
        ptr: u64,
        dtype: &str,
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
        offset: i64,
    ) -> PyResult<(u64, u64)> {
        let g = geometry(what, dtype, shape, strides, offset)?;
        lock(&self.inner).check_tensor(DevPtr(ptr), &g, what).py()?;
        Ok((g.nbytes(), g.extent()))
    }

    /// `(nbytes, extent)` of a geometry, checked (for host arrays).
    #[staticmethod]
    #[pyo3(signature = (what, dtype, shape, strides))]
    fn _extent(
        what: &str,
        dtype: &str,
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
    ) -> PyResult<(u64, u64)> {
        let g = geometry(what, dtype, shape, strides, 0)?;
        Ok((g.nbytes(), g.extent()))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in lock(&self.inner).stats().entries() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn _view_counts(&self) -> (u64, u64, u64) {
        lock(&self.inner).view_counts()
    }

    fn _arena(&self) -> Option<(u64, u64)> {
        lock(&self.inner).arena().map(|(p, c)| (p.0, c))
    }

    #[pyo3(signature = (op, nth=1, code=None))]
    fn inject_fault(&self, op: &str, nth: u64, code: Option<i64>) -> PyResult<()> {
        let o = Op::parse(op).ok_or_else(|| {
            value_err(format!(
                "unknown driver operation '{op}' (alloc, free, h2d, d2h, map, unmap)"
            ))
        })?;
        let w = lock(&self.inner);
        w.device()
            .inject_fault(o, nth, code)
            .map_err(|e| value_err(e.to_string()))
    }

    fn clear_faults(&self) {
        lock(&self.inner).device().clear_faults();
    }

    fn call_log(&self) -> Vec<(&'static str, u64, u64, i64)> {
        lock(&self.inner)
            .device()
            .call_log()
            .iter()
            .map(|c| (c.op.name(), c.addr, c.bytes, c.code))
            .collect()
    }

    fn _host_view_info(&self, ptr: u64) -> PyResult<Option<&'static str>> {
        lock(&self.inner).host_view_info(DevPtr(ptr)).py()
    }

    fn _trim_staging(&self) -> PyResult<()> {
        lock(&self.inner).trim_staging().py()
    }

    fn _close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| lock(&self.inner).close());
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

    fn _resident_open(&self) -> PyResult<u64> {
        lock(&self.inner).resident_open().py()
    }

    #[allow(clippy::too_many_arguments)]
    fn _resident_add(
        &self,
        py: Python<'_>,
        set: u64,
        name: &str,
        dtype: &str,
        shape: Vec<i64>,
        dir: &str,
        host: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<u64> {
        let g = geometry(&format!("resident tensor {name}"), dtype, shape, None, 0)?;
        let d = direction(dir)?;
        let s = host.as_slice()?;
        py.detach(|| lock(&self.inner).resident_add(set, name, &g, d, s))
            .py()
            .map(|p| p.0)
    }

    fn _resident_release(&self, py: Python<'_>, set: u64) -> PyResult<Vec<PyErr>> {
        Ok(py
            .detach(|| lock(&self.inner).resident_release(set))
            .into_iter()
            .map(to_py)
            .collect())
    }

    fn _resident_is_open(&self, set: u64) -> bool {
        lock(&self.inner).resident_is_open(set)
    }

    // -- the run cycle --

    /// `args`: a list of tuples, in signature order:
    /// `("staged", name, dtype, shape, strides, dir, extent_u8)` or
    /// `("device", name, ptr, dtype, shape, strides, offset, dir)`.
    fn _begin_run(&self, py: Python<'_>, args: &Bound<'_, PyList>) -> PyResult<u64> {
        let mut arrays: Vec<Option<PyReadonlyArray1<'_, u8>>> = Vec::with_capacity(args.len());
        let mut specs = Vec::with_capacity(args.len());
        for a in args.iter() {
            let kind: String = a.get_item(0)?.extract()?;
            let name: String = a.get_item(1)?.extract()?;
            let what = format!("tensor {name}");
            if kind == "staged" {
                let g = geometry(
                    &what,
                    &a.get_item(2)?.extract::<String>()?,
                    a.get_item(3)?.extract()?,
                    a.get_item(4)?.extract()?,
                    0,
                )?;
                let dir = direction(&a.get_item(5)?.extract::<String>()?)?;
                arrays.push(Some(a.get_item(6)?.extract()?));
                specs.push((name, g, dir, None));
            } else {
                let ptr: u64 = a.get_item(2)?.extract()?;
                let g = geometry(
                    &what,
                    &a.get_item(3)?.extract::<String>()?,
                    a.get_item(4)?.extract()?,
                    a.get_item(5)?.extract()?,
                    a.get_item(6)?.extract()?,
                )?;
                let dir = direction(&a.get_item(7)?.extract::<String>()?)?;
                arrays.push(None);
                specs.push((name, g, dir, Some(ptr)));
            }
        }
        let mut bind = Vec::with_capacity(specs.len());
        for ((name, geometry, dir, ptr), arr) in specs.into_iter().zip(&arrays) {
            bind.push(match (ptr, arr) {
                (Some(p), _) => BindArg::Device {
                    name,
                    ptr: DevPtr(p),
                    geometry,
                    dir,
                },
                (None, Some(arr)) => BindArg::Staged {
                    name,
                    geometry,
                    dir,
                    host: arr.as_slice()?,
                },
                (None, None) => unreachable!("staged args carry an array"),
            });
        }
        py.detach(|| lock(&self.inner).begin_run(&bind)).py()
    }

    fn _tensor(&self, gen: u64, arg: usize) -> PyResult<TensorHandle> {
        let (name, g, dir) = lock(&self.inner).run_arg(gen, arg).py()?;
        Ok(TensorHandle {
            worker: self.inner.clone(),
            gen,
            arg,
            name,
            geometry: g,
            dir,
        })
    }

    fn _scratch(
        &self,
        gen: u64,
        name: &str,
        dtype: &str,
        shape: Vec<i64>,
    ) -> PyResult<TensorHandle> {
        let g = geometry(&format!("scratch tensor {name}"), dtype, shape, None, 0)?;
        let arg = lock(&self.inner)
            .scratch(gen, name, g.dtype(), g.shape().to_vec())
            .py()?;
        self._tensor(gen, arg)
    }

    fn _submit(
        &self,
        gen: u64,
        tensors: Vec<PyRef<'_, TensorHandle>>,
        dirs: Vec<String>,
    ) -> PyResult<usize> {
        if tensors.len() != dirs.len() {
            return Err(value_err(format!(
                "{} tensors for {} directions",
                tensors.len(),
                dirs.len()
            )));
        }
        let mut ts = Vec::with_capacity(tensors.len());
        for (t, d) in tensors.iter().zip(&dirs) {
            check_handle(&self.inner, t)?;
            if t.gen != gen {
                return Err(to_py(Error::State(format!(
                    "tensor {} belongs to another run",
                    t.name
                ))));
            }
            ts.push((t.arg, t.geometry.clone(), direction(d)?));
        }
        lock(&self.inner).submit(gen, ts).py()
    }

    fn _begin_execute(&self, gen: u64) -> PyResult<usize> {
        lock(&self.inner).begin_execute(gen).py()
    }

    fn _task_buffers(&self, py: Python<'_>, gen: u64, task: usize) -> PyResult<Vec<PyHostWindow>> {
        let wins = py
            .detach(|| lock(&self.inner).task_buffers(gen, task))
            .py()?;
        Ok(wins
            .into_iter()
            .map(|win| PyHostWindow {
                win,
                readonly: false,
            })
            .collect())
    }

    fn _finish_task(&self, py: Python<'_>, gen: u64, task: usize) -> PyResult<()> {
        py.detach(|| lock(&self.inner).finish_task(gen, task)).py()
    }

    fn _end_execute(&self, gen: u64, ok: bool) -> PyResult<()> {
        lock(&self.inner).end_execute(gen, ok).py()
    }

    fn _fail_run(&self, gen: u64) {
        lock(&self.inner).fail_run(gen)
    }

    fn _copy_back(
        &self,
        py: Python<'_>,
        gen: u64,
        hosts: Vec<Option<PyReadwriteArray1<'_, u8>>>,
    ) -> PyResult<()> {
        let mut hosts = hosts;
        let mut slices: Vec<Option<&mut [u8]>> = Vec::with_capacity(hosts.len());
        for h in hosts.iter_mut() {
            slices.push(match h {
                Some(a) => Some(a.as_slice_mut()?),
                None => None,
            });
        }
        py.detach(|| lock(&self.inner).copy_back(gen, &mut slices))
            .py()
    }

    fn _finish_run(&self, py: Python<'_>, gen: u64) -> PyResult<Py<PyAny>> {
        let r = py.detach(|| lock(&self.inner).finish_run(gen)).py()?;
        report_py(py, &r)
    }
}

// ---- run tensors and the orchestrator --------------------------------------------------------

/// A tensor argument (or a view of one) of the run in progress, as the orchestration sees it.
#[pyclass(module = "simpler._core", name = "RunTensor", frozen)]
struct TensorHandle {
    worker: Shared,
    gen: u64,
    arg: usize,
    name: String,
    geometry: Geometry,
    dir: Direction,
}

#[pymethods]
impl TensorHandle {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.geometry.shape().to_vec()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.geometry.dtype().name()
    }
    #[getter]
    fn direction(&self) -> &'static str {
        self.dir.name()
    }
    #[getter]
    fn arg_index(&self) -> usize {
        self.arg
    }
    #[getter]
    fn nbytes(&self) -> u64 {
        self.geometry.nbytes()
    }

    /// A sub-view: `shape` elements starting at `offsets`, per dimension.
    fn view(&self, shape: Vec<i64>, offsets: Vec<i64>) -> PyResult<TensorHandle> {
        let g = self
            .geometry
            .view(&format!("tensor {}", self.name), &shape, &offsets)
            .py()?;
        Ok(TensorHandle {
            worker: self.worker.clone(),
            gen: self.gen,
            arg: self.arg,
            name: self.name.clone(),
            geometry: g,
            dir: self.dir,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "RunTensor({}, shape={:?}, dtype={}, {})",
            self.name,
            self.geometry.shape(),
            self.geometry.dtype().name(),
            self.dir.name()
        )
    }
}

/// The orchestrator handle's data access, implemented natively (it is the hot path).
#[pyclass(module = "simpler._core", name = "Orchestrator", subclass)]
struct Orchestrator {
    worker: Shared,
}

fn check_handle(w: &Shared, t: &TensorHandle) -> PyResult<()> {
    if !Arc::ptr_eq(w, &t.worker) {
        return Err(to_py(Error::State(format!(
            "tensor {} belongs to another worker",
            t.name
        ))));
    }
    Ok(())
}

#[pymethods]
impl Orchestrator {
    #[new]
    fn new(worker: PyRef<'_, PyWorker>) -> Self {
        Orchestrator {
            worker: worker.inner.clone(),
        }
    }

    /// The element of `t` at `idx` (an int for 1-D tensors, else a tuple), typed by its dtype.
    fn get_tensor_data(
        &self,
        py: Python<'_>,
        t: PyRef<'_, TensorHandle>,
        idx: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        check_handle(&self.worker, &t)?;
        let i = index(idx, &t.name)?;
        let v = lock(&self.worker)
            .orch_read(t.gen, t.arg, &t.geometry, &i)
            .py()?;
        value_py(py, v)
    }

    /// Writes `value` at `idx` of `t`.
    fn set_tensor_data(
        &self,
        t: PyRef<'_, TensorHandle>,
        idx: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        check_handle(&self.worker, &t)?;
        let i = index(idx, &t.name)?;
        let v = self::value(value, &t.name)?;
        lock(&self.worker)
            .orch_write(t.gen, t.arg, &t.geometry, &i, v)
            .py()
    }

    fn _read_window(&self, t: PyRef<'_, TensorHandle>) -> PyResult<PyHostWindow> {
        check_handle(&self.worker, &t)?;
        let win = lock(&self.worker)
            .orch_read_tensor(t.gen, t.arg, &t.geometry)
            .py()?;
        Ok(PyHostWindow {
            win,
            readonly: true,
        })
    }
}

/// Native core of simpler (use the `simpler` package).
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pyo3_log::init();
    m.add_class::<PyWorker>()?;
    m.add_class::<PyHostWindow>()?;
    m.add_class::<TensorHandle>()?;
    m.add_class::<Orchestrator>()?;
    let dtypes: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    m.add("DTYPES", dtypes)?;
    Ok(())
}
