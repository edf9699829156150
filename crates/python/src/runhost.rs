//! One run, from Python: converts the arguments into the runtime's typed run spec and hands the
//! runtime what is Python's — the host arrays' bytes, the orchestration function and the kernels
//! — through [`RunHost`]. The phases and their order are the runtime's (`cycle::run`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use numpy::{PyArray1, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use simpler_runtime::{
    run_with, ArgValue, Direction, Geometry, Orch, Outcome, RunArgSpec, RunCall, RunError, RunHost,
    RunId, TaskCall,
};

use crate::arrays;
use crate::built::BuiltArgs;
use crate::cell::Shared;
use crate::convert;
use crate::devarray::DeviceArray;
use crate::errors::{to_py, type_err, Exc};
use crate::handles::{window_array, DeviceTensor};
use crate::helpers;
use crate::kernels::{Callable, Kernel};
use crate::logging;
use crate::orch::{KernelTable, Orchestrator, RunTensor, RunTensorCache, StagedBytes};
use crate::shutdown;

/// A 1-D uint8 view of `nbytes` bytes of `arr` from its first element (no copy).
pub fn flat_bytes<'py>(arr: &Bound<'py, PyAny>, nbytes: u64) -> PyResult<Bound<'py, PyArray1<u8>>> {
    crate::capi::flat_bytes(arr.cast::<PyUntypedArray>()?, nbytes)
}

/// The protocol of named run arguments: an object that is not a plain sequence gives its
/// arguments as ``(name, value)`` pairs from ``__simpler_args__()`` (``TaskArgsBuilder``,
/// ``BuiltArgs``).
const ARGS_PROTOCOL: &str = "__simpler_args__";

/// `(name, value)` pairs of run arguments: named args carry names; a plain sequence gets
/// positions.
pub fn named_values<'py>(args: &Bound<'py, PyAny>) -> PyResult<Vec<(Arc<str>, Bound<'py, PyAny>)>> {
    let py = args.py();
    // A plain list or tuple (the common case) is not asked for names: no failed lookup per run.
    let plain = args.is_exact_instance_of::<PyList>() || args.is_exact_instance_of::<PyTuple>();
    if !plain {
        if let Ok(b) = args.cast::<BuiltArgs>() {
            // Built natively: read directly (no pairs made per run).
            let b = b.get();
            return Ok(b
                .names
                .iter()
                .zip(&b.values)
                .map(|(n, v)| (n.clone(), v.bind(py).clone()))
                .collect());
        }
        if let Ok(f) = args.getattr(intern!(py, ARGS_PROTOCOL)) {
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
            return Err(type_err(
                "run: args must be a sequence (tensors, then scalars) or built args",
            ));
        }
    }
    args.try_iter()?
        .enumerate()
        .map(|(i, v)| Ok((Arc::from(format!("arg{i}")), v?)))
        .collect()
}

/// A staged array: the caller's, or a contiguous native-order copy of it (for layouts the runtime
/// cannot take byte for byte), written back after the run when the runtime wrote its bytes.
struct Staged<'py> {
    /// The argument's position.
    arg: u32,
    bytes: Bound<'py, PyArray1<u8>>,
    /// `(caller's array, copy)` when a copy was staged.
    copy_of: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    /// The runtime copied the run's output into `bytes` (`lend_output`).
    written: bool,
}

struct Host<'py, 'a> {
    py: Python<'py>,
    cell: &'a Arc<Shared>,
    orchestration: Bound<'py, PyAny>,
    callable: &'a str,
    tensors: usize,
    scalars: Vec<Bound<'py, PyAny>>,
    staged: Vec<Staged<'py>>,
    kernels: Arc<Mutex<KernelTable>>,
    /// The kernel table's token (read without its lock).
    token: u64,
    /// The worker's run tensors of its last run (`RunTensor::reuse`).
    run_tensors: &'a RunTensorCache,
}

impl RunHost for Host<'_, '_> {
    type Error = PyErr;

    fn lend_staged<R>(&mut self, f: impl FnOnce(&[&[u8]]) -> R) -> PyResult<R> {
        let borrows = self
            .staged
            .iter()
            .map(|s| s.bytes.try_readonly())
            .collect::<Result<Vec<_>, _>>()?;
        let slices = borrows
            .iter()
            .map(|b| b.as_slice())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(f(&slices))
    }

    fn lend_output<R>(&mut self, staged: usize, f: impl FnOnce(&mut [u8]) -> R) -> PyResult<R> {
        let s = &mut self.staged[staged];
        let mut b = s.bytes.try_readwrite()?;
        s.written = true;
        Ok(f(b.as_slice_mut()?))
    }

    fn orchestrate(&mut self, run: RunId) -> PyResult<()> {
        let py = self.py;
        let token = self.token;
        let orch = Bound::new(
            py,
            Orchestrator {
                cell: self.cell.clone(),
                run,
                kernels: self.kernels.clone(),
                token,
                staged: self
                    .staged
                    .iter()
                    .map(|s| StagedBytes::new(s.arg, s.bytes.clone().unbind()))
                    .collect(),
            },
        )?;
        let orch_handle = Orch {
            cell: &**self.cell,
            run,
        };
        // The last run's objects, where they describe the same tensors and nothing else holds
        // them (taken out of the cache while objects are made: making one may run Python code,
        // the garbage collector's).
        let mut cache =
            std::mem::take(&mut *self.run_tensors.lock().unwrap_or_else(|e| e.into_inner()));
        if cache.len() < self.tensors {
            cache.resize_with(self.tensors, || None);
        }
        let worker = self.cell.id;
        let held = |arg: u32, name: &str, g: &Geometry, dir: Direction| {
            cache[arg as usize]
                .as_ref()
                .is_some_and(|c| c.get().describes(worker, arg, name, g, dir))
        };
        let infos = orch_handle.tensors_except(self.tensors, &held);
        let mut call_args: Vec<Bound<'_, PyAny>> =
            Vec::with_capacity(1 + self.tensors + self.scalars.len());
        call_args.push(orch.into_any());
        let made = infos.map_err(|e| to_py(py, e)).and_then(|infos| {
            infos
                .into_iter()
                .zip(cache.iter_mut())
                .enumerate()
                .try_for_each(|(i, (info, cached))| {
                    let t = RunTensor::reuse(py, cached, run, i as u32, info, worker)?;
                    call_args.push(t.into_any());
                    Ok(())
                })
        });
        *self.run_tensors.lock().unwrap_or_else(|e| e.into_inner()) = cache;
        made?;
        call_args.extend(self.scalars.iter().cloned());
        let in_python = shutdown::enter_python(py);
        let ret = self.orchestration.call1(PyTuple::new(py, call_args)?);
        drop(in_python);
        logging::flush(py);
        let ret = ret?;
        if might_be_a_coroutine(&ret)? {
            return Err(type_err(format!(
                "callable {}: the orchestration returned a {} instead of running: is it a \
                 generator or async function? It must submit its tasks when called",
                self.callable,
                ret.get_type().name()?
            )));
        }
        Ok(())
    }

    fn kernel(&mut self, call: &TaskCall) -> PyResult<()> {
        let py = self.py;
        let kernel: Py<Kernel> = {
            let table = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
            table.get(py, call.kernel)?
        };
        let k = kernel.get();
        let mut args: Vec<Bound<'_, PyAny>> =
            Vec::with_capacity(call.buffers.len() + call.scalars.len());
        for w in &call.buffers {
            // The arrays of IN tensors are read-only, on every platform.
            args.push(window_array(py, w.clone(), !w.writable)?);
        }
        // Device arrays are valid during the call only, whatever happens.
        let live = Arc::new(AtomicBool::new(true));
        let _over = Invalidate(live.clone());
        for (view, name) in call.device_views.iter().zip(&call.names) {
            let a = DeviceArray::new(self.cell.clone(), *view, name.clone(), live.clone());
            let a = Bound::new(py, a)?.into_any();
            args.push(match k.device_arrays {
                Some(kind @ ("cupy" | "torch")) => {
                    helpers::call1(py, |h| &h.device_array, (kind, a))?
                }
                _ => a,
            });
        }
        for v in &call.scalars {
            args.push(convert::value_py(py, *v)?);
        }
        let in_python = shutdown::enter_python(py);
        let r = k.func.bind(py).call1(PyTuple::new(py, args)?);
        drop(in_python);
        match r {
            Ok(_) => Ok(()),
            Err(e) => {
                let wrote_input = e.is_instance_of::<pyo3::exceptions::PyValueError>(py)
                    && e.value(py).to_string().contains("read-only");
                let ins: Vec<&str> = call
                    .buffers
                    .iter()
                    .zip(&call.names)
                    .filter(|(w, _)| !w.writable)
                    .map(|(_, n)| &**n)
                    .collect();
                let e = if wrote_input && !ins.is_empty() {
                    let which = match ins.as_slice() {
                        [one] => format!("its IN tensor {one}"),
                        many => format!("one of its IN tensors ({})", many.join(", ")),
                    };
                    let new = Exc::Argument.err(format!(
                        "kernel {} (task {}) wrote {which}: the arrays of a kernel's IN tensors \
                         are read-only (declare it INOUT to update it)",
                        k.name, call.task
                    ));
                    new.set_cause(py, Some(e));
                    new
                } else {
                    e
                };
                let note = format!("in task {} (kernel {})", call.task, k.name);
                let _ = e.value(py).call_method1("add_note", (note,));
                Err(e)
            }
        }
    }

    fn checkpoint(&mut self) -> PyResult<()> {
        logging::flush(self.py);
        self.py.check_signals()
    }
}

/// Whether what an orchestration returned looks like a generator or a coroutine (it has `send`
/// and `throw`): the function did not run, it made one. `None` and the plain values a function
/// that submits may return (a task index, a number, a string, a tuple, a list, a dict) are told
/// without asking for attributes (a failed lookup raises and clears an `AttributeError`, which
/// costs a warm run a microsecond).
fn might_be_a_coroutine(ret: &Bound<'_, PyAny>) -> PyResult<bool> {
    use pyo3::types::{PyBool, PyDict, PyFloat, PyInt};
    if ret.is_none()
        || ret.is_exact_instance_of::<PyInt>()
        || ret.is_exact_instance_of::<PyBool>()
        || ret.is_exact_instance_of::<PyFloat>()
        || ret.is_exact_instance_of::<PyString>()
        || ret.is_exact_instance_of::<PyTuple>()
        || ret.is_exact_instance_of::<PyList>()
        || ret.is_exact_instance_of::<PyDict>()
    {
        return Ok(false);
    }
    Ok(ret.hasattr("send")? && ret.hasattr("throw")?)
}

/// Marks a task's device arrays invalid when dropped (the kernel returned, raised, or its
/// arguments could not be built).
struct Invalidate(Arc<AtomicBool>);

impl Drop for Invalidate {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Runs `callable` over `named` arguments on the worker behind `cell`.
pub fn run<'py>(
    py: Python<'py>,
    cell: &Arc<Shared>,
    run_tensors: &RunTensorCache,
    callable: &Bound<'py, Callable>,
    named: Vec<(Arc<str>, Bound<'py, PyAny>)>,
    started: Instant,
    wait: bool,
) -> PyResult<Outcome> {
    let c = callable.get();
    let mut specs = Vec::with_capacity(named.len());
    let mut staged = Vec::new();
    let mut scalars = Vec::new();
    let mut tensors = 0;
    for (name, v) in named {
        // A CPU torch tensor is a host array (a numpy view of its memory), never a scalar.
        let v = match v.cast::<DeviceTensor>() {
            Ok(_) => v,
            Err(_) => convert::host_array(&v, &convert::TensorName(&name))?,
        };
        let value = if let Ok(t) = v.cast::<DeviceTensor>() {
            let t = t.get();
            tensors += 1;
            ArgValue::Device {
                buffer: t.buf,
                geometry: t.geometry,
            }
        } else if let Ok(arr) = v.cast::<PyUntypedArray>() {
            let what = convert::TensorName(&name);
            tensors += 1;
            let (work, geometry, copy_of) = match convert::array_geometry(arr, &what)? {
                Some(g) => (v.clone(), g, None),
                None => {
                    let work = arrays::native_copy(arr)?;
                    let g = convert::array_geometry(work.cast::<PyUntypedArray>()?, &what)?
                        .ok_or_else(|| {
                            type_err(format!(
                                "{what}: cannot stage this array (dtype {}, shape {:?})",
                                arr.dtype(),
                                arr.shape()
                            ))
                        })?;
                    (work.clone(), g, Some((v.clone(), work)))
                }
            };
            let writable: bool = v.getattr("flags")?.getattr("writeable")?.extract()?;
            staged.push(Staged {
                arg: specs.len() as u32,
                bytes: flat_bytes(&work, geometry.extent())?,
                copy_of,
                written: false,
            });
            ArgValue::Staged { geometry, writable }
        } else {
            // The orchestration gets the plain value (a ctypes number's Python value).
            let v = convert::host_scalar(&v)?;
            convert::scalar(&v, &format_args!("run {}: argument '{name}'", c.name))?;
            scalars.push(v);
            ArgValue::Scalar
        };
        specs.push(RunArgSpec { name, value });
    }
    let call = RunCall {
        callable: &c.name,
        sig: &c.sig,
        args: &specs,
    };
    let table = KernelTable::new();
    let token = table.token();
    let mut host = Host {
        py,
        cell,
        orchestration: c.func.bind(py).clone(),
        callable: &c.name,
        tensors,
        scalars,
        staged,
        kernels: Arc::new(Mutex::new(table)),
        token,
        run_tensors,
    };
    let report = run_with(&**cell, &call, &mut host, started, wait).map_err(|e| match e {
        RunError::Runtime(e) => to_py(py, e),
        RunError::Host(e) => e,
    })?;
    for s in host.staged.iter().filter(|s| s.written) {
        if let Some((orig, work)) = &s.copy_of {
            arrays::write_back(orig, work)?;
        }
    }
    Ok(report)
}
