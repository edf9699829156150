//! Device code of a kernel (`CudaCode`) and its launch geometry (`Launch`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use simpler_driver::nvrtc;
use simpler_runtime::{CodeImage, DeviceCode, LaunchDims, ScalarKind};

use crate::errors::{type_err, value_err, Exc, PyResultExt};

/// Dimensions from an int or a sequence of 1 to 3 ints (missing ones are 1), each >= 1.
fn dims3(v: &Bound<'_, PyAny>, what: &str) -> PyResult<[u32; 3]> {
    let items: Vec<Bound<'_, PyAny>> = match v.extract::<u64>() {
        Ok(_) => vec![v.clone()],
        Err(_) => v
            .try_iter()
            .map_err(|_| type_err(format!("Launch: {what} must be an int or 1 to 3 ints")))?
            .collect::<PyResult<_>>()?,
    };
    if items.is_empty() || items.len() > 3 {
        return Err(value_err(format!(
            "Launch: {what} takes 1 to 3 dimensions, not {}",
            items.len()
        )));
    }
    let mut out = [1u32; 3];
    for (i, it) in items.iter().enumerate() {
        let d: u64 = it
            .extract()
            .map_err(|_| type_err(format!("Launch: {what}[{i}] must be a non-negative int")))?;
        out[i] = u32::try_from(d)
            .ok()
            .filter(|d| *d >= 1)
            .ok_or_else(|| value_err(format!("Launch: {what}[{i}] = {d} is not in 1..=2**32-1")))?;
    }
    Ok(out)
}

/// How one submit call of a device kernel launches: the per-task ``grid`` and ``block`` (an
/// int or 1 to 3 ints each), the dynamic shared memory per block, and ``consts``: int64 values
/// appended to every task row of the call (sizes the device code needs, say).
#[pyclass(module = "simpler._core", name = "Launch", frozen)]
#[derive(Clone)]
pub struct Launch {
    pub dims: LaunchDims,
    pub consts: Vec<i64>,
}

#[pymethods]
impl Launch {
    #[new]
    #[pyo3(signature = (grid, block=None, shared_bytes=0, consts=None))]
    fn new(
        grid: &Bound<'_, PyAny>,
        block: Option<&Bound<'_, PyAny>>,
        shared_bytes: u32,
        consts: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let block = match block {
            Some(b) => dims3(b, "block")?,
            None => [1, 1, 1],
        };
        Ok(Launch {
            dims: LaunchDims {
                grid: dims3(grid, "grid")?,
                block,
                shared_bytes,
            },
            consts: consts.unwrap_or_default(),
        })
    }

    /// ``(x, y, z)`` blocks per task.
    #[getter]
    fn grid(&self) -> (u32, u32, u32) {
        let [x, y, z] = self.dims.grid;
        (x, y, z)
    }

    /// ``(x, y, z)`` threads per block.
    #[getter]
    fn block(&self) -> (u32, u32, u32) {
        let [x, y, z] = self.dims.block;
        (x, y, z)
    }

    /// Dynamic shared memory per block, in bytes.
    #[getter]
    fn shared_bytes(&self) -> u32 {
        self.dims.shared_bytes
    }

    /// The int64 values appended to every task row.
    #[getter]
    fn consts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.consts)
    }

    fn __repr__(&self) -> String {
        format!(
            "Launch(grid={:?}, block={:?}, shared_bytes={}, consts={:?})",
            self.grid(),
            self.block(),
            self.dims.shared_bytes,
            self.consts
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Launch>()
            .is_ok_and(|o| o.get().dims == self.dims && o.get().consts == self.consts)
    }
}

/// A kernel's program for CUDA devices: CUDA C++ ``source`` (compiled with NVRTC for the
/// device, once per process), or a ``ptx`` text or ``cubin`` image; ``entry`` names its
/// ``extern "C" __global__`` function. ``launch`` is a :class:`Launch`, or a function called
/// once per submit call with the shape of each tensor view of the task (a tuple per tensor)
/// that returns one. ``scalars`` declares how each scalar travels in the task row
/// (``"int64"``, ``"uint64"`` or ``"float64"``; default: each value's own kind). ``options``
/// are extra NVRTC options (the architecture is added by the runtime). ``contiguous=True``
/// says the code reads every view as row-major contiguous (only the address of a view's first
/// element travels): a submit of another layout is then an ``ArgumentError``.
/// ``arch_specific=True`` compiles source for the device's architecture-specific target
/// (``sm_90a`` on a compute capability 9.0 device, for Hopper's ``wgmma`` and TMA), which runs
/// on exactly that capability. The argument ABI is in ``docs/device-kernels.md``.
#[pyclass(module = "simpler._core", name = "CudaCode", frozen)]
pub struct CudaCode {
    pub code: Arc<DeviceCode>,
    /// A `Launch`, or a callable returning one.
    pub launch: Py<PyAny>,
}

#[pymethods]
impl CudaCode {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.launch)
    }

    #[new]
    #[pyo3(signature = (source=None, *, entry, launch, ptx=None, cubin=None, options=None, scalars=None, contiguous=false, arch_specific=false))]
    #[allow(clippy::too_many_arguments)] // the constructor's keywords
    fn new(
        source: Option<String>,
        entry: String,
        launch: &Bound<'_, PyAny>,
        ptx: Option<&Bound<'_, PyAny>>,
        cubin: Option<Vec<u8>>,
        options: Option<Vec<String>>,
        scalars: Option<Vec<String>>,
        contiguous: bool,
        arch_specific: bool,
    ) -> PyResult<Self> {
        let given = [source.is_some(), ptx.is_some(), cubin.is_some()];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(value_err(format!(
                "CudaCode {entry}: give exactly one of source, ptx and cubin"
            )));
        }
        let image = match (source, ptx, cubin) {
            (Some(text), _, _) => CodeImage::Source {
                text,
                options: options.unwrap_or_default(),
            },
            (_, Some(p), _) => {
                let bytes = match p.cast::<PyString>() {
                    Ok(s) => s.to_str()?.as_bytes().to_vec(),
                    Err(_) => p.extract::<Vec<u8>>().map_err(|_| {
                        type_err(format!("CudaCode {entry}: ptx must be str or bytes"))
                    })?,
                };
                CodeImage::Ptx(bytes)
            }
            (_, _, Some(c)) => CodeImage::Cubin(c),
            _ => unreachable!("exactly one was given"),
        };
        if launch.cast::<Launch>().is_err() && !launch.is_callable() {
            return Err(type_err(format!(
                "CudaCode {entry}: launch must be a Launch or a function of the views' shapes \
                 returning one"
            )));
        }
        let scalars = scalars
            .map(|names| {
                names
                    .iter()
                    .map(|n| {
                        ScalarKind::parse(n).ok_or_else(|| {
                            value_err(format!(
                                "CudaCode {entry}: scalar kind {n:?} is not one of \"int64\", \
                                 \"uint64\", \"float64\""
                            ))
                        })
                    })
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?;
        if arch_specific && !matches!(image, CodeImage::Source { .. }) {
            return Err(value_err(format!(
                "CudaCode {entry}: arch_specific applies to source (a ptx or cubin image \
                 already names its architecture)"
            )));
        }
        let mut code = DeviceCode::new(&entry, image, &entry, scalars).py()?;
        code.contiguous = contiguous;
        code.arch_specific = arch_specific;
        Ok(CudaCode {
            code: Arc::new(code),
            launch: launch.clone().unbind(),
        })
    }

    /// The ``extern "C" __global__`` function launched.
    #[getter]
    fn entry(&self) -> &str {
        &self.code.entry
    }

    /// The CUDA C++ source, or ``None`` for a PTX or cubin image.
    #[getter]
    fn source(&self) -> Option<&str> {
        match &self.code.image {
            CodeImage::Source { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The image given as ``ptx`` or ``cubin`` (``None`` for source).
    #[getter]
    fn image<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.code.image {
            CodeImage::Ptx(b) | CodeImage::Cubin(b) => Some(PyBytes::new(py, b)),
            CodeImage::Source { .. } => None,
        }
    }

    /// Extra NVRTC options.
    #[getter]
    fn options(&self) -> Vec<String> {
        match &self.code.image {
            CodeImage::Source { options, .. } => options.clone(),
            _ => Vec::new(),
        }
    }

    /// Whether the code reads contiguous views only.
    #[getter]
    fn contiguous(&self) -> bool {
        self.code.contiguous
    }

    /// Whether source is compiled for the device's architecture-specific target (``sm_90a``).
    #[getter]
    fn arch_specific(&self) -> bool {
        self.code.arch_specific
    }

    /// The declared scalar kinds, or ``None``.
    #[getter]
    fn scalars(&self) -> Option<Vec<&'static str>> {
        self.code
            .scalars
            .as_ref()
            .map(|k| k.iter().map(|k| k.name()).collect())
    }

    /// The :class:`Launch`, or the function returning one.
    #[getter]
    fn launch(&self, py: Python<'_>) -> Py<PyAny> {
        self.launch.clone_ref(py)
    }

    /// The launch of a submit call whose task views have ``shapes``.
    fn launch_for(&self, py: Python<'_>, shapes: Vec<Vec<u64>>) -> PyResult<Launch> {
        self.resolve(py, &shapes)
    }

    fn __repr__(&self) -> String {
        let kind = match &self.code.image {
            CodeImage::Source { .. } => "source",
            CodeImage::Ptx(_) => "ptx",
            CodeImage::Cubin(_) => "cubin",
        };
        format!("CudaCode({}, {kind})", self.code.entry)
    }
}

impl CudaCode {
    /// The launch for task views of `shapes`: the fixed one, or the function's answer.
    pub fn resolve(&self, py: Python<'_>, shapes: &[Vec<u64>]) -> PyResult<Launch> {
        let l = self.launch.bind(py);
        if let Ok(fixed) = l.cast::<Launch>() {
            return Ok(fixed.get().clone());
        }
        let args = shapes
            .iter()
            .map(|s| PyTuple::new(py, s))
            .collect::<PyResult<Vec<_>>>()?;
        let got = l.call1(PyTuple::new(py, args)?)?;
        got.cast::<Launch>().map(|x| x.get().clone()).map_err(|_| {
            type_err(format!(
                "CudaCode {}: the launch function returned {}, not a Launch",
                self.code.entry,
                got.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })
    }
}

/// The NVRTC the runtime compiles with for a CUDA driver of version ``driver`` (``(major,
/// minor)``, e.g. ``(12, 4)``) and a device of compute ``capability`` (``(9, 0)``), and what it
/// compiles for it: a dict with ``path``, ``version``, ``target`` (``"sm_90"`` for a cubin,
/// ``"compute_90"`` for PTX the driver compiles, ``None`` without a capability),
/// ``target_kind`` (``"cubin"`` / ``"ptx"`` / ``None``), ``driver``, ``capability``,
/// ``summary`` (the one line the runtime logs) and ``candidates``: every NVRTC found, each a
/// dict with ``path``, ``version``, ``usable``, ``why`` and ``target``. ``CompileError`` when
/// no NVRTC fits (the message lists every library tried and why).
#[pyfunction]
#[pyo3(signature = (driver=None, capability=None))]
pub fn nvrtc_info<'py>(
    py: Python<'py>,
    driver: Option<(u32, u32)>,
    capability: Option<(u32, u32)>,
) -> PyResult<Bound<'py, PyDict>> {
    let dirs: Vec<std::path::PathBuf> =
        crate::helpers::call1(py, |h| &h.nvrtc_dirs, ())?.extract()?;
    let choice = crate::shutdown::without_gil(py, || nvrtc::choose(&dirs, driver, capability))
        .map_err(|e| Exc::Compile.err(e.to_string()))?;
    let target = |t: Option<nvrtc::Target>| t.map(|t| t.arch());
    let kind = |t: Option<nvrtc::Target>| {
        t.map(|t| match t {
            nvrtc::Target::Ptx { .. } => "ptx",
            _ => "cubin",
        })
    };
    let d = PyDict::new(py);
    d.set_item("path", choice.nvrtc.library())?;
    d.set_item("version", choice.nvrtc.version())?;
    d.set_item("target", target(choice.target))?;
    d.set_item("target_kind", kind(choice.target))?;
    d.set_item("driver", choice.driver)?;
    d.set_item("capability", choice.capability)?;
    d.set_item("summary", choice.summary())?;
    let candidates = PyList::empty(py);
    for c in &choice.candidates {
        let e = PyDict::new(py);
        e.set_item("path", &c.path)?;
        e.set_item("version", c.version)?;
        e.set_item("usable", c.usable)?;
        e.set_item("why", &c.why)?;
        e.set_item("target", target(c.target))?;
        candidates.append(e)?;
    }
    d.set_item("candidates", candidates)?;
    Ok(d)
}

/// Compiles CUDA C++ ``source`` for a device of compute ``capability`` (``(9, 0)``) with the
/// NVRTC a worker would use for a driver of version ``driver`` (``None``: any), without a
/// device, asking ptxas for its resource report. Returns a dict: ``nvrtc`` (the choice, one
/// line), ``target`` (``"sm_90"``, or ``"compute_XY"`` for PTX), ``kind`` (``"cubin"`` /
/// ``"ptx"``), ``bytes``, ``log``, and ``kernels``: per entry ``registers``, ``barriers``,
/// ``stack_bytes``, ``spill_store_bytes``, ``spill_load_bytes`` and ``arch`` (empty for PTX,
/// which ptxas does not compile). ``CompileError`` when it does not compile.
#[pyfunction]
#[pyo3(signature = (source, capability, *, options=None, name="source.cu", driver=None, arch_specific=false))]
pub fn compile_cuda<'py>(
    py: Python<'py>,
    source: &str,
    capability: (u32, u32),
    options: Option<Vec<String>>,
    name: &str,
    driver: Option<(u32, u32)>,
    arch_specific: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let dirs: Vec<std::path::PathBuf> =
        crate::helpers::call1(py, |h| &h.nvrtc_dirs, ())?.extract()?;
    let options = options.unwrap_or_default();
    let r = crate::shutdown::without_gil(py, || {
        simpler_runtime::compile_report(
            source,
            name,
            &options,
            capability,
            driver,
            arch_specific,
            &dirs,
        )
    })
    .py()?;
    let d = PyDict::new(py);
    d.set_item("nvrtc", r.nvrtc)?;
    d.set_item("target", r.target)?;
    d.set_item("kind", r.kind)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("log", r.log)?;
    let kernels = PyDict::new(py);
    for k in &r.kernels {
        let e = PyDict::new(py);
        e.set_item("arch", &k.arch)?;
        e.set_item("registers", k.registers)?;
        e.set_item("barriers", k.barriers)?;
        e.set_item("stack_bytes", k.stack_bytes)?;
        e.set_item("spill_store_bytes", k.spill_store_bytes)?;
        e.set_item("spill_load_bytes", k.spill_load_bytes)?;
        kernels.set_item(&k.entry, e)?;
    }
    d.set_item("kernels", kernels)?;
    Ok(d)
}

/// ``{"compiles": n, "cache_hits": n}``: NVRTC compilations of device-code source in this
/// process, and loads that found the image already compiled (for the same source, options and
/// compute capability).
#[pyfunction]
pub fn device_code_stats() -> std::collections::HashMap<&'static str, u64> {
    let (compiles, hits) = simpler_runtime::compile_stats();
    [("compiles", compiles), ("cache_hits", hits)].into()
}
