//! The `Device` trait: what the runtime needs from an accelerator driver.

use std::fmt;
use std::sync::Arc;

use crate::model::PerModel;
use crate::{CostModel, DeviceError, HostMem, HostMemError, Ledger, Op};

/// A device address. Never a host pointer: nothing outside a driver dereferences it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevPtr(pub u64);

impl fmt::Display for DevPtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Device code loaded into a device's context (a CUDA module). Valid until the device closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModuleId(pub u64);

/// An entry point of a loaded module (a CUDA function). Valid until the device closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FuncId(pub u64);

/// An executable graph of captured launches ([`Device::capture`]). Valid until destroyed or
/// the device closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub u64);

/// The geometry of one launch: grid and block dimensions (each >= 1) and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

/// One launch of [`Device::launch_all`]: the function, its geometry and one 64-bit value per
/// kernel parameter.
#[derive(Debug, Clone, Copy)]
pub struct LaunchCall<'a> {
    pub func: FuncId,
    pub dims: LaunchDims,
    pub params: &'a [u64],
}

/// What a launch of one function may ask for (CUDA: `cuFuncGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuncLimits {
    /// Threads per block the function can be launched with (its `__launch_bounds__`, or what
    /// its register use leaves).
    pub max_threads: u32,
    /// Static shared memory the function declares, per block.
    pub static_shared: u32,
    /// Dynamic shared memory a launch may ask for now (48 KiB until the function opts in).
    pub dynamic_shared: u32,
    /// The most dynamic shared memory the function may opt in to on this device (the device's
    /// opt-in limit per block, less the static part).
    pub dynamic_shared_optin: u32,
    /// Registers per thread and local memory (spills, stack) per thread, where known.
    pub registers: u32,
    pub local_bytes: u32,
}

impl Default for FuncLimits {
    fn default() -> Self {
        FuncLimits {
            max_threads: 1024,
            static_shared: 0,
            dynamic_shared: 48 * 1024,
            dynamic_shared_optin: 48 * 1024,
            registers: 0,
            local_bytes: 0,
        }
    }
}

/// The driver's answer to `map_host`.
#[derive(Debug, Clone)]
pub enum MapGrant {
    /// Device byte `ptr + i` is host byte `offset + i` of `mem`, coherently, until `unmap_host`.
    Mapped { mem: Arc<HostMem>, offset: usize },
    /// The driver refused this allocation (e.g. ordinary pages on a 64 KiB-page host). `code` is
    /// the vendor's answer (0 for a "success" that returned no pointer, as the toolkit stub does).
    Refused { code: i64, reason: String },
}

/// Cumulative driver counters (`docs/concepts.md`, "Report counters"). Every backend keeps them the same way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub live_allocations: u64,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    pub h2d_calls: u64,
    pub h2d_bytes: u64,
    pub d2h_calls: u64,
    pub d2h_bytes: u64,
    pub maps: u64,
    pub map_refusals: u64,
    pub unmaps: u64,
    pub live_mappings: u64,
    pub memset_calls: u64,
    pub memset_bytes: u64,
    /// Mirrors page-locked (`alloc_mirror`) and unlocked (`free_mirror`, `close`).
    pub pins: u64,
    pub unpins: u64,
    /// Bytes of mirrors page-locked now.
    pub pinned_bytes: u64,
    /// Device-code launches (each may run many tasks), modules loaded, and host waits on the
    /// worker's stream.
    pub launches: u64,
    pub module_loads: u64,
    pub syncs: u64,
    /// Modeled nanoseconds of every operation so far (sim with a cost model; else 0).
    pub modeled_ns: u64,
}

impl Stats {
    /// `(name, value)` pairs, in the documented order.
    pub fn entries(&self) -> [(&'static str, u64); 22] {
        [
            ("live_allocations", self.live_allocations),
            ("live_bytes", self.live_bytes),
            ("peak_bytes", self.peak_bytes),
            ("allocs", self.allocs),
            ("frees", self.frees),
            ("h2d_calls", self.h2d_calls),
            ("h2d_bytes", self.h2d_bytes),
            ("d2h_calls", self.d2h_calls),
            ("d2h_bytes", self.d2h_bytes),
            ("maps", self.maps),
            ("map_refusals", self.map_refusals),
            ("unmaps", self.unmaps),
            ("live_mappings", self.live_mappings),
            ("memset_calls", self.memset_calls),
            ("memset_bytes", self.memset_bytes),
            ("pins", self.pins),
            ("unpins", self.unpins),
            ("pinned_bytes", self.pinned_bytes),
            ("launches", self.launches),
            ("module_loads", self.module_loads),
            ("syncs", self.syncs),
            ("modeled_ns", self.modeled_ns),
        ]
    }
}

/// One driver call, as recorded in the call log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub op: Op,
    pub addr: u64,
    pub bytes: u64,
    /// 0 on success, else the driver's code.
    pub code: i64,
    /// What its caller was doing (the runtime's phase: `"bind"`, `"execute"`, `"close"`, ...),
    /// as last set with [`Device::set_phase`]; `""` before any.
    pub phase: &'static str,
}

/// What closing a device found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Allocations still live at close, which close freed.
    pub leaked_allocations: u64,
    pub leaked_bytes: u64,
    /// Mappings still live at close, which close removed.
    pub leaked_mappings: u64,
    /// Frees or unmaps that failed during close.
    pub errors: Vec<DeviceError>,
}

/// `Device::copy_h2d_async` as a synchronous copy of the `len` bytes at `offset` of `src`.
pub(crate) fn copy_at_once<D: Device + ?Sized>(
    dev: &D,
    dst: DevPtr,
    src: &HostMem,
    offset: usize,
    len: usize,
) -> Result<(), DeviceError> {
    src.with_slice(offset, len, |s| dev.copy_h2d(dst, s))
        .unwrap_or_else(|e| Err(host_source_error(dst, len, e)))
}

/// The error of a copy whose host source cannot be read (a range past the block, a revoked
/// mapping), refused before any vendor call.
pub(crate) fn host_source_error(dst: DevPtr, len: usize, e: HostMemError) -> DeviceError {
    DeviceError::new(Op::H2d, "copy_h2d_async", -1, "host source", e.to_string())
        .before_call()
        .at(dst.0)
        .sized(len as u64)
}

/// An accelerator driver. Implementations are `Send + Sync`; they serialize internally.
pub trait Device: Send + Sync + fmt::Debug {
    /// `"sim"`, `"ascend"`, `"cuda"`.
    fn platform(&self) -> &'static str;

    /// Allocates `bytes` (> 0) of device memory.
    fn alloc(&self, bytes: u64) -> Result<DevPtr, DeviceError>;

    /// Frees an allocation returned by `alloc`. Its mappings must have been removed first.
    fn free(&self, ptr: DevPtr) -> Result<(), DeviceError>;

    /// Copies `src` to device address `dst`.
    fn copy_h2d(&self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError>;

    /// Queues a copy of the `len` bytes at `offset` of `src` to device address `dst` behind the
    /// work already queued on the worker's stream, and returns without waiting for it: from
    /// page-locked memory (`alloc_mirror`) the device reads the bytes when the copy runs. The
    /// device keeps `src` alive until it next waits for its stream (`synchronize`, or a copy);
    /// the caller must not write those bytes before then. The default copies at once.
    fn copy_h2d_async(
        &self,
        dst: DevPtr,
        src: &Arc<HostMem>,
        offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        copy_at_once(self, dst, src, offset, len)
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`.
    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError>;

    /// Sets `bytes` bytes at device address `dst` to `value` (a device memset).
    fn fill(&self, dst: DevPtr, bytes: u64, value: u8) -> Result<(), DeviceError>;

    /// Asks for a host mapping of `bytes` at `ptr`. A refusal is an answer (`MapGrant::Refused`),
    /// not an error; errors are for calls that are invalid (mapping twice, an unknown address).
    fn map_host(&self, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError>;

    /// Removes the mapping established at `ptr`.
    fn unmap_host(&self, ptr: DevPtr) -> Result<(), DeviceError>;

    /// Host memory for a mirror of a device allocation (`len` bytes, zeroed). Drivers that can
    /// page-lock host memory do (CUDA: `cuMemHostRegister_v2`), so copies into the mirror run at
    /// pinned bandwidth; a refused page-lock leaves ordinary memory, which works the same.
    /// Errors are host memory exhaustion only. Give it back with [`Device::free_mirror`].
    fn alloc_mirror(&self, len: usize) -> Result<Arc<HostMem>, HostMemError> {
        Ok(Arc::new(HostMem::new(len, 0)?))
    }

    /// Undoes what [`Device::alloc_mirror`] did to `mem` (unlocks its pages) before the caller
    /// drops it. On failure the driver keeps the memory alive (and retries at `close`).
    fn free_mirror(&self, _mem: &Arc<HostMem>) -> Result<(), DeviceError> {
        Ok(())
    }

    /// The cost models the device prices its operations with (sim with `model=`), the
    /// primary one first; empty on real hardware, which is measured instead.
    fn cost_models(&self) -> &[CostModel] {
        &[]
    }

    /// The primary cost model (the first of [`Device::cost_models`]).
    fn cost_model(&self) -> Option<&CostModel> {
        self.cost_models().first()
    }

    /// Modeled nanoseconds accrued so far, by phase label (see [`Device::set_phase`]), one
    /// entry per cost model; empty without a cost model.
    fn modeled(&self) -> Vec<(&'static str, PerModel)> {
        Vec::new()
    }

    /// Charges `ns` modeled nanoseconds (one entry per cost model) of work the runtime prices
    /// itself (reads and writes through a mapping, bulk reads out of one, kernel execution) to
    /// the phase labelled `phase`, so the cumulative `modeled_ns` counter and a run's modeled
    /// phases agree. Nothing without a cost model.
    fn charge_modeled(&self, _phase: &'static str, _ns: PerModel) {}

    /// The memory a kernel running "on the device" sees at `ptr` (`bytes` long), when the device
    /// is host memory (sim). `None` on real hardware, where kernels run on the host over copies.
    fn kernel_memory(&self, _ptr: DevPtr, _bytes: u64) -> Option<(Arc<HostMem>, usize)> {
        None
    }

    /// Whether [`Device::kernel_memory`] answers (device memory is host memory). When false,
    /// kernels run over host copies, and each task moves bytes through the driver.
    fn has_kernel_memory(&self) -> bool {
        false
    }

    /// Whether the device runs device code ([`Device::load_module`], [`Device::launch`]).
    fn runs_device_code(&self) -> bool {
        false
    }

    /// The device's compute capability `(major, minor)`, which device code is compiled for.
    fn compute_capability(&self) -> Result<(u32, u32), DeviceError> {
        Err(self.no_device_code(Op::Module))
    }

    /// Loads a device-code image (PTX text, NUL-terminated, or a cubin) into the device's
    /// context. Modules live until the device closes.
    fn load_module(&self, _image: &[u8]) -> Result<ModuleId, DeviceError> {
        Err(self.no_device_code(Op::Module))
    }

    /// The entry point `entry` of a loaded module.
    fn function(&self, _module: ModuleId, _entry: &str) -> Result<FuncId, DeviceError> {
        Err(self.no_device_code(Op::Module))
    }

    /// Enqueues one launch of `func` on the worker's stream, with one 64-bit value per kernel
    /// parameter. Asynchronous: a fault of the kernel surfaces at the next synchronizing call.
    fn launch(&self, _func: FuncId, _dims: LaunchDims, _params: &[u64]) -> Result<(), DeviceError> {
        Err(self.no_device_code(Op::Launch))
    }

    /// Enqueues `launches` in order on the worker's stream with one context bind for all of
    /// them (each is still checked, counted and logged as [`Device::launch`]). With `timed`,
    /// events recorded before the first launch and after the last measure the group's device
    /// time ([`Device::take_device_time`]). On failure: the index of the launch that failed
    /// (those before it are enqueued) and its error.
    #[allow(clippy::result_large_err)] // the failing launch's index beside the driver's error
    fn launch_all(
        &self,
        launches: &[LaunchCall<'_>],
        _timed: bool,
    ) -> Result<(), (usize, DeviceError)> {
        for (i, l) in launches.iter().enumerate() {
            self.launch(l.func, l.dims, l.params).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Whether the device captures launches into a graph it replays with one call
    /// ([`Device::capture`]; CUDA with the graph entry points).
    fn captures_graphs(&self) -> bool {
        false
    }

    /// Captures `launches`, in order, into an executable graph without running any of them
    /// (CUDA: stream capture on the worker's stream, then instantiation). A replay
    /// ([`Device::launch_graph`]) launches exactly these, with these parameter values: what
    /// they point at must still hold what the launches should read when the replay runs.
    fn capture(&self, _launches: &[LaunchCall<'_>]) -> Result<GraphId, DeviceError> {
        Err(self.no_device_code(Op::Launch))
    }

    /// Enqueues the launches of `graph` on the worker's stream with one call; `timed` as in
    /// [`Device::launch_all`].
    fn launch_graph(&self, _graph: GraphId, _timed: bool) -> Result<(), DeviceError> {
        Err(self.no_device_code(Op::Launch))
    }

    /// Destroys `graph` (after any replay of it that is enqueued; the driver keeps it alive
    /// until then).
    fn destroy_graph(&self, _graph: GraphId) -> Result<(), DeviceError> {
        Err(self.no_device_code(Op::Launch))
    }

    /// The device time of the launch groups timed since the last call (the sum, in
    /// nanoseconds, of each group's span between its events), once the stream has run them;
    /// `None` where nothing was timed or the device cannot time.
    fn take_device_time(&self) -> Result<Option<u64>, DeviceError> {
        Ok(None)
    }

    /// The limits a launch of `func` must respect.
    fn function_limits(&self, _func: FuncId) -> Result<FuncLimits, DeviceError> {
        Ok(FuncLimits::default())
    }

    /// Lets launches of `func` ask for up to `bytes` of dynamic shared memory (CUDA:
    /// `cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`), at most the function's
    /// `dynamic_shared_optin`.
    fn allow_dynamic_shared(&self, _func: FuncId, _bytes: u32) -> Result<(), DeviceError> {
        Err(self.no_device_code(Op::Launch))
    }

    /// Waits until everything enqueued on the worker's stream has run; reports a device fault.
    /// Copies to and from the host synchronize themselves.
    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Waits until all work of the device's context has run, the worker's stream and any other
    /// (work a library enqueued on its own streams over the worker's memory, say).
    fn synchronize_device(&self) -> Result<(), DeviceError> {
        self.synchronize()
    }

    /// The sticky fault that made the device unusable (see the CUDA backend), if any: every
    /// call fails with it until the device closes.
    fn fault(&self) -> Option<i64> {
        None
    }

    /// The vendor driver's version `(major, minor)` (CUDA: `cuDriverGetVersion`), where known.
    fn driver_version(&self) -> Option<(u32, u32)> {
        None
    }

    /// The worker's stream (a CUDA `CUstream` handle), where the device has one.
    fn stream_handle(&self) -> Option<u64> {
        None
    }

    /// Makes `consumer` (another stream of the same device: a handle, or CUDA's 1 = legacy
    /// default / 2 = per-thread default) wait for the work enqueued on the worker's stream so
    /// far, without blocking the host (an event). Nothing to do where there is no stream.
    fn order_stream(&self, _consumer: u64) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Makes the worker's stream wait for the work queued so far on `producer` (another stream
    /// of the device's context: a handle, or CUDA's 1 = legacy default / 2 = the calling
    /// thread's per-thread default), without blocking the host (an event): what another
    /// library wrote there is then ordered before the worker's next copy, launch or memset.
    /// Nothing to do where there is no stream.
    fn wait_for_stream(&self, _producer: u64) -> Result<(), DeviceError> {
        Ok(())
    }

    /// The error of a device-code call on a device that does not run device code.
    fn no_device_code(&self, op: Op) -> DeviceError {
        DeviceError::new(
            op,
            "(no device code)",
            crate::codes::NOT_SUPPORT,
            "NOT_SUPPORTED",
            format!("the {} platform does not run device code", self.platform()),
        )
        .before_call()
    }

    /// Runs `f` on the device's call ledger (its counters, call log and injected faults) under
    /// the device's lock: what [`Device::stats`], [`Device::call_log`], [`Device::set_phase`],
    /// [`Device::inject_fault`] and [`Device::clear_faults`] read and change, for every backend.
    fn with_ledger(&self, f: &mut dyn FnMut(&mut Ledger));

    /// The code an injected fault of `op` fails with when none is given: a failure the driver
    /// returns for that call.
    fn default_fault_code(&self, op: Op) -> i64;

    /// Cumulative counters.
    fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        self.with_ledger(&mut |l| stats = l.stats());
        stats
    }

    /// The call log (most recent calls; see the backend for its bound).
    fn call_log(&self) -> Vec<CallRecord> {
        let mut log = Vec::new();
        self.with_ledger(&mut |l| log = l.log());
        log
    }

    /// Labels the calls that follow in the call log (the runtime's phase), so a log can be read
    /// phase by phase.
    fn set_phase(&self, phase: &'static str) {
        self.with_ledger(&mut |l| l.set_phase(phase));
    }

    /// Makes the `nth` next call of `op` fail with `code` (the driver's default when `None`,
    /// [`Device::default_fault_code`]).
    fn inject_fault(&self, op: Op, nth: u64, code: Option<i64>) -> Result<(), DeviceError> {
        let code = code.unwrap_or_else(|| self.default_fault_code(op));
        let mut done = Ok(());
        self.with_ledger(&mut |l| done = l.inject(op, nth, code));
        done
    }

    /// Removes pending injected faults.
    fn clear_faults(&self) {
        self.with_ledger(&mut |l| l.clear_faults());
    }

    /// Frees every live allocation (removing its mappings first) and reports what it found.
    fn close(&self) -> CloseReport;

    /// Whether the device was closed and refuses every call since (the vendor drivers after
    /// [`Device::close`]; sim stays usable, its memory being the process's own).
    fn closed(&self) -> bool;
}
