//! The run report: how long each phase took and what the run did.

/// Phase durations in nanoseconds. Together they cover the whole native run, from the call's
/// entry (argument conversion is part of `bind`) to the end of `cleanup` (which includes freeing
/// the run's task list).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Phases {
    pub bind: u64,
    pub orchestrate: u64,
    pub execute: u64,
    pub copy_back: u64,
    pub cleanup: u64,
}

impl Phases {
    /// The phase names, in phase order: the keys of a report's phases everywhere.
    pub const NAMES: [&'static str; 5] = ["bind", "orchestrate", "execute", "copy_back", "cleanup"];

    /// `(name, nanoseconds)` pairs, in phase order.
    pub fn entries(&self) -> [(&'static str, u64); 5] {
        let [b, o, e, c, u] = Self::NAMES;
        [
            (b, self.bind),
            (o, self.orchestrate),
            (e, self.execute),
            (c, self.copy_back),
            (u, self.cleanup),
        ]
    }

    /// Every phase but execute: the cost of getting arguments to and from the device.
    pub fn dispatch(&self) -> u64 {
        self.bind + self.orchestrate + self.copy_back + self.cleanup
    }

    /// The whole round: the dispatch path plus execute.
    pub fn round(&self) -> u64 {
        self.dispatch() + self.execute
    }
}

/// Per-run counters (documented in `docs/concepts.md`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub staged_tensors: u64,
    pub staged_bytes: u64,
    pub copied_back_bytes: u64,
    pub device_mallocs: u64,
    pub device_frees: u64,
    pub resident_tensors: u64,
    pub views_mapped: u64,
    pub views_mirrored: u64,
    pub mirror_refreshes: u64,
    pub mirror_refresh_bytes: u64,
    pub orch_reads: u64,
    pub orch_writes: u64,
    pub tasks: u64,
    pub submits: u64,
    pub staged_view_copies: u64,
    pub scratch_tensors: u64,
    pub scratch_bytes: u64,
    pub poisoned_bytes: u64,
    pub views_cached: u64,
    pub cache_fills: u64,
    pub cache_fill_bytes: u64,
    pub mapped_reads: u64,
    pub mapped_writes: u64,
    /// Launches of device code, the tasks they ran, and tasks that ran on the host over copies
    /// on a device whose memory the host cannot reach (kernels without device code there).
    pub device_launches: u64,
    pub device_tasks: u64,
    pub host_path_tasks: u64,
    /// Device time of the run's launches, from events recorded around each batch's launches
    /// (0 unless the worker times the device: `device_timing`).
    pub device_ns: u64,
    /// How long execute waited for the device at its end (the rest of execute is the host's:
    /// planning, row upload, launch calls, host-path tasks).
    pub execute_wait_ns: u64,
    /// The host's parts of execute, as measured: planning the launches (comparing with the kept
    /// plans, dependence levels, writing task rows), uploading the rows, and the launch calls
    /// (enqueueing, not running). With `execute_wait_ns` they add up to at most `execute`; the
    /// rest is host-path tasks and the cursor's walk over the tasks.
    pub plan_ns: u64,
    pub row_upload_ns: u64,
    pub launch_ns: u64,
    /// Whether the run's launches came from the kept plan of an earlier round that recorded
    /// the same tasks (1) or were planned (0; see `plan_cache.rs`), and the bytes of task rows
    /// the run uploaded (0 when it reused a plan).
    pub plan_reuses: u64,
    pub task_row_bytes: u64,
    /// Graph launches (1 when the run's launches were one replay of a captured graph: CUDA
    /// under `Replay::Graphs`), and captures made (1 on the run that captured its plan).
    pub graph_launches: u64,
    pub graph_captures: u64,
}

impl Counters {
    /// `(name, value)` pairs, in the documented order.
    pub fn entries(&self) -> [(&'static str, u64); 35] {
        [
            ("staged_tensors", self.staged_tensors),
            ("staged_bytes", self.staged_bytes),
            ("copied_back_bytes", self.copied_back_bytes),
            ("device_mallocs", self.device_mallocs),
            ("device_frees", self.device_frees),
            ("resident_tensors", self.resident_tensors),
            ("views_mapped", self.views_mapped),
            ("views_mirrored", self.views_mirrored),
            ("mirror_refreshes", self.mirror_refreshes),
            ("mirror_refresh_bytes", self.mirror_refresh_bytes),
            ("orch_reads", self.orch_reads),
            ("orch_writes", self.orch_writes),
            ("tasks", self.tasks),
            ("submits", self.submits),
            ("staged_view_copies", self.staged_view_copies),
            ("scratch_tensors", self.scratch_tensors),
            ("scratch_bytes", self.scratch_bytes),
            ("poisoned_bytes", self.poisoned_bytes),
            ("views_cached", self.views_cached),
            ("cache_fills", self.cache_fills),
            ("cache_fill_bytes", self.cache_fill_bytes),
            ("mapped_reads", self.mapped_reads),
            ("mapped_writes", self.mapped_writes),
            ("device_launches", self.device_launches),
            ("device_tasks", self.device_tasks),
            ("host_path_tasks", self.host_path_tasks),
            ("device_ns", self.device_ns),
            ("execute_wait_ns", self.execute_wait_ns),
            ("plan_ns", self.plan_ns),
            ("row_upload_ns", self.row_upload_ns),
            ("launch_ns", self.launch_ns),
            ("plan_reuses", self.plan_reuses),
            ("task_row_bytes", self.task_row_bytes),
            ("graph_launches", self.graph_launches),
            ("graph_captures", self.graph_captures),
        ]
    }
}

/// One cost model's price of a kernel over a run (the sums over its batches; each batch costs
/// `overhead + max(memory, compute)`, so `ns` is at most the sum of the three).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelModeled {
    pub model: &'static str,
    pub overhead_ns: f64,
    pub memory_ns: f64,
    pub compute_ns: f64,
    pub ns: u64,
    /// The batches' time streaming or computing (`max(memory, compute)`, summed), and what it
    /// would have been at the device's full rates: their ratio is [`KernelModeled::rate`].
    pub busy_ns: f64,
    pub full_rate_ns: f64,
}

impl KernelModeled {
    /// The fraction of the device's rates the kernel's batches ran at (its efficiency times
    /// its launches' fill, weighted by time); 1 when they ran at full rates or did nothing.
    pub fn rate(&self) -> f64 {
        if self.busy_ns > 0.0 {
            self.full_rate_ns / self.busy_ns
        } else {
            1.0
        }
    }
}

/// The work of one kernel over a run, and its price under each cost model.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelCost {
    pub name: String,
    /// Whether the kernel declares its work (else bytes come from its views, and it does no
    /// priced operations).
    pub declared: bool,
    pub batches: u64,
    pub tasks: u64,
    /// Launches a device would make of its batches (one per dependence level).
    pub launches: u64,
    /// The work of one task (of its first batch) and of all its tasks.
    pub per_task: simpler_driver::model::Work,
    pub work: simpler_driver::model::Work,
    pub modeled: Vec<KernelModeled>,
}

/// One cost model's modeled phases of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeledRun {
    pub model: &'static str,
    pub phases: Phases,
}

/// What a run did and how long each phase took.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RunReport {
    pub phases: Phases,
    pub counters: Counters,
    /// Whether every phase succeeded.
    pub ok: bool,
    /// Modeled nanoseconds per phase, when the device prices its operations with cost models
    /// (sim with `model=`), under the primary model: its driver calls, element accesses
    /// through mappings and cache fills out of them during orchestration, and the kernels
    /// (`execute`).
    pub modeled: Option<Phases>,
    /// The modeled phases under every cost model of the device, the primary one first.
    pub modeled_by: Vec<ModeledRun>,
    /// Per kernel, the work the run's tasks did and its price (with a cost model).
    pub kernels: Vec<KernelCost>,
}
