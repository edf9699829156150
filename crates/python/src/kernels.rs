//! Kernels (task bodies) and callables (orchestration functions): a Python function, a name
//! and a typed signature.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use simpler_runtime::{DeclaredWork, Signature};

use crate::convert;
use crate::devcode::CudaCode;
use crate::direction::ArgDirection;
use crate::errors::{type_err, value_err, PyResultExt};

fn signature_py<'py>(py: Python<'py>, sig: &Signature) -> PyResult<Bound<'py, PyTuple>> {
    let entries = sig
        .params()
        .iter()
        .map(|p| {
            let d = ArgDirection::member(py, p.dir)?;
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
    name: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Py<PyAny>, String, Signature)> {
    let name: Option<String> = convert::typed(name, class, "name", "a string")?;
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

/// The work one task of a kernel does, for the sim cost models (``docs/cost-model.md``).
///
/// ``bytes_read`` / ``bytes_written``: bytes the task moves through device memory (``None``:
/// derived from the task's views: the bytes each view holds, its elements times their size,
/// read if the kernel reads it and written if it writes it). ``flops``: operations by
/// precision, ``{"bf16": n, "fp32": m}`` (a multiply-add counts two; ``bf16``, ``fp16``,
/// ``fp8`` and ``int8`` run on the matrix units, ``fp32`` on the vector units; ``ascend-a3``
/// has no fp8 units, and a worker with that model refuses to submit a kernel declaring fp8
/// operations). A kernel without declared operations is priced by its bytes alone.
/// ``efficiency`` (a fraction in (0, 1], or a dict of model name -> fraction) is the share of
/// the device's memory bandwidth and throughput the kernel's structure reaches; a model the
/// kernel does not name prices it at the model's own default (``docs/cost-model.md``).
#[pyclass(module = "simpler._core", name = "KernelWork", frozen)]
pub struct KernelWork {
    pub work: DeclaredWork,
}

#[pymethods]
impl KernelWork {
    #[new]
    #[pyo3(signature = (*, bytes_read=None, bytes_written=None, flops=None, efficiency=None))]
    fn new(
        bytes_read: Option<&Bound<'_, PyAny>>,
        bytes_written: Option<&Bound<'_, PyAny>>,
        flops: Option<&Bound<'_, PyAny>>,
        efficiency: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let read: Option<u64> =
            convert::typed(bytes_read, "KernelWork", "bytes_read", "a byte count")?;
        let written: Option<u64> =
            convert::typed(bytes_written, "KernelWork", "bytes_written", "a byte count")?;
        let flops: Option<Vec<(String, u64)>> = flops
            .filter(|f| !f.is_none())
            .map(|f| {
                let d = f.cast::<PyDict>().map_err(|_| {
                    type_err(format!(
                        "KernelWork: flops must be a dict of precision -> count, not {}",
                        crate::errors::type_name(f)
                    ))
                })?;
                d.iter()
                    .map(|(k, v)| {
                        let pair = (k.extract::<String>(), v.extract::<u64>());
                        match pair {
                            (Ok(k), Ok(v)) => Ok((k, v)),
                            _ => Err(type_err(format!(
                                "KernelWork: flops maps precision names to operation counts, \
                                 not {k} -> {v}"
                            ))),
                        }
                    })
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?;
        let efficiency: Vec<(String, f64)> = match efficiency.filter(|e| !e.is_none()) {
            None => Vec::new(),
            Some(e) => {
                if let Ok(d) = e.cast::<PyDict>() {
                    d.iter()
                        .map(|(k, v)| match (k.extract::<String>(), v.extract::<f64>()) {
                            (Ok(k), Ok(v)) => Ok((k, v)),
                            _ => Err(type_err(format!(
                                "KernelWork: efficiency maps model names to fractions, not {k} -> {v}"
                            ))),
                        })
                        .collect::<PyResult<Vec<_>>>()?
                } else if let Ok(v) = e.extract::<f64>() {
                    simpler_driver::model::MODELS
                        .iter()
                        .map(|m| (m.to_string(), v))
                        .collect()
                } else {
                    return Err(type_err(format!(
                        "KernelWork: efficiency must be a fraction or a dict of model -> fraction, not {}",
                        crate::errors::type_name(e)
                    )));
                }
            }
        };
        let work = DeclaredWork::new("(KernelWork)", read, written, &flops.unwrap_or_default())
            .and_then(|w| w.with_efficiency("(KernelWork)", &efficiency))
            .py()?;
        Ok(KernelWork { work })
    }

    /// The fraction of each model's device rates the kernel declares it reaches, by model (only
    /// the declared ones; a model not named prices the kernel at its own default).
    #[getter]
    fn efficiency<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for m in simpler_driver::model::MODELS {
            if let Some(e) = self.work.efficiency(m) {
                d.set_item(m, e)?;
            }
        }
        Ok(d)
    }

    /// Bytes one task reads, or ``None`` (derived from its views).
    #[getter]
    fn bytes_read(&self) -> Option<u64> {
        self.work.bytes_read
    }

    /// Bytes one task writes, or ``None`` (derived from its views).
    #[getter]
    fn bytes_written(&self) -> Option<u64> {
        self.work.bytes_written
    }

    /// Operations one task does, by precision (only the non-zero ones).
    #[getter]
    fn flops<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (p, n) in self.work.flops.entries() {
            d.set_item(p.name(), n)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let flops: Vec<String> = self
            .work
            .flops
            .entries()
            .map(|(p, n)| format!("{}={n}", p.name()))
            .collect();
        let eff: Vec<String> = simpler_driver::model::MODELS
            .iter()
            .filter_map(|m| self.work.efficiency(m).map(|e| format!("{m}={e}")))
            .collect();
        let eff = if eff.is_empty() {
            String::new()
        } else {
            format!(", efficiency={{{}}}", eff.join(", "))
        };
        format!(
            "KernelWork(bytes_read={:?}, bytes_written={:?}, flops={{{}}}{eff})",
            self.work.bytes_read,
            self.work.bytes_written,
            flops.join(", ")
        )
    }
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
///
/// ``cuda`` (a :class:`CudaCode`) is the kernel's program for CUDA devices: on ``cuda`` the
/// runtime launches it natively instead of calling ``fn`` (which stays the reference and runs
/// on ``sim``). ``device_arrays`` makes ``fn`` take device memory where the host cannot reach
/// it (cuda) instead of host copies: ``True`` passes :class:`DeviceArray` objects (CUDA Array
/// Interface and DLPack), ``"cupy"`` CuPy arrays and ``"torch"`` PyTorch tensors over them, no
/// copy; on ``sim`` ``fn`` gets numpy arrays over device memory either way. See
/// ``docs/device-kernels.md``.
///
/// ``work`` (a :class:`KernelWork`) is what one task does, for the sim cost models: without
/// it, a task's bytes are derived from its views and it does no priced operations.
#[pyclass(module = "simpler._core", name = "Kernel", frozen, subclass, weakref)]
pub struct Kernel {
    pub func: Py<PyAny>,
    pub name: String,
    pub sig: Signature,
    pub cuda: Option<Py<CudaCode>>,
    /// `None` (host copies), or the kind of device arrays `fn` takes: `"raw"`, `"cupy"`,
    /// `"torch"`.
    pub device_arrays: Option<&'static str>,
    /// The work one task declares (for the cost models).
    pub work: Option<DeclaredWork>,
    /// The id the last run's kernel table gave this kernel, tagged with that table's token (see
    /// `orch::KernelTable`): a submit finds it here instead of locking the table.
    pub last_id: AtomicU64,
}

#[pymethods]
impl Kernel {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.func)?;
        if let Some(c) = &self.cuda {
            visit.call(c)?;
        }
        Ok(())
    }

    #[new]
    #[pyo3(signature = (fn_, signature, name=None, *, cuda=None, device_arrays=None, work=None))]
    fn new(
        fn_: &Bound<'_, PyAny>,
        signature: &Bound<'_, PyAny>,
        name: Option<&Bound<'_, PyAny>>,
        cuda: Option<&Bound<'_, PyAny>>,
        device_arrays: Option<&Bound<'_, PyAny>>,
        work: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (func, name, sig) = function_parts("Kernel", "fn", "kernel", fn_, signature, name)?;
        let cuda = cuda
            .filter(|c| !c.is_none())
            .map(|c| {
                c.cast::<CudaCode>()
                    .map(|c| c.clone().unbind())
                    .map_err(|_| {
                        type_err(format!(
                            "Kernel {name}: cuda must be a CudaCode, not {}",
                            c.get_type()
                                .name()
                                .map_or_else(|_| "?".into(), |n| n.to_string())
                        ))
                    })
            })
            .transpose()?;
        let device_arrays = match device_arrays {
            None => None,
            Some(d) if d.is_instance_of::<pyo3::types::PyBool>() => d.is_truthy()?.then_some("raw"),
            Some(d) => match d.extract::<String>().ok().as_deref() {
                Some("cupy") => Some("cupy"),
                Some("torch") => Some("torch"),
                _ => {
                    return Err(value_err(format!(
                        "Kernel {name}: device_arrays takes True, False, \"cupy\" or \"torch\", \
                         not {d}"
                    )))
                }
            },
        };
        let work = work
            .filter(|w| !w.is_none())
            .map(|w| {
                w.cast::<KernelWork>().map(|w| w.get().work).map_err(|_| {
                    type_err(format!(
                        "Kernel {name}: work must be a KernelWork, not {}",
                        crate::errors::type_name(w)
                    ))
                })
            })
            .transpose()?;
        Ok(Kernel {
            func,
            name,
            sig,
            cuda,
            device_arrays,
            work,
            last_id: AtomicU64::new(0),
        })
    }

    /// The work one task declares (a :class:`KernelWork`), or ``None``.
    #[getter]
    fn work(&self) -> Option<KernelWork> {
        self.work.map(|work| KernelWork { work })
    }

    /// ``False``, ``True`` (:class:`DeviceArray` objects), ``"cupy"`` or ``"torch"``: what
    /// ``fn`` takes on a device whose memory the host cannot reach.
    #[getter]
    fn device_arrays(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self.device_arrays {
            None => false.into_pyobject(py)?.to_owned().into_any().unbind(),
            Some("raw") => true.into_pyobject(py)?.to_owned().into_any().unbind(),
            Some(k) => k.into_pyobject(py)?.into_any().unbind(),
        })
    }

    /// The kernel's :class:`CudaCode`, or ``None``.
    #[getter]
    fn cuda(&self, py: Python<'_>) -> Option<Py<CudaCode>> {
        self.cuda.as_ref().map(|c| c.clone_ref(py))
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
#[pyclass(module = "simpler._core", name = "Callable", frozen, subclass, weakref)]
pub struct Callable {
    pub func: Py<PyAny>,
    /// Shared with the report of every run (a count, not a copy of the string per run).
    pub name: Arc<str>,
    pub sig: Signature,
}

#[pymethods]
impl Callable {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.func)
    }

    #[new]
    #[pyo3(signature = (orchestration, signature, name=None))]
    fn new(
        orchestration: &Bound<'_, PyAny>,
        signature: &Bound<'_, PyAny>,
        name: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (func, name, sig) = function_parts(
            "Callable",
            "orchestration",
            "callable",
            orchestration,
            signature,
            name,
        )?;
        Ok(Callable {
            func,
            name: name.into(),
            sig,
        })
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
