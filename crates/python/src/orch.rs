//! The orchestrator handle and the run tensors an orchestration sees. These are the hot path of a
//! run (tens of thousands of calls per round), so each call converts its arguments directly and
//! takes the worker lock once.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::Borrowed;

use simpler_runtime::{
    BatchScalar, BatchSlot, DeviceLaunch, Direction, Geometry, KernelRef, Orch, RunError, RunId,
    Signature, TensorInfo, Value, BATCH_PART, MAX_DIMS,
};

use crate::arrays;
use crate::cell::Shared;
use crate::convert::{self, small_ints, small_ints_into, TensorName};
use crate::devcode::Launch;
use crate::direction::ArgDirection;
use crate::errors::{done, state_err, type_err, value_err, PyResultExt, PyRuntimeErr};
use crate::handles::window_array;
use crate::helpers;
use crate::kernels::Kernel;
use crate::logging;

/// The kernels a run's tasks use, by the id the runtime records.
///
/// Each table has a token of its own (a process-wide count): a kernel remembers the id the last
/// table gave it, tagged with that table's token (`Kernel::last_id`), so a submit of a kernel
/// this run used before finds its id without locking the table. The table stays the authority:
/// a tag of another table (another run, another worker, another thread) is a miss.
pub struct KernelTable {
    kernels: Vec<Py<Kernel>>,
    ids: HashMap<usize, u32>,
    token: u64,
}

/// Bits of a kernel's tagged id that hold the id; the token takes the others.
const ID_BITS: u32 = 24;
const ID_MASK: u64 = (1 << ID_BITS) - 1;

impl KernelTable {
    /// A table with a new token.
    pub fn new() -> KernelTable {
        static TOKENS: AtomicU64 = AtomicU64::new(1);
        KernelTable {
            kernels: Vec::new(),
            ids: HashMap::new(),
            token: TOKENS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The tag of `id` in this table, when both fit one (else never a hit).
    fn tag(token: u64, id: u32) -> Option<u64> {
        (token < 1 << (64 - ID_BITS) && id < 1 << ID_BITS).then(|| token << ID_BITS | u64::from(id))
    }

    /// This table's token.
    pub fn token(&self) -> u64 {
        self.token
    }

    fn id(&mut self, k: &Bound<'_, Kernel>) -> u32 {
        let key = k.as_ptr() as usize;
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.kernels.len() as u32;
        self.kernels.push(k.clone().unbind());
        self.ids.insert(key, id);
        id
    }

    /// The kernel with id `id`.
    pub fn get(&self, py: Python<'_>, id: u32) -> PyResult<Py<Kernel>> {
        self.kernels
            .get(id as usize)
            .map(|k| k.clone_ref(py))
            .ok_or_else(|| state_err(format!("no kernel {id} in this run")))
    }
}

/// A tensor argument of the run in progress (or a view of one), as the orchestration sees it.
/// ``view(shape, offsets)`` makes a sub-view; ``views(shape, offsets)`` one view per row of
/// ``offsets``, for ``Orchestrator.submit_many``.
#[pyclass(module = "simpler._core", name = "RunTensor", frozen)]
pub struct RunTensor {
    /// The id of the worker whose run this is (a handle needs only to be told apart from
    /// another worker's: no reference to the worker, so a view costs no atomic count).
    pub worker: u64,
    /// The run (a `RunId`). Atomic only so that a worker can hand its next run the same
    /// object when nothing else holds it (see `RunTensor::reuse`); a handle never changes run
    /// while anything can see it.
    run: AtomicU64,
    pub arg: u32,
    pub name: Arc<str>,
    pub geometry: Geometry,
    pub dir: Direction,
}

impl RunTensor {
    /// Argument `arg` of run `run` of worker `worker`, as `info` describes it.
    pub fn new(worker: u64, run: RunId, arg: u32, info: TensorInfo) -> RunTensor {
        RunTensor {
            worker,
            run: AtomicU64::new(run.0),
            arg,
            name: info.name,
            geometry: info.geometry,
            dir: info.dir,
        }
    }

    /// The run this handle belongs to.
    #[inline]
    pub fn run(&self) -> RunId {
        RunId(self.run.load(Ordering::Relaxed))
    }

    /// Whether this object describes argument `arg` of worker `worker` as `name`, `geometry` and
    /// `dir` do (a run handing out the same argument again can hand out this object).
    pub fn describes(
        &self,
        worker: u64,
        arg: u32,
        name: &str,
        geometry: &Geometry,
        dir: Direction,
    ) -> bool {
        self.worker == worker
            && self.arg == arg
            && self.dir == dir
            && self.geometry == *geometry
            && *self.name == *name
    }

    /// Argument `arg` of run `run` for the orchestration: `cached`, the object an earlier run
    /// handed out for that argument, when it describes the same tensor (`info` is `None`, see
    /// `Orch::tensors_except`) and nothing but the cache holds it any more, moved to `run`; else
    /// a new object (described by `info`, or like `cached`), which replaces it in the cache. A
    /// warm run of the same arguments so makes no new objects. Reuse is invisible: with one
    /// reference (the cache's) no Python code can reach the object, and a run tensor supports no
    /// weak references and is not tracked by the garbage collector.
    pub fn reuse<'py>(
        py: Python<'py>,
        cached: &mut Option<Py<RunTensor>>,
        run: RunId,
        arg: u32,
        info: Option<TensorInfo>,
        worker: u64,
    ) -> PyResult<Bound<'py, RunTensor>> {
        let info = match (info, cached.as_ref()) {
            (Some(info), _) => info,
            (None, Some(c)) if c.get_refcnt(py) == 1 => {
                c.get().run.store(run.0, Ordering::Relaxed);
                return Ok(c.bind(py).clone());
            }
            (None, Some(c)) => {
                let t = c.get();
                TensorInfo {
                    name: t.name.clone(),
                    geometry: t.geometry,
                    dir: t.dir,
                }
            }
            (None, None) => return Err(state_err(format!("no run tensor {arg} to hand out"))),
        };
        let t = Bound::new(py, RunTensor::new(worker, run, arg, info))?;
        *cached = Some(t.clone().unbind());
        Ok(t)
    }
}

#[pymethods]
impl RunTensor {
    /// The argument's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// The view's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.geometry.shape())
    }
    /// The dtype's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.geometry.dtype().name()
    }
    /// The argument's direction in the callable's signature.
    #[getter]
    fn direction<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        ArgDirection::member(py, self.dir)
    }
    /// The argument's position (scratch tensors follow the callable's arguments).
    #[getter]
    fn arg_index(&self) -> u32 {
        self.arg
    }
    /// Bytes of the view's elements.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.geometry.nbytes()
    }

    /// A sub-view: ``shape`` elements starting at ``offsets``, per dimension.
    fn view(&self, shape: &Bound<'_, PyAny>, offsets: &Bound<'_, PyAny>) -> PyResult<RunTensor> {
        let what = TensorName(&self.name);
        let (mut s, mut o) = ([0i64; MAX_DIMS], [0i64; MAX_DIMS]);
        let n = small_ints_into(shape, &what, &mut s)?;
        let m = small_ints_into(offsets, &what, &mut o)?;
        let geometry = self.geometry.view(&what, &s[..n], &o[..m]).py()?;
        Ok(RunTensor {
            worker: self.worker,
            run: AtomicU64::new(self.run().0),
            arg: self.arg,
            name: self.name.clone(),
            geometry,
            dir: self.dir,
        })
    }

    /// One view of ``shape`` per row of ``offsets`` (an ``(n, rank)`` integer array; ``(n,)``
    /// for rank 1): the per-task tensor of a ``submit_many`` slot.
    fn views(
        &self,
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
    ) -> PyResult<RunViews> {
        let what = TensorName(&self.name);
        let (s, n) = small_ints(shape, &what)?;
        let zeros = [0i64; MAX_DIMS];
        let layout = self.geometry.view(&what, &s[..n], &zeros[..n]).py()?;
        let nd = self.geometry.ndim();
        // An (n, rank) C-contiguous int64 array is taken as is; anything else is converted (and
        // refused unless it has rank columns: none for a 0-d tensor, whose views have no
        // coordinates).
        let direct = offsets
            .extract::<PyReadonlyArray2<'_, i64>>()
            .ok()
            .filter(|a| a.shape()[1] == nd && a.is_c_contiguous());
        let rows = match direct {
            Some(a) => a,
            None => {
                let what = format!("tensor {}", self.name);
                arrays::offset_rows(offsets, nd, &what)?.extract()?
            }
        };
        let [count, width] = [rows.shape()[0], rows.shape()[1]];
        if width != nd {
            return Err(value_err(format!(
                "tensor {}: view offsets must have {nd} column(s), one per dimension of the view, not {width}",
                self.name
            )));
        }
        let flat = rows.as_slice()?;
        let mut starts = Vec::with_capacity(count);
        for k in 0..count {
            if k % INTERRUPT_EVERY == INTERRUPT_EVERY - 1 {
                py.check_signals()?;
            }
            // `width == nd`, so row k is `flat[k * nd..(k + 1) * nd]` (empty for a 0-d view).
            let row = &flat[k * nd..(k + 1) * nd];
            let start = self
                .geometry
                .view_offset(
                    &format_args!("tensor {} (row {k} of the offsets)", self.name),
                    &s[..n],
                    row,
                )
                .py()?;
            starts.push(start);
        }
        Ok(RunViews {
            worker: self.worker,
            run: self.run(),
            arg: self.arg,
            name: self.name.clone(),
            layout,
            starts,
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

/// The run tensors a worker's last run handed its orchestration, by argument: the next run
/// hands out the same objects where nothing else holds them (`RunTensor::reuse`).
pub type RunTensorCache = Mutex<Vec<Option<Py<RunTensor>>>>;

/// Many views of one run tensor (``RunTensor.views``): one per task of a ``submit_many``.
#[pyclass(module = "simpler._core", name = "RunViews", frozen)]
pub struct RunViews {
    worker: u64,
    run: RunId,
    arg: u32,
    name: Arc<str>,
    layout: Geometry,
    starts: Vec<u64>,
}

#[pymethods]
impl RunViews {
    /// The shape of each view.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.layout.shape())
    }

    fn __len__(&self) -> usize {
        self.starts.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "RunViews({}, {} views of shape {:?})",
            self.name,
            self.starts.len(),
            self.layout.shape()
        )
    }
}

/// The handle an orchestration function receives.
///
/// ``get_tensor_data(t, idx)`` / ``set_tensor_data(t, idx, value)`` read and write one element
/// (``idx`` an int for 1-D tensors, else a tuple), typed by the tensor's dtype;
/// ``read_tensor(t)`` returns a read-only numpy array of the tensor's contents;
/// ``submit(kernel, *tensors, *scalars)`` queues one task and ``submit_many(kernel, *slots)``
/// many; ``scratch(shape, dtype)`` makes a run-scoped tensor.
#[pyclass(module = "simpler._core", name = "Orchestrator", frozen)]
pub struct Orchestrator {
    pub cell: Arc<Shared>,
    pub run: RunId,
    pub kernels: Arc<Mutex<KernelTable>>,
    /// The kernel table's token (`KernelTable`).
    pub token: u64,
    /// The bytes the run uploaded for each staged argument: what the orchestrator reads them
    /// from (a staged tensor is never mapped nor read back).
    pub staged: Vec<StagedBytes>,
}

/// The bytes a run uploaded for staged argument `arg`, and whether they were given to the
/// runtime yet (once per run).
pub struct StagedBytes {
    arg: u32,
    bytes: Py<PyArray1<u8>>,
    given: AtomicBool,
}

impl StagedBytes {
    pub fn new(arg: u32, bytes: Py<PyArray1<u8>>) -> StagedBytes {
        StagedBytes {
            arg,
            bytes,
            given: AtomicBool::new(false),
        }
    }
}

impl Orchestrator {
    /// Before the first access to staged argument `arg` this run: gives the runtime the bytes
    /// the run uploaded for it, when it wants them (an uploaded tensor, not read yet).
    #[inline(always)]
    fn stage_source(&self, py: Python<'_>, arg: u32) -> PyResult<()> {
        if self.staged.is_empty() {
            return Ok(()); // a run of resident tensors
        }
        self.stage_source_of(py, arg)
    }

    /// [`Orchestrator::stage_source`] of a run with staged arguments.
    fn stage_source_of(&self, py: Python<'_>, arg: u32) -> PyResult<()> {
        let Some(s) = self.staged.iter().find(|s| s.arg == arg) else {
            return Ok(());
        };
        if s.given.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let orch = self.orch();
        if !orch.wants_staged(arg) {
            return Ok(());
        }
        let bytes = s.bytes.bind(py).try_readonly()?;
        done(py, orch.supply_staged(arg, bytes.as_slice()?))
    }

    /// The runtime's handle on this run.
    fn orch(&self) -> Orch<'_, Shared> {
        Orch {
            cell: &self.cell,
            run: self.run,
        }
    }

    /// Refuses a handle (run tensor or views of `name`) of another worker (by its id), or of
    /// another run (one run at a time per worker: another run is a finished one).
    #[inline(always)]
    fn check(&self, worker: u64, run: RunId, name: &str) -> PyResult<()> {
        if run == self.run && worker == self.cell.id {
            return Ok(()); // the hot path: a tensor of this run
        }
        self.refuse(worker, run, name)
    }

    /// The error [`Orchestrator::check`] reports.
    #[cold]
    fn refuse(&self, worker: u64, run: RunId, name: &str) -> PyResult<()> {
        if worker != self.cell.id {
            return Err(state_err(format!(
                "tensor {name} belongs to another worker"
            )));
        }
        self.orch().owns(run).py()
    }

    /// The runtime's handle on `kernel` (registered in this run's kernel table), with the
    /// device launch of this submit call when it carries device code.
    fn kernel_ref<'k>(
        &self,
        kernel: &'k Bound<'_, Kernel>,
        launch: Option<&'k Launch>,
    ) -> KernelRef<'k> {
        let k = kernel.get();
        let tagged = k.last_id.load(Ordering::Relaxed);
        let id = (tagged & ID_MASK) as u32;
        let id = match KernelTable::tag(self.token, id) {
            Some(t) if t == tagged => id, // this table gave it that id: a hit
            _ => {
                let id = self
                    .kernels
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .id(kernel);
                if let Some(t) = KernelTable::tag(self.token, id) {
                    k.last_id.store(t, Ordering::Relaxed);
                }
                id
            }
        };
        let device = k.cuda.as_ref().zip(launch).map(|(c, l)| DeviceLaunch {
            code: &c.get().code,
            dims: l.dims,
            consts: &l.consts,
        });
        let threads = launch.map(|l| {
            let d = l.dims;
            d.grid
                .iter()
                .chain(&d.block)
                .map(|&x| u64::from(x))
                .product()
        });
        KernelRef {
            id,
            name: &k.name,
            sig: &k.sig,
            device,
            device_arrays: k.device_arrays.is_some(),
            work: k.work.as_ref(),
            threads,
        }
    }

    /// The launch of a submit call of `k` over views of `shapes`, with its device code loaded
    /// (compiled first, for source) when this worker's device runs device code; `None` for a
    /// kernel without device code.
    fn device_launch<'a>(
        &self,
        py: Python<'_>,
        k: &Kernel,
        shapes: impl Iterator<Item = &'a Geometry>,
    ) -> PyResult<Option<Launch>> {
        let Some(code) = &k.cuda else {
            return Ok(None);
        };
        let code = code.get();
        let shapes: Vec<Vec<u64>> = shapes.map(|g| g.shape().to_vec()).collect();
        let launch = code.resolve(py, &shapes)?;
        let orch = self.orch();
        if !orch.device_ready(&code.code) {
            let dirs: Vec<std::path::PathBuf> =
                helpers::call1(py, |h| &h.nvrtc_dirs, ())?.extract()?;
            done(py, orch.prepare_device(&code.code, &dirs))?;
        }
        Ok(Some(launch))
    }

    fn run_tensor(&self, py: Python<'_>, arg: u32) -> PyResult<RunTensor> {
        let info = done(py, self.orch().tensor(arg))?;
        Ok(RunTensor::new(self.cell.id, self.run, arg, info))
    }
}

/// Tensors of a single submit held on the stack (more spill into a vector).
const INLINE_TENSORS: usize = 4;

/// Work items between checks for a pending Ctrl+C in long per-task loops (a batch of a billion
/// tasks takes tens of seconds; each check is one call into the interpreter): as often as the
/// runtime records a large batch's parts.
const INTERRUPT_EVERY: usize = BATCH_PART;

/// `items` mapped by `f`, checking for a pending interrupt every [`INTERRUPT_EVERY`] items.
fn map_interruptible<T: Copy>(
    py: Python<'_>,
    items: &[T],
    f: impl Fn(T) -> Value,
) -> PyResult<Vec<Value>> {
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(INTERRUPT_EVERY) {
        out.extend(chunk.iter().map(|&x| f(x)));
        py.check_signals()?;
    }
    Ok(out)
}

/// Per-task values of a ``submit_many`` scalar position.
fn per_task_values(obj: &Bound<'_, PyAny>, what: &dyn fmt::Display) -> PyResult<Vec<Value>> {
    let py = obj.py();
    if let Ok(a) = obj.extract::<PyReadonlyArray1<'_, i64>>() {
        if let Ok(v) = a.as_slice() {
            return map_interruptible(py, v, Value::Int);
        }
    }
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        let kind = arr.dtype().kind();
        return match kind {
            b'b' => {
                let a: PyReadonlyArray1<'_, bool> = arrays::column(obj, "bool")?.extract()?;
                map_interruptible(py, a.as_slice()?, Value::Bool)
            }
            b'i' => {
                let a: PyReadonlyArray1<'_, i64> = arrays::column(obj, "int64")?.extract()?;
                map_interruptible(py, a.as_slice()?, Value::Int)
            }
            // Unsigned values past i64::MAX stay unsigned, as a single submit's do.
            b'u' => {
                let a: PyReadonlyArray1<'_, u64> = arrays::column(obj, "uint64")?.extract()?;
                map_interruptible(py, a.as_slice()?, |u| {
                    i64::try_from(u).map_or(Value::UInt(u), Value::Int)
                })
            }
            b'f' => {
                let a: PyReadonlyArray1<'_, f64> = arrays::column(obj, "float64")?.extract()?;
                map_interruptible(py, a.as_slice()?, Value::Float)
            }
            _ => Err(type_err(format!(
                "{what}: per-task scalars must be an int, float or bool array"
            ))),
        };
    }
    obj.try_iter()?.map(|v| convert::value(&v?, what)).collect()
}

/// The error for a submit whose tensors do not fill the signature: the signature's count rule
/// when `got` tensors were given, else (the count is right, in the wrong places) a tensor after
/// the scalars.
fn count_err(sig: &Signature, who: &dyn fmt::Display, got: usize) -> PyErr {
    match sig.check_count(who, got) {
        Err(e) => PyRuntimeErr(e).into(),
        Ok(()) => value_err(format!("{who}: a tensor after the scalars")),
    }
}

/// A run tensor argument of an element access, or an error naming what it got.
#[inline(always)]
fn run_tensor_arg<'a>(t: &'a Bound<'_, PyAny>) -> PyResult<&'a RunTensor> {
    match t.cast::<RunTensor>() {
        Ok(r) => Ok(r.get()),
        Err(_) => Err(type_err(format!(
            "expected a tensor of the run (an orchestration argument or a view of one), not {}",
            crate::errors::type_name(t)
        ))),
    }
}

/// The kernel argument of a submit, or an error naming the call and what it got.
fn kernel_arg<'a, 'py>(
    kernel: &'a Bound<'py, PyAny>,
    who: &str,
) -> PyResult<&'a Bound<'py, Kernel>> {
    kernel.cast::<Kernel>().map_err(|_| {
        type_err(format!(
            "{who}: expected a Kernel, got {}",
            crate::errors::type_name(kernel)
        ))
    })
}

#[pymethods]
impl Orchestrator {
    /// The element of ``t`` at ``idx`` (an int for 1-D tensors, else a tuple), typed by its
    /// dtype.
    fn get_tensor_data<'py>(
        &self,
        py: Python<'py>,
        t: &Bound<'py, PyAny>,
        idx: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = run_tensor_arg(t)?;
        self.check(t.worker, t.run(), &t.name)?;
        self.stage_source(py, t.arg)?;
        let mut ix = [0i64; MAX_DIMS];
        let n = small_ints_into(idx, &TensorName(&t.name), &mut ix)?;
        let v = done(py, self.orch().read(t.arg, &t.geometry, &ix[..n]))?;
        convert::value_py(py, v)
    }

    /// Writes ``value`` at ``idx`` of ``t``.
    fn set_tensor_data(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        idx: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let t = run_tensor_arg(t)?;
        self.check(t.worker, t.run(), &t.name)?;
        self.stage_source(py, t.arg)?;
        let what = TensorName(&t.name);
        let (ix, n) = small_ints(idx, &what)?;
        let v = convert::value(value, &what)?;
        done(py, self.orch().write(t.arg, &t.geometry, &ix[..n], v))
    }

    /// The tensor's contents as a read-only numpy array (no copy over a mapping or a mirror).
    fn read_tensor<'py>(
        &self,
        py: Python<'py>,
        t: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = run_tensor_arg(t)?;
        self.check(t.worker, t.run(), &t.name)?;
        self.stage_source(py, t.arg)?;
        let win = done(py, self.orch().read_tensor(t.arg, &t.geometry))?;
        window_array(py, win, true)
    }

    /// A run-scoped device tensor for intermediate results, live until the run's cleanup.
    ///
    /// Its bytes come from the worker's retained scratch pool, so a warm run with the same
    /// footprint does no device malloc. Its contents are undefined until a task writes it.
    #[pyo3(signature = (shape, dtype, name=None))]
    fn scratch(
        &self,
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        name: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<RunTensor> {
        let name: Option<String> = convert::typed(name, "scratch", "name", "a string")?;
        let name = name.as_deref();
        let what = format!("scratch tensor {}", name.unwrap_or("(unnamed)"));
        let dt = convert::dtype(dtype, &what)?;
        let shape = convert::shape(shape, &what)?;
        let arg = done(py, self.orch().scratch(name, dt, &shape))?;
        self.run_tensor(py, arg)
    }

    /// Queues one task of ``kernel`` over tensors (or views) of this run, then scalars; returns
    /// its index. Tasks run in submission order, after the orchestration returns.
    #[pyo3(signature = (kernel, *args))]
    fn submit(
        &self,
        py: Python<'_>,
        kernel: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<u64> {
        let kernel = kernel_arg(kernel, "submit")?;
        let k = kernel.get();
        let n = k.sig.len();
        // The run tensors (which `args` holds) are borrowed, their views too: no copy, and no
        // allocation for a kernel of up to INLINE_TENSORS tensors (more spill into a vector).
        let mut held: [Option<Borrowed<'_, '_, RunTensor>>; INLINE_TENSORS] =
            [None; INLINE_TENSORS];
        let mut spill: Vec<Borrowed<'_, '_, RunTensor>> = Vec::new();
        let mut count = 0;
        let mut scalars: Vec<Value> = Vec::new();
        for (i, a) in args.iter_borrowed().enumerate() {
            match a.cast::<RunTensor>() {
                Ok(t) if i < n => {
                    let r = t.get();
                    self.check(r.worker, r.run(), &r.name)?;
                    if count < INLINE_TENSORS {
                        held[count] = Some(t);
                    } else {
                        if spill.is_empty() {
                            spill.extend(held.iter().flatten());
                        }
                        spill.push(t);
                    }
                    count += 1;
                }
                Ok(_) => {
                    return Err(value_err(format!(
                        "submit {}: tensor after scalars (argument {i})",
                        k.name
                    )))
                }
                Err(_) if i < n => {
                    let got = args
                        .iter()
                        .filter(|a| a.cast::<RunTensor>().is_ok())
                        .count();
                    return Err(count_err(&k.sig, &format_args!("submit {}", k.name), got));
                }
                Err(_) => scalars.push(convert::scalar(
                    &a,
                    &format_args!("submit {} scalar {}", k.name, i - n),
                )?),
            }
        }
        if count < n {
            return Err(count_err(&k.sig, &format_args!("submit {}", k.name), count));
        }
        static NONE: Geometry = Geometry::PLACEHOLDER;
        let mut inline = [(0u32, &NONE); INLINE_TENSORS];
        for (slot, t) in inline.iter_mut().zip(held.iter().flatten()) {
            let t = t.get();
            *slot = (t.arg, &t.geometry);
        }
        let spilled: Vec<(u32, &Geometry)>;
        let tensors = if count <= INLINE_TENSORS {
            &inline[..count]
        } else {
            spilled = spill
                .iter()
                .map(|t| {
                    let t = t.get();
                    (t.arg, &t.geometry)
                })
                .collect();
            &spilled[..]
        };
        let launch = self.device_launch(py, k, tensors.iter().map(|(_, g)| *g))?;
        let kref = self.kernel_ref(kernel, launch.as_ref());
        done(py, self.orch().submit(kref, tensors, &scalars))
    }

    /// Queues many tasks of one ``kernel`` in one call; returns the first task's index.
    ///
    /// Each tensor position is a run tensor (the same for every task) or ``t.views(shape,
    /// offsets)`` (one view per task); each scalar position is a scalar (the same for every
    /// task) or a 1-D array or list (one value per task). The task count is the number of rows
    /// of the per-task positions (which must agree), or ``count`` when every position is shared.
    /// The tasks are checked like single submits and run in order.
    #[pyo3(signature = (kernel, *args, count=None))]
    fn submit_many(
        &self,
        py: Python<'_>,
        kernel: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
        count: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let kernel = kernel_arg(kernel, "submit_many")?;
        let k = kernel.get();
        let n = k.sig.len();
        if args.len() < n {
            let got = args
                .iter()
                .filter(|a| a.cast::<RunTensor>().is_ok() || a.cast::<RunViews>().is_ok())
                .count();
            return Err(count_err(
                &k.sig,
                &format_args!("submit_many {}", k.name),
                got,
            ));
        }
        let items: Vec<Bound<'_, PyAny>> = args.iter().collect();
        let mut views: Vec<Bound<'_, RunViews>> = Vec::new();
        let mut kinds: Vec<(bool, u32, Geometry)> = Vec::with_capacity(n);
        for (i, a) in items[..n].iter().enumerate() {
            if let Ok(t) = a.cast::<RunTensor>() {
                let t = t.get();
                self.check(t.worker, t.run(), &t.name)?;
                kinds.push((false, t.arg, t.geometry));
            } else if let Ok(v) = a.cast::<RunViews>() {
                let g = v.get();
                self.check(g.worker, g.run, &g.name)?;
                kinds.push((true, g.arg, g.layout));
                views.push(v.clone());
            } else {
                return Err(type_err(format!(
                    "submit_many {}: tensor position {i} takes a run tensor or t.views(...), not {}",
                    k.name,
                    a.get_type().name()?
                )));
            }
        }
        let mut vi = 0;
        let slots: Vec<BatchSlot<'_>> = kinds
            .iter()
            .map(|&(per_task, arg, geometry)| {
                if per_task {
                    let v = views[vi].get();
                    vi += 1;
                    BatchSlot::Views {
                        arg,
                        geometry,
                        starts: &v.starts,
                    }
                } else {
                    BatchSlot::One { arg, geometry }
                }
            })
            .collect();
        let mut columns: Vec<Option<Vec<Value>>> = Vec::with_capacity(items.len() - n);
        let mut ones: Vec<Value> = Vec::with_capacity(items.len() - n);
        for (j, a) in items[n..].iter().enumerate() {
            let what = format_args!("submit_many {} scalar {j}", k.name);
            if a.cast::<RunTensor>().is_ok() || a.cast::<RunViews>().is_ok() {
                return Err(value_err(format!("{what}: a tensor after the scalars")));
            }
            let per_task = a.cast::<PyUntypedArray>().is_ok()
                || a.cast::<pyo3::types::PyList>().is_ok()
                || a.cast::<PyTuple>().is_ok();
            if per_task {
                ones.push(Value::Int(0));
                columns.push(Some(per_task_values(a, &what)?));
            } else {
                ones.push(convert::scalar(a, &what)?);
                columns.push(None);
            }
        }
        let scalars: Vec<BatchScalar<'_>> = columns
            .iter()
            .zip(&ones)
            .map(|(c, &one)| match c {
                Some(v) => BatchScalar::PerTask(v),
                None => BatchScalar::One(one),
            })
            .collect();
        let count = count
            .map(|c| convert::u64_arg(c, "submit_many", "count"))
            .transpose()?;
        let launch = self.device_launch(py, k, kinds.iter().map(|(_, _, g)| g))?;
        let kref = self.kernel_ref(kernel, launch.as_ref());
        // A batch of millions of tasks is recorded in parts with a check for Ctrl+C between
        // them, all or nothing (the runtime's rule).
        let r = self
            .orch()
            .submit_many_checked(kref, &slots, &scalars, count, || py.check_signals());
        logging::flush(py);
        r.map_err(|e| match e {
            RunError::Runtime(e) => PyRuntimeErr(e).into(),
            RunError::Host(e) => e,
        })
    }
}
