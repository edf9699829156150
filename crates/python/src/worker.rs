//! The native worker object: opening the device, buffers, counters, debugging state, close,
//! and the run entry point. Buffers and resident sets hold the same worker cell.

use std::sync::Arc;
use std::time::Instant;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use simpler_driver::{open_device, DeviceSpec, Op, OpenError};
use simpler_runtime::{Outcome, Staging, Worker, WorkerCell};

use crate::cell::Shared;
use crate::convert::{typed, u64_arg, ReplayArg, StagingMode, Svm, ViewPolicyArg};
use crate::errors::{done, type_err, type_name, value_err, Exc};
use crate::handles::{self, Buffer, BufferArg};
use crate::kernels::Callable;
use crate::logging;
use crate::orch::RunTensorCache;
use crate::pending::PendingRun;
use crate::report::PyRunReport;
use crate::runhost;
use crate::shutdown;

/// The native worker: a device and everything allocated on it (``simpler.Worker`` adds the
/// ``ResourceWarning`` of an unclosed worker).
#[pyclass(module = "simpler._core", name = "Worker", subclass, frozen, weakref)]
pub struct PyWorker {
    pub cell: Arc<Shared>,
    /// The run tensors of the worker's last run, handed out again where unshared.
    run_tensors: RunTensorCache,
}

/// The operations `inject_fault` takes, from the driver's one table.
fn op_names() -> String {
    Op::ALL
        .iter()
        .map(|o| o.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A worker's options, converted and checked (nothing opened).
struct Options {
    spec: DeviceSpec,
    staging: Staging,
    view_policy: Option<ViewPolicyArg>,
}

/// The keyword options of ``simpler.Worker`` (also what ``check_worker_options`` checks).
#[allow(clippy::too_many_arguments)]
fn options(
    platform: Option<&Bound<'_, PyAny>>,
    staging: Option<StagingMode>,
    svm: Option<Svm>,
    poison: Option<&Bound<'_, PyAny>>,
    capacity: Option<&Bound<'_, PyAny>>,
    device_id: Option<&Bound<'_, PyAny>>,
    malloc_policy: Option<&Bound<'_, PyAny>>,
    reuse_addresses: Option<&Bound<'_, PyAny>>,
    model: Option<&Bound<'_, PyAny>>,
    view_policy: Option<ViewPolicyArg>,
) -> PyResult<Options> {
    let platform = match platform {
        None => "sim".to_owned(),
        Some(platform) => platform
            .cast::<PyString>()
            .map_err(|_| {
                type_err(format!(
                    "platform must be a string, not {}",
                    type_name(platform)
                ))
            })?
            .to_cow()?
            .into_owned(),
    };
    let device_id = device_id
        .map(|d| {
            u64_arg(d, "Worker", "device_id").and_then(|v| {
                u32::try_from(v)
                    .map_err(|_| value_err(format!("Worker: device_id {v} is out of range")))
            })
        })
        .transpose()?;
    let spec = DeviceSpec {
        platform,
        svm: svm.map(|s| s.0),
        poison: typed(poison, "Worker", "poison", "a bool")?,
        capacity: capacity
            .map(|c| u64_arg(c, "Worker", "capacity"))
            .transpose()?,
        device_id,
        malloc_policy: typed(malloc_policy, "Worker", "malloc_policy", "a string")?,
        reuse_addresses: typed(reuse_addresses, "Worker", "reuse_addresses", "a bool")?,
        model: typed(model, "Worker", "model", "a string")?,
    };
    spec.validate().map_err(open_err)?;
    Ok(Options {
        spec,
        staging: staging.map_or(Staging::Arena, |s| s.0),
        view_policy,
    })
}

fn open_err(e: OpenError) -> PyErr {
    match e {
        OpenError::Invalid(m) => value_err(m),
        other => Exc::PlatformUnavailable.err(other.to_string()),
    }
}

/// Checks worker options (the keywords of ``simpler.Worker``) against the platform without
/// opening anything: raises what ``Worker(...)`` would raise for them (``ArgumentError``,
/// ``ArgumentTypeError``); a missing vendor library is not checked.
#[pyfunction]
#[pyo3(signature = (platform=None, **options))]
pub fn check_worker_options(
    platform: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    const KNOWN: [&str; 9] = [
        "staging",
        "svm",
        "poison",
        "capacity",
        "device_id",
        "malloc_policy",
        "reuse_addresses",
        "model",
        "view_policy",
    ];
    let mut given: [Option<Bound<'_, PyAny>>; 9] = Default::default();
    for (k, v) in options.into_iter().flat_map(|d| d.iter()) {
        let k: String = k.extract()?;
        let i = KNOWN.iter().position(|n| *n == k).ok_or_else(|| {
            type_err(format!(
                "Worker: unknown option '{k}' (options: {})",
                KNOWN.join(", ")
            ))
        })?;
        given[i] = Some(v).filter(|v| !v.is_none());
    }
    let [staging, svm, poison, capacity, device_id, malloc_policy, reuse, model, view_policy] =
        given;
    self::options(
        platform,
        staging.map(|v| v.extract()).transpose()?,
        svm.map(|v| v.extract()).transpose()?,
        poison.as_ref(),
        capacity.as_ref(),
        device_id.as_ref(),
        malloc_policy.as_ref(),
        reuse.as_ref(),
        model.as_ref(),
        view_policy.map(|v| v.extract()).transpose()?,
    )
    .map(|_| ())
}

#[pymethods]
impl PyWorker {
    #[new]
    #[allow(clippy::too_many_arguments)] // the keyword options of `simpler.Worker`
    #[pyo3(signature = (platform=None, *, staging=None, svm=None, poison=None, capacity=None, device_id=None, malloc_policy=None, reuse_addresses=None, model=None, view_policy=None))]
    fn new(
        py: Python<'_>,
        platform: Option<&Bound<'_, PyAny>>,
        staging: Option<StagingMode>,
        svm: Option<Svm>,
        poison: Option<&Bound<'_, PyAny>>,
        capacity: Option<&Bound<'_, PyAny>>,
        device_id: Option<&Bound<'_, PyAny>>,
        malloc_policy: Option<&Bound<'_, PyAny>>,
        reuse_addresses: Option<&Bound<'_, PyAny>>,
        model: Option<&Bound<'_, PyAny>>,
        view_policy: Option<ViewPolicyArg>,
    ) -> PyResult<Self> {
        let o = options(
            platform,
            staging,
            svm,
            poison,
            capacity,
            device_id,
            malloc_policy,
            reuse_addresses,
            model,
            view_policy,
        )?;
        let dev = shutdown::without_gil(py, || open_device(&o.spec));
        logging::flush(py);
        let dev = dev.map_err(open_err)?;
        let mut worker = Worker::new(dev, o.staging, o.spec.poison.unwrap_or(true));
        if let Some(p) = o.view_policy {
            worker.set_view_policy(p.0);
        }
        let id = o.spec.device_id.unwrap_or(0);
        Ok(PyWorker {
            cell: Arc::new(Shared::new(worker, &o.spec.platform, id)),
            run_tensors: RunTensorCache::default(),
        })
    }

    /// ``"sim"``, ``"ascend"`` or ``"cuda"``.
    #[getter]
    fn platform(&self) -> &str {
        &self.cell.platform
    }

    /// The device id the worker was opened on.
    #[getter]
    fn device_id(&self) -> u32 {
        self.cell.device_id
    }

    /// ``"arena"`` or ``"fresh"``.
    #[getter]
    fn staging(&self) -> &'static str {
        self.cell.with(false, |w| w.staging().name())
    }

    /// The host-view policy of allocations without a hint.
    #[getter]
    fn view_policy(&self) -> &'static str {
        self.cell.with(false, |w| w.view_policy().name())
    }

    /// The cost model the device prices its operations with (sim; the primary one, the first
    /// named, when there are several), or ``None``.
    #[getter]
    fn model(&self) -> Option<&'static str> {
        self.cell.dev.cost_model().map(|m| m.name)
    }

    /// Whether runs time the device's part of execute with events recorded around each batch
    /// of launches: ``RunReport.counters["device_ns"]`` (0 on devices that cannot time: sim,
    /// ascend). Off by default (``SIMPLER_DEVICE_TIMING=1`` turns it on for new workers);
    /// settable.
    #[getter]
    fn device_timing(&self) -> bool {
        self.cell.with(false, |w| w.device_timing())
    }

    #[setter]
    fn set_device_timing(&self, on: bool) {
        self.cell.with(false, |w| w.set_device_timing(on));
    }

    /// Whether a warm round reuses the launch plan of an earlier round that recorded exactly
    /// the same tasks over the same allocations: ``"graphs"`` (the default: reuse, and on cuda
    /// capture the plan's launches into a CUDA graph at its first reuse and replay it with one
    /// graph launch a round), ``"plans"`` (reuse with plain launches: no dependence levels, task
    /// rows or row upload; ``RunReport.counters["plan_reuses"]`` is 1) or ``"off"`` (every round
    /// plans). ``SIMPLER_REPLAY`` sets it for new workers; settable between runs.
    #[getter]
    fn replay(&self) -> &'static str {
        self.cell.with(false, |w| w.replay().name())
    }

    #[setter]
    fn set_replay(&self, mode: ReplayArg) {
        self.cell.with(false, |w| w.set_replay(mode.0));
    }

    /// Launch plans the worker keeps for warm rounds (at most ``PLANS_KEPT``, 4).
    #[getter]
    fn plans_kept(&self) -> usize {
        self.cell.with(false, |w| w.plans_kept())
    }

    /// Whether ``close`` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.cell.with(false, |w| w.is_closed())
    }

    /// Releases everything (resident sets, buffers, the arena; views first), then the device.
    ///
    /// Idempotent. Returns what it found (``user_buffers``, ``resident_sets`` still live and
    /// freed by it; ``leaked_allocations`` / ``leaked_mappings`` the driver still held after
    /// that; ``errors``, each also logged), or ``None`` when the worker was closed already.
    /// Raises ``StateError`` (and closes nothing) while another library may still use this
    /// worker's memory: a live DLPack export, or a tensor whose ``__cuda_array_interface__``
    /// was read and that is still alive.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        if self.closed() {
            return Ok(None);
        }
        let s = done(py, self.cell.with(true, |w| w.close_checked()))?;
        let errors: Vec<String> = s
            .errors
            .iter()
            .map(|e| e.to_string())
            .chain(s.device.errors.iter().map(|e| e.to_string()))
            .collect();
        for e in &errors {
            log::error!("worker close: {e}");
        }
        logging::flush(py);
        let d = PyDict::new(py);
        d.set_item("user_buffers", s.user_buffers)?;
        d.set_item("resident_sets", s.resident_sets)?;
        d.set_item("leaked_allocations", s.device.leaked_allocations)?;
        d.set_item("leaked_mappings", s.device.leaked_mappings)?;
        d.set_item("errors", errors)?;
        Ok(Some(d))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the worker. When the block raised already and the close is refused (a live
    /// export), the refusal is a ``RuntimeWarning`` and the block's exception goes through.
    #[pyo3(signature = (*exc_info))]
    fn __exit__(&self, py: Python<'_>, exc_info: &Bound<'_, PyTuple>) -> PyResult<()> {
        match self.close(py) {
            Err(e) if exc_info.get_item(1).is_ok_and(|x| !x.is_none()) => {
                let msg = format!("leaving the worker's block: {}", e.value(py));
                PyErr::warn(
                    py,
                    &py.get_type::<pyo3::exceptions::PyRuntimeWarning>(),
                    &std::ffi::CString::new(msg)?,
                    1,
                )
            }
            r => r.map(|_| ()),
        }
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "a Worker owns a device and cannot be pickled",
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "Worker(platform={:?}, staging={:?})",
            self.cell.platform,
            self.staging()
        )
    }

    // -- buffers --

    /// Allocates a device buffer of ``nbytes`` (> 0).
    fn malloc(&self, py: Python<'_>, nbytes: &Bound<'_, PyAny>) -> PyResult<Buffer> {
        let n = u64_arg(nbytes, "malloc", "size")?;
        let b = done(py, self.cell.with(true, |w| w.malloc(n)))?;
        Ok(Buffer::new(self.cell.clone(), b, n))
    }

    /// Frees a buffer from ``malloc`` (its host view first).
    fn free(&self, py: Python<'_>, buf: BufferArg) -> PyResult<()> {
        let b = buf.buf();
        done(py, self.cell.with(true, |w| w.free(b)))
    }

    /// Copies a C-contiguous array into ``buf`` at byte ``offset``.
    #[pyo3(signature = (buf, arr, offset=None))]
    fn copy_to(
        &self,
        py: Python<'_>,
        buf: BufferArg,
        arr: &Bound<'_, PyAny>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let offset = handles::zero_or(py, offset);
        handles::copy_to(py, &self.cell, &buf, arr, &offset)
    }

    /// Fills a C-contiguous, writable array from ``buf`` at byte ``offset``.
    #[pyo3(signature = (arr, buf, offset=None))]
    fn copy_from(
        &self,
        py: Python<'_>,
        arr: &Bound<'_, PyAny>,
        buf: BufferArg,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let offset = handles::zero_or(py, offset);
        handles::copy_from(py, &self.cell, arr, &buf, &offset)
    }

    /// Orders the worker after another library's writes from ``stream``: its next run, copy,
    /// host-view refresh or free waits (on the device, not the host) for the work queued on
    /// ``stream`` so far. ``stream`` is a CUDA stream: an int handle (1: legacy default, 2: the
    /// calling thread's per-thread default), a ``torch.cuda.Stream``, a ``cupy.cuda.Stream`` or
    /// any object with ``__cuda_stream__``. Writes on the legacy default stream (torch's and
    /// CuPy's unless told otherwise) are ordered without it while an export is live; a side
    /// stream needs this call. Nothing to do on sim and ascend.
    fn wait_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = crate::exporting::stream_handle(stream)?;
        done(py, self.cell.with(true, |w| w.wait_stream(s)))
    }

    /// ``"mapping"``, ``"cached"`` or ``"mirror"`` once a host view of the allocation exists,
    /// else ``None``.
    fn host_view_info(&self, py: Python<'_>, buf: BufferArg) -> PyResult<Option<&'static str>> {
        let b = buf.buf();
        let kind = done(py, self.cell.with(false, |w| w.host_view_info(b)))?;
        Ok(kind.filter(|k| *k != "refused"))
    }

    /// Frees the retained staging arena and scratch pool (re-created when next needed).
    fn trim_staging(&self, py: Python<'_>) -> PyResult<()> {
        done(py, self.cell.with(true, |w| w.trim_staging()))
    }

    // -- observability --

    /// Cumulative driver counters (see ``docs/concepts.md``).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = shutdown::without_gil(py, || self.cell.dev.stats());
        let d = PyDict::new(py);
        for (k, v) in s.entries() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// What the worker holds now, for tests and debugging: ``arena`` (``(device address,
    /// bytes)`` of the staging arena, or ``None``), ``scratch_chunks`` (the scratch pool's
    /// ``(address, bytes)``), ``views`` (host views of allocations by kind: ``mapped``,
    /// ``mirrored``, ``refused``), ``busy`` (a run in progress), ``closed``, and ``handles``
    /// (the buffers, tensors, resident sets and run handles that hold the worker).
    fn debug_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (arena, chunks, views, busy, closed) = self.cell.with(false, |w| {
            (
                w.arena().map(|(p, n)| (p.0, n)),
                w.scratch_chunks()
                    .iter()
                    .map(|(p, n)| (p.0, *n))
                    .collect::<Vec<_>>(),
                w.view_counts(),
                w.is_busy(),
                w.is_closed(),
            )
        });
        let d = PyDict::new(py);
        d.set_item("arena", arena)?;
        d.set_item("scratch_chunks", chunks)?;
        let v = PyDict::new(py);
        v.set_item("mapped", views.0)?;
        v.set_item("mirrored", views.1)?;
        v.set_item("refused", views.2)?;
        d.set_item("views", v)?;
        d.set_item("busy", busy)?;
        d.set_item("closed", closed)?;
        // Buffers, tensors, resident sets and run handles hold the worker too.
        d.set_item("handles", Arc::strong_count(&self.cell) - 1)?;
        Ok(d)
    }

    /// Recent driver calls as ``(op, device address, bytes, code, phase)``, oldest first.
    ///
    /// ``phase`` is what the worker was doing: ``buffer``, ``resident_add``, ``release``,
    /// ``bind``, ``orchestrate``, ``execute``, ``copy_back``, ``cleanup`` or ``close``.
    fn call_log(&self, py: Python<'_>) -> Vec<(&'static str, u64, u64, i64, &'static str)> {
        shutdown::without_gil(py, || self.cell.dev.call_log())
            .iter()
            .map(|c| (c.op.name(), c.addr, c.bytes, c.code, c.phase))
            .collect()
    }

    /// Makes the ``nth`` next call of ``op`` fail with ``code`` (sim and the fake vendor
    /// libraries); ``op`` is one of the driver operations (``alloc``, ``free``, ``h2d``,
    /// ``d2h``, ``map``, ``unmap``, ``memset``, ``pin``, ``unpin``, and on cuda ``module``,
    /// ``launch``, ``sync``). The fault fires before the vendor call: it poisons nothing.
    #[pyo3(signature = (op, nth=None, code=None))]
    fn inject_fault(
        &self,
        py: Python<'_>,
        op: &Bound<'_, PyAny>,
        nth: Option<&Bound<'_, PyAny>>,
        code: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let op: String = typed(Some(op), "inject_fault", "op", "a string")?.unwrap_or_default();
        let code: Option<i64> = typed(code, "inject_fault", "code", "an int")?;
        let o = Op::parse(&op).ok_or_else(|| {
            value_err(format!("unknown driver operation '{op}' ({})", op_names()))
        })?;
        let nth = match nth {
            Some(n) => u64_arg(n, "inject_fault", "nth")?,
            None => 1,
        };
        // The device's lock may be held by a thread waiting for the device: not with the GIL.
        shutdown::without_gil(py, || self.cell.dev.inject_fault(o, nth, code))
            .map_err(|e| value_err(e.to_string()))
    }

    /// Drops pending injected faults.
    fn clear_faults(&self, py: Python<'_>) {
        shutdown::without_gil(py, || self.cell.dev.clear_faults());
    }

    // -- running --

    /// Runs ``callable`` once over ``args``: tensors in signature order (numpy arrays are
    /// host-staged, ``DeviceTensor`` are resident), then scalars; or built args
    /// (``TaskArgsBuilder``, ``ResidentTaskArgs.build_args``). Returns the ``RunReport``.
    ///
    /// Whatever is raised during the run (by the orchestration, a kernel, or a ``Ctrl+C``),
    /// the run is finished and cleaned up before the exception reaches the caller, and the
    /// worker is ready for the next run.
    ///
    /// With ``wait=False`` the call returns a ``PendingRun`` once the run's device work is
    /// enqueued, without waiting for the device, so the next run's bind and orchestration
    /// overlap it; ``PendingRun.wait()`` returns the report. A run that stages an argument, or
    /// launches no device code, waits as usual (its ``PendingRun`` is not pending). See
    /// ``docs/concepts.md`` for what waits for a pending run.
    #[pyo3(signature = (callable, args, wait = true))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        callable: &Bound<'py, PyAny>,
        args: &Bound<'py, PyAny>,
        wait: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let started = Instant::now();
        let callable = callable.cast::<Callable>().map_err(|_| {
            type_err(format!(
                "run: expected a Callable, got {}",
                type_name(callable)
            ))
        })?;
        let named = runhost::named_values(args)?;
        let outcome = runhost::run(
            py,
            &self.cell,
            &self.run_tensors,
            callable,
            named,
            started,
            wait,
        );
        logging::flush(py);
        let name = &callable.get().name;
        match outcome? {
            Outcome::Done(report) => {
                Ok(Bound::new(py, PyRunReport::new(*report, name))?.into_any())
            }
            Outcome::Pending(run) => {
                Ok(Bound::new(py, PendingRun::new(self.cell.clone(), run, name))?.into_any())
            }
        }
    }
}
