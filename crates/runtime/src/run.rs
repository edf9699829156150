//! The run cycle: `bind -> orchestrate -> execute -> copy back -> clean up` (DESIGN 4.4).
//!
//! The embedding language drives the steps (it owns the orchestration function and the kernels);
//! this module owns everything about memory: staging slices, uploads, lazy host views, hazards,
//! kernel buffers, copy-back, cleanup, timing and the report. Each step takes the run's
//! generation number, so a handle from a finished run is refused rather than misused.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use simpler_driver::{DevPtr, HostMem, Stats};

use crate::arena::{grown_capacity, plan_slices, SLICE_ALIGN};
use crate::dtype::DType;
use crate::dtype::Value;
use crate::error::{Error, Phase, Result};
use crate::geometry::align_up;
use crate::geometry::{span_contains, Geometry};
use crate::views::{Means, ViewEvents};
use crate::worker::{AllocInfo, Direction, Owner, Staging, Worker};

/// Smallest scratch pool chunk.
const SCRATCH_CHUNK: u64 = 1 << 20;

/// One argument handed to [`Worker::begin_run`], in signature order.
#[derive(Debug)]
pub enum BindArg<'a> {
    /// A host array: `host` is its byte extent (`geometry.extent()` bytes from its first
    /// element); `geometry` has offset 0.
    Staged {
        name: String,
        geometry: Geometry,
        dir: Direction,
        host: &'a [u8],
    },
    /// A device tensor over the live buffer at `ptr` (resident pass-through).
    Device {
        name: String,
        ptr: DevPtr,
        geometry: Geometry,
        dir: Direction,
    },
}

/// Phase durations in nanoseconds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Phases {
    pub bind: u64,
    pub orchestrate: u64,
    pub execute: u64,
    pub copy_back: u64,
    pub cleanup: u64,
}

impl Phases {
    pub fn entries(&self) -> [(&'static str, u64); 5] {
        [
            ("bind", self.bind),
            ("orchestrate", self.orchestrate),
            ("execute", self.execute),
            ("copy_back", self.copy_back),
            ("cleanup", self.cleanup),
        ]
    }
}

/// Per-run counters (DESIGN 6).
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
    pub staged_view_copies: u64,
    pub scratch_tensors: u64,
    pub scratch_bytes: u64,
}

impl Counters {
    pub fn entries(&self) -> [(&'static str, u64); 16] {
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
            ("staged_view_copies", self.staged_view_copies),
            ("scratch_tensors", self.scratch_tensors),
            ("scratch_bytes", self.scratch_bytes),
        ]
    }
}

/// What a run did and how long each phase took.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunReport {
    pub phases: Phases,
    pub counters: Counters,
    /// Whether every phase succeeded.
    pub ok: bool,
}

/// A host window over device bytes handed to a kernel or returned by `read_tensor`:
/// `len` bytes at `offset` of `mem`, laid out as `geometry` (rebased to start at `offset`).
#[derive(Debug, Clone)]
pub struct HostWindow {
    pub mem: Arc<HostMem>,
    pub offset: usize,
    pub len: usize,
    pub geometry: Geometry,
    /// True when `mem` is the device memory itself or a view cache entry (no copy was made).
    pub zero_copy: bool,
}

#[derive(Debug)]
enum ArgKind {
    /// A host array staged into the arena (or a fresh allocation).
    Staged { copy: Option<Arc<HostMem>> },
    /// A resident device tensor.
    Device,
    /// A run-scoped device tensor created by the orchestration (`orch.scratch`), carved from the
    /// worker's retained scratch pool. No host array, no upload, no copy-back.
    Scratch { copy: Option<Arc<HostMem>> },
}

#[derive(Debug)]
struct RunArg {
    /// Shared, so the per-access paths copy a pointer, not the string.
    name: Arc<str>,
    dir: Direction,
    /// Relative to `alloc`.
    geometry: Geometry,
    /// The allocation holding the tensor; `None` when it has no bytes.
    alloc: Option<(DevPtr, u64)>,
    kind: ArgKind,
}

impl RunArg {
    fn span(&self) -> Option<(u64, u64)> {
        self.alloc
            .map(|(p, _)| (p.0 + self.geometry.start_byte(), self.geometry.extent()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Orchestrate,
    Execute,
    Executed,
    CopiedBack,
}

/// Merged byte intervals `[start, end)` by start.
#[derive(Debug, Default)]
struct Intervals(BTreeMap<u64, u64>);

impl Intervals {
    fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut s, mut e) = (start, start + len);
        let overlapping: Vec<(u64, u64)> = self
            .0
            .range(..=e)
            .rev()
            .take_while(|&(_, &ee)| ee >= s)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in overlapping {
            self.0.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.0.insert(s, e);
    }

    fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start + len;
        len > 0
            && self
                .0
                .range(..end)
                .next_back()
                .is_some_and(|(_, &e)| e > start)
    }
}

#[derive(Debug)]
struct TaskTensor {
    arg: usize,
    geometry: Geometry,
    dir: Direction,
}

/// A task tensor handed to a kernel as a host copy (drivers without kernel memory): written
/// back to `addr` after the kernel when `dir` writes.
#[derive(Debug)]
struct PendingCopy {
    addr: u64,
    mem: Arc<HostMem>,
    dir: Direction,
    name: Arc<str>,
    /// The view's layout over the copy (offset 0).
    geometry: Geometry,
}

#[derive(Debug)]
pub(crate) struct RunState {
    gen: u64,
    args: Vec<RunArg>,
    tasks: Vec<Vec<TaskTensor>>,
    written: Intervals,
    touched: Intervals,
    stage: Stage,
    failed: bool,
    mark: Instant,
    report: RunReport,
    stats_before: Stats,
    events: ViewEvents,
    /// Fresh staging allocations of this run, with the tensor each holds.
    fresh: Vec<(Arc<str>, DevPtr)>,
    /// Host copies handed to kernels on drivers without kernel memory, per task.
    pending: HashMap<usize, Vec<PendingCopy>>,
    /// Next free place in the scratch pool: (chunk index, byte offset).
    scratch_at: (usize, u64),
    /// Allocations some task of this run writes (deduplicated at submit, so the end of execute
    /// marks each mirror stale once, however many tasks there were).
    written_allocs: Vec<DevPtr>,
}

impl RunState {
    /// Exact check behind the interval sets (which hold whole extents, so a strided task view
    /// also covers the bytes between its elements): does a submitted task tensor — only writing
    /// ones when `writes_only` — have an element intersecting `[addr, addr + len)`? Runs only
    /// when the interval sets report a hit.
    fn task_touches(&self, addr: u64, len: u64, writes_only: bool) -> bool {
        let end = addr + len;
        self.tasks.iter().flatten().any(|t| {
            if writes_only && !t.dir.writes() {
                return false;
            }
            let Some((base, _)) = self.args[t.arg].alloc else {
                return false;
            };
            let start = base.0 + t.geometry.start_byte();
            let extent = t.geometry.extent();
            if end <= start || start + extent <= addr {
                return false;
            }
            t.geometry
                .elements_overlap(addr.saturating_sub(start), end - start)
        })
    }

    pub(crate) fn binds(&self, ptr: DevPtr) -> bool {
        self.args
            .iter()
            .any(|a| matches!(a.kind, ArgKind::Device) && a.alloc.is_some_and(|(p, _)| p == ptr))
    }

    fn lap(&mut self) -> u64 {
        let now = Instant::now();
        let ns = now.duration_since(self.mark).as_nanos() as u64;
        self.mark = now;
        ns
    }
}

/// Target of an orchestrator access: host bytes, plus the device address to push writes to.
struct Target {
    mem: Arc<HostMem>,
    offset: usize,
    push: Option<u64>,
    mirror_of: Option<DevPtr>,
    /// The argument whose per-run staged copy this is.
    staged_copy_of: Option<usize>,
    zero_copy: bool,
}

fn not_in_progress(gen: u64) -> Error {
    Error::State(format!(
        "run {gen} is not in progress (this handle belongs to a finished run)"
    ))
}

fn host_err(what: &str, e: simpler_driver::HostMemError) -> Error {
    Error::Value(format!("{what}: host view access failed: {e}"))
}

impl Worker {
    fn run_ref(&self, gen: u64) -> Result<&RunState> {
        self.run
            .as_ref()
            .filter(|r| r.gen == gen)
            .ok_or_else(|| not_in_progress(gen))
    }

    fn run_mut(&mut self, gen: u64) -> Result<&mut RunState> {
        self.run
            .as_mut()
            .filter(|r| r.gen == gen)
            .ok_or_else(|| not_in_progress(gen))
    }

    /// Binds the arguments of a new run: stages host arrays (arena slices or fresh allocations,
    /// H2D unless OUT) and records device tensors as lazy view entries. Returns the run's
    /// generation. On failure everything this call took is released and no run is in progress.
    pub fn begin_run(&mut self, args: &[BindArg<'_>]) -> Result<u64> {
        self.check_open()?;
        if self.run.is_some() {
            return Err(Error::State(
                "worker busy: a run is in progress (one worker runs one call at a time)".into(),
            ));
        }
        let start = Instant::now();
        let stats_before = self.dev.stats();
        // Validate device tensors before any device work.
        for a in args {
            if let BindArg::Device {
                name,
                ptr,
                geometry,
                ..
            } = a
            {
                self.check_tensor(*ptr, geometry, &format!("tensor {name}"))?;
            }
            if let BindArg::Staged {
                name,
                geometry,
                host,
                ..
            } = a
            {
                if host.len() as u64 != geometry.extent() || geometry.start_byte() != 0 {
                    return Err(Error::Value(format!(
                        "tensor {name}: {} host bytes for an extent of {} bytes",
                        host.len(),
                        geometry.extent()
                    )));
                }
            }
        }
        self.run_gen += 1;
        let gen = self.run_gen;
        let mut run = RunState {
            gen,
            args: Vec::with_capacity(args.len()),
            tasks: Vec::new(),
            written: Intervals::default(),
            touched: Intervals::default(),
            stage: Stage::Orchestrate,
            failed: false,
            mark: start,
            report: RunReport::default(),
            stats_before,
            events: ViewEvents::default(),
            fresh: Vec::new(),
            pending: HashMap::new(),
            scratch_at: (0, 0),
            written_allocs: Vec::new(),
        };
        match self.bind_into(&mut run, args) {
            Ok(()) => {
                run.report.phases.bind = run.lap();
                self.run = Some(run);
                Ok(gen)
            }
            Err(e) => {
                // Fresh staging allocations of this bind are released; the arena is retained.
                for (name, p) in run.fresh.drain(..).rev() {
                    if let Err(fe) = self.release_alloc(p) {
                        log::error!("bind rollback: freeing the staging buffer {p} of tensor {name} failed: {fe}");
                        self.orphan(p);
                    }
                }
                Err(e)
            }
        }
    }

    fn bind_into(&mut self, run: &mut RunState, args: &[BindArg<'_>]) -> Result<()> {
        let staged: Vec<(String, u64)> = args
            .iter()
            .filter_map(|a| match a {
                BindArg::Staged { name, geometry, .. } => Some((name.clone(), geometry.extent())),
                _ => None,
            })
            .collect();
        let (offsets, total) = plan_slices(&staged)?;
        if self.staging == Staging::Arena && total > 0 {
            self.ensure_arena(total)?;
        }
        let mut si = 0;
        for a in args {
            match a {
                BindArg::Device {
                    name,
                    ptr,
                    geometry,
                    dir,
                } => {
                    let info = self.alloc_info(*ptr, name)?;
                    let alloc = (geometry.extent() > 0).then_some((*ptr, info.bytes));
                    run.report.counters.resident_tensors += 1;
                    run.args.push(RunArg {
                        name: name.as_str().into(),
                        dir: *dir,
                        geometry: geometry.clone(),
                        alloc,
                        kind: ArgKind::Device,
                    });
                }
                BindArg::Staged {
                    name,
                    geometry,
                    dir,
                    host,
                } => {
                    let extent = geometry.extent();
                    let off = offsets[si];
                    si += 1;
                    run.report.counters.staged_tensors += 1;
                    let mut arg = RunArg {
                        name: name.as_str().into(),
                        dir: *dir,
                        geometry: geometry.clone(),
                        alloc: None,
                        kind: ArgKind::Staged { copy: None },
                    };
                    if extent > 0 {
                        let (base, bytes, at) = match self.staging {
                            Staging::Arena => {
                                let (p, cap) = self.arena.current().expect("arena ensured above");
                                (p, cap, off)
                            }
                            Staging::Fresh => {
                                let p = self
                                    .dev
                                    .alloc(extent)
                                    .map_err(|e| Error::device(Phase::Bind, Some(name), e))?;
                                self.allocs.insert(
                                    p.0,
                                    AllocInfo {
                                        bytes: extent,
                                        owner: Owner::Staging,
                                    },
                                );
                                run.fresh.push((name.as_str().into(), p));
                                (p, extent, 0)
                            }
                        };
                        let es = geometry.dtype().size();
                        arg.geometry = Geometry::new(
                            name,
                            geometry.dtype(),
                            geometry.shape().to_vec(),
                            Some(geometry.strides().to_vec()),
                            at / es,
                        )?;
                        arg.alloc = Some((base, bytes));
                        if dir.reads() {
                            self.dev
                                .copy_h2d(DevPtr(base.0 + at), host)
                                .map_err(|e| Error::device(Phase::Bind, Some(name), e))?;
                            run.report.counters.staged_bytes += extent;
                        }
                    }
                    run.args.push(arg);
                }
            }
        }
        Ok(())
    }

    /// Grows the arena to hold `needed` bytes: releases the old one (view first), allocates the
    /// new one. A failure leaves no arena.
    fn ensure_arena(&mut self, needed: u64) -> Result<()> {
        if let Some((p, cap)) = self.arena.current() {
            if cap >= needed {
                return Ok(());
            }
            let new_cap = grown_capacity(cap, needed);
            self.release_alloc(p)
                .map_err(|e| Error::device(Phase::Bind, None, e))?;
            self.arena.ptr = None;
            self.arena.capacity = 0;
            return self.alloc_arena(new_cap);
        }
        self.alloc_arena(grown_capacity(0, needed))
    }

    fn alloc_arena(&mut self, cap: u64) -> Result<()> {
        let p = self.dev.alloc(cap).map_err(|e| {
            Error::device(
                Phase::Bind,
                Some(&format!("<staging arena of {cap} bytes>")),
                e,
            )
        })?;
        self.allocs.insert(
            p.0,
            AllocInfo {
                bytes: cap,
                owner: Owner::Staging,
            },
        );
        self.arena.ptr = Some(p);
        self.arena.capacity = cap;
        Ok(())
    }

    /// Releases the staging arena and the scratch pool (e.g. after a one-off large run). Not
    /// during a run.
    pub fn trim_staging(&mut self) -> Result<()> {
        if self.run.is_some() {
            return Err(Error::State("trim_staging: a run is in progress".into()));
        }
        if let Some((p, _)) = self.arena.current() {
            self.release_alloc(p)
                .map_err(|e| Error::device(Phase::Buffer, None, e))?;
            self.arena = Default::default();
        }
        while let Some(&(p, _)) = self.scratch.last() {
            self.release_alloc(p)
                .map_err(|e| Error::device(Phase::Buffer, None, e))?;
            self.scratch.pop();
        }
        Ok(())
    }

    /// Name and geometry of argument `arg` of run `gen`.
    pub fn run_arg(&self, gen: u64, arg: usize) -> Result<(String, Geometry, Direction)> {
        let run = self.run_ref(gen)?;
        let a = run
            .args
            .get(arg)
            .ok_or_else(|| Error::Value(format!("no argument {arg}")))?;
        Ok((a.name.to_string(), a.geometry.clone(), a.dir))
    }

    /// Resolves an orchestrator access of `len` bytes at device address `addr` made through
    /// argument `arg`, establishing the allocation's view on first use.
    fn locate(&mut self, gen: u64, arg: usize, addr: u64, len: u64, write: bool) -> Result<Target> {
        let run = self.run_mut(gen)?;
        if run.stage != Stage::Orchestrate {
            return Err(Error::State(
                "tensor data is accessible only during orchestration".into(),
            ));
        }
        let a = run
            .args
            .get(arg)
            .ok_or_else(|| Error::Value(format!("no argument {arg}")))?;
        let covered = a
            .span()
            .is_some_and(|(s, l)| span_contains(s, l, addr, len));
        if !covered {
            return Err(Error::NoHostView {
                addr,
                bytes: len,
                detail: format!(
                    "outside every view of this run (argument {arg}, tensor {})",
                    a.name
                ),
            });
        }
        let name = a.name.clone();
        if write && run.touched.overlaps(addr, len) && run.task_touches(addr, len, false) {
            return Err(Error::Hazard(format!(
                "tensor {name}: writing {len} bytes at {addr:#x}, which a task submitted earlier in this run \
                 reads or writes; tasks execute after orchestration, so the task would see the wrong bytes"
            )));
        }
        if !write && run.written.overlaps(addr, len) && run.task_touches(addr, len, true) {
            return Err(Error::Hazard(format!(
                "tensor {name}: reading {len} bytes at {addr:#x}, which a task submitted earlier in this run \
                 writes; tasks execute after orchestration, so this read would see stale bytes"
            )));
        }
        let (base, bytes) = a.alloc.expect("covered implies an allocation");
        let staged = !matches!(a.kind, ArgKind::Device);
        let mut ev = ViewEvents::default();
        let means = self
            .views
            .ensure(&*self.dev, base, bytes, !staged, &name, &mut ev);
        let run = self.run.as_mut().expect("checked above");
        run.events.mapped += ev.mapped;
        run.events.mirrored += ev.mirrored;
        run.events.refreshes += ev.refreshes;
        run.events.refresh_bytes += ev.refresh_bytes;
        let off_in_alloc = (addr - base.0) as usize;
        match means? {
            Means::Mapped { mem, offset } => Ok(Target {
                zero_copy: mem.owned_addr().is_some(),
                mem,
                offset: offset + off_in_alloc,
                push: None,
                mirror_of: None,
                staged_copy_of: None,
            }),
            Means::Mirror { mem, .. } => Ok(Target {
                mem,
                offset: off_in_alloc,
                push: Some(addr),
                mirror_of: Some(base),
                staged_copy_of: None,
                zero_copy: true,
            }),
            Means::Refused => {
                // A staged tensor on a driver that refuses to map the staging allocation: a per-run
                // copy of its span, filled once from the device.
                let a = &mut run.args[arg];
                let (span_start, span_len) = a.span().expect("covered");
                let (ArgKind::Staged { copy } | ArgKind::Scratch { copy }) = &mut a.kind else {
                    unreachable!("staged")
                };
                if copy.is_none() {
                    let mem = HostMem::new(span_len as usize, 0).map_err(|e| host_err(&name, e))?;
                    mem.with_slice_mut(0, span_len as usize, |d| {
                        self.dev.copy_d2h(d, DevPtr(span_start))
                    })
                    .map_err(|e| host_err(&name, e))?
                    .map_err(|e| Error::device(Phase::Orchestrate, Some(&name), e))?;
                    *copy = Some(Arc::new(mem));
                    run.report.counters.staged_view_copies += 1;
                }
                Ok(Target {
                    mem: copy.clone().expect("filled"),
                    offset: (addr - span_start) as usize,
                    push: Some(addr),
                    mirror_of: None,
                    staged_copy_of: Some(arg),
                    zero_copy: true,
                })
            }
        }
    }

    /// `get_tensor_data`: the element at `index` of `geometry` (a view of argument `arg`).
    pub fn orch_read(
        &mut self,
        gen: u64,
        arg: usize,
        geometry: &Geometry,
        index: &[i64],
    ) -> Result<Value> {
        let (name, base) = self.arg_base(gen, arg)?;
        let off = geometry.byte_offset_of(&name, index)?;
        let es = geometry.dtype().size();
        let t = self.locate(gen, arg, base + off, es, false)?;
        let mut buf = [0u8; 8];
        t.mem
            .read(t.offset, &mut buf[..es as usize])
            .map_err(|e| host_err(&name, e))?;
        self.run_mut(gen)?.report.counters.orch_reads += 1;
        Ok(geometry.dtype().decode(&buf[..es as usize]))
    }

    /// `set_tensor_data`: writes `value` at `index`; mirrors and staged copies push the element to
    /// the device at once.
    pub fn orch_write(
        &mut self,
        gen: u64,
        arg: usize,
        geometry: &Geometry,
        index: &[i64],
        value: Value,
    ) -> Result<()> {
        let (name, base) = self.arg_base(gen, arg)?;
        let off = geometry.byte_offset_of(&name, index)?;
        let es = geometry.dtype().size() as usize;
        let mut buf = [0u8; 8];
        geometry
            .dtype()
            .encode(value, &mut buf[..es])
            .map_err(|e| match e {
                Error::Value(m) => Error::Value(format!("tensor {name}: {m}")),
                Error::Type(m) => Error::Type(format!("tensor {name}: {m}")),
                other => other,
            })?;
        let addr = base + off;
        let t = self.locate(gen, arg, addr, es as u64, true)?;
        t.mem
            .write(t.offset, &buf[..es])
            .map_err(|e| host_err(&name, e))?;
        if let Some(dst) = t.push {
            if let Err(e) = self.dev.copy_h2d(DevPtr(dst), &buf[..es]) {
                // The host copy now differs from the device: a mirror refreshes on its next read,
                // a staged copy is dropped and re-read from the device on the next access.
                if let Some(m) = t.mirror_of {
                    self.views.mark_stale(m);
                }
                if let Some(i) = t.staged_copy_of {
                    if let Some(ArgKind::Staged { copy } | ArgKind::Scratch { copy }) =
                        self.run.as_mut().map(|r| &mut r.args[i].kind)
                    {
                        *copy = None;
                    }
                }
                return Err(Error::device(Phase::Orchestrate, Some(&name), e));
            }
        }
        self.run_mut(gen)?.report.counters.orch_writes += 1;
        Ok(())
    }

    /// `read_tensor`: a host window over the tensor's bytes. Zero-copy over a mapping of host-owned
    /// memory, a fresh mirror, or a staged copy; a copy over a vendor mapping (which can be revoked).
    pub fn orch_read_tensor(
        &mut self,
        gen: u64,
        arg: usize,
        geometry: &Geometry,
    ) -> Result<HostWindow> {
        let (name, base) = self.arg_base(gen, arg)?;
        let extent = geometry.extent();
        let rebased = geometry.rebased();
        if extent == 0 {
            let mem = Arc::new(HostMem::new(1, 0).map_err(|e| host_err(&name, e))?);
            return Ok(HostWindow {
                mem,
                offset: 0,
                len: 0,
                geometry: rebased,
                zero_copy: false,
            });
        }
        let t = self.locate(gen, arg, base + geometry.start_byte(), extent, false)?;
        self.run_mut(gen)?.report.counters.orch_reads += 1;
        if t.zero_copy {
            return Ok(HostWindow {
                mem: t.mem,
                offset: t.offset,
                len: extent as usize,
                geometry: rebased,
                zero_copy: true,
            });
        }
        let copy = HostMem::new(extent as usize, 0).map_err(|e| host_err(&name, e))?;
        t.mem
            .with_slice(t.offset, extent as usize, |s| copy.write(0, s))
            .map_err(|e| host_err(&name, e))?
            .map_err(|e| host_err(&name, e))?;
        Ok(HostWindow {
            mem: Arc::new(copy),
            offset: 0,
            len: extent as usize,
            geometry: rebased,
            zero_copy: false,
        })
    }

    /// The device address that argument geometries of `arg` are relative to.
    fn arg_base(&self, gen: u64, arg: usize) -> Result<(Arc<str>, u64)> {
        let run = self.run_ref(gen)?;
        let a = run
            .args
            .get(arg)
            .ok_or_else(|| Error::Value(format!("no argument {arg}")))?;
        let base = match a.alloc {
            Some((p, _)) => p.0,
            None => 0,
        };
        Ok((a.name.clone(), base))
    }

    /// Creates a run-scoped device tensor (contiguous `shape` of `dtype`) for intermediate results;
    /// returns its argument index. It lives until the run's cleanup. Its bytes come from the
    /// worker's retained scratch pool: chunks are allocated when a run needs more than the pool
    /// holds and kept, so a warm run with the same footprint does no device malloc.
    pub fn scratch(
        &mut self,
        gen: u64,
        name: &str,
        dtype: DType,
        shape: Vec<u64>,
    ) -> Result<usize> {
        let geometry = Geometry::contiguous(&format!("scratch tensor {name}"), dtype, shape)?;
        let run = self.run_mut(gen)?;
        if run.stage != Stage::Orchestrate {
            return Err(Error::State(
                "scratch tensors are created during orchestration".into(),
            ));
        }
        let extent = geometry.extent();
        let mut arg = RunArg {
            name: name.into(),
            dir: Direction::InOut,
            geometry: geometry.clone(),
            alloc: None,
            kind: ArgKind::Scratch { copy: None },
        };
        if extent > 0 {
            let need = align_up(extent, SLICE_ALIGN)?;
            let (mut chunk, mut off) = run.scratch_at;
            let place = loop {
                match self.scratch.get(chunk) {
                    Some(&(_, cap)) if off.checked_add(need).is_some_and(|e| e <= cap) => {
                        break Some(chunk)
                    }
                    Some(_) => {
                        chunk += 1;
                        off = 0;
                    }
                    None => break None,
                }
            };
            let chunk = match place {
                Some(c) => c,
                None => {
                    let last = self.scratch.last().map_or(0, |c| c.1);
                    let cap = need.max(SCRATCH_CHUNK).max(last.saturating_mul(2));
                    let p = self
                        .dev
                        .alloc(cap)
                        .map_err(|e| Error::device(Phase::Orchestrate, Some(name), e))?;
                    self.allocs.insert(
                        p.0,
                        AllocInfo {
                            bytes: cap,
                            owner: Owner::Staging,
                        },
                    );
                    self.scratch.push((p, cap));
                    off = 0;
                    self.scratch.len() - 1
                }
            };
            let (p, cap) = self.scratch[chunk];
            let es = dtype.size();
            arg.geometry = Geometry::new(name, dtype, geometry.shape().to_vec(), None, off / es)?;
            arg.alloc = Some((p, cap));
            let run = self.run.as_mut().expect("checked");
            run.scratch_at = (chunk, off + need);
            run.report.counters.scratch_bytes += extent;
        }
        let run = self.run.as_mut().expect("checked");
        run.report.counters.scratch_tensors += 1;
        run.args.push(arg);
        Ok(run.args.len() - 1)
    }

    /// Records a task over views of this run's arguments; returns its index. Tasks execute in
    /// submission order after orchestration.
    pub fn submit(
        &mut self,
        gen: u64,
        tensors: Vec<(usize, Geometry, Direction)>,
    ) -> Result<usize> {
        let run = self.run_mut(gen)?;
        if run.stage != Stage::Orchestrate {
            return Err(Error::State(
                "submit is only valid during orchestration".into(),
            ));
        }
        let mut task = Vec::with_capacity(tensors.len());
        for (arg, geometry, dir) in tensors {
            let a = run
                .args
                .get(arg)
                .ok_or_else(|| Error::Value(format!("no argument {arg}")))?;
            if geometry.extent() > 0 {
                let (base, _) = a.alloc.expect("non-empty view of a non-empty argument");
                let (s, l) = a.span().expect("allocated");
                let start = base.0 + geometry.start_byte();
                if !span_contains(s, l, start, geometry.extent()) {
                    return Err(Error::NoHostView {
                        addr: start,
                        bytes: geometry.extent(),
                        detail: format!("task tensor runs past argument {arg} ({})", a.name),
                    });
                }
                run.touched.insert(start, geometry.extent());
                if dir.writes() {
                    run.written.insert(start, geometry.extent());
                    if !run.written_allocs.contains(&base) {
                        run.written_allocs.push(base);
                    }
                }
            }
            task.push(TaskTensor { arg, geometry, dir });
        }
        run.tasks.push(task);
        run.report.counters.tasks += 1;
        Ok(run.tasks.len() - 1)
    }

    /// Ends orchestration; tasks may now be executed.
    pub fn begin_execute(&mut self, gen: u64) -> Result<usize> {
        let run = self.run_mut(gen)?;
        if run.stage != Stage::Orchestrate {
            return Err(Error::State("execute already started".into()));
        }
        run.report.phases.orchestrate = run.lap();
        run.stage = Stage::Execute;
        Ok(run.tasks.len())
    }

    /// The buffers of task `task`, in its signature order. On sim they are the device memory
    /// itself; elsewhere host copies (D2H now, H2D of outputs at [`Worker::finish_task`]).
    pub fn task_buffers(&mut self, gen: u64, task: usize) -> Result<Vec<HostWindow>> {
        let dev = self.dev.clone();
        let run = self.run_mut(gen)?;
        if run.stage != Stage::Execute {
            return Err(Error::State("tasks run only during execute".into()));
        }
        let tensors = run
            .tasks
            .get(task)
            .ok_or_else(|| Error::Value(format!("no task {task}")))?;
        let mut out = Vec::with_capacity(tensors.len());
        let mut copies = Vec::new();
        for t in tensors {
            let a = &run.args[t.arg];
            let extent = t.geometry.extent();
            let rebased = t.geometry.rebased();
            if extent == 0 {
                let mem = Arc::new(HostMem::new(1, 0).map_err(|e| host_err(&a.name, e))?);
                out.push(HostWindow {
                    mem,
                    offset: 0,
                    len: 0,
                    geometry: rebased,
                    zero_copy: false,
                });
                continue;
            }
            let addr = a.alloc.expect("non-empty").0 .0 + t.geometry.start_byte();
            if let Some((mem, offset)) = dev.kernel_memory(DevPtr(addr), extent) {
                out.push(HostWindow {
                    mem,
                    offset,
                    len: extent as usize,
                    geometry: rebased,
                    zero_copy: true,
                });
                continue;
            }
            let mem = HostMem::new(extent as usize, 0).map_err(|e| host_err(&a.name, e))?;
            mem.with_slice_mut(0, extent as usize, |d| dev.copy_d2h(d, DevPtr(addr)))
                .map_err(|e| host_err(&a.name, e))?
                .map_err(|e| Error::device(Phase::Execute, Some(&a.name), e))?;
            let mem = Arc::new(mem);
            copies.push(PendingCopy {
                addr,
                mem: mem.clone(),
                dir: t.dir,
                name: a.name.clone(),
                geometry: rebased.clone(),
            });
            out.push(HostWindow {
                mem,
                offset: 0,
                len: extent as usize,
                geometry: rebased,
                zero_copy: false,
            });
        }
        if !copies.is_empty() {
            run.pending.insert(task, copies);
        }
        Ok(out)
    }

    /// After task `task` ran: pushes its host-copied outputs back to the device.
    pub fn finish_task(&mut self, gen: u64, task: usize) -> Result<()> {
        let dev = self.dev.clone();
        let run = self.run_mut(gen)?;
        let Some(copies) = run.pending.remove(&task) else {
            return Ok(());
        };
        for c in copies.iter().filter(|c| c.dir.writes()) {
            let dev_err = |e| Error::device(Phase::Execute, Some(&c.name), e);
            let r = if c.geometry.is_dense() {
                c.mem
                    .with_slice(0, c.mem.len(), |s| dev.copy_h2d(DevPtr(c.addr), s))
                    .map_err(|e| host_err(&c.name, e))?
            } else {
                // Only the view's elements go back: the bytes between them may belong to another
                // view of the same task, which has its own copy.
                let mut merged = vec![0u8; c.mem.len()];
                dev.copy_d2h(&mut merged, DevPtr(c.addr)).map_err(dev_err)?;
                c.mem
                    .with_slice(0, c.mem.len(), |s| c.geometry.copy_elements(s, &mut merged))
                    .map_err(|e| host_err(&c.name, e))?;
                dev.copy_h2d(DevPtr(c.addr), &merged)
            };
            r.map_err(dev_err)?;
        }
        Ok(())
    }

    /// Ends execution (`ok = false` if a task failed). Mirrors of resident arguments the callable
    /// declares OUT/INOUT, and of any allocation a task wrote, go stale.
    pub fn end_execute(&mut self, gen: u64, ok: bool) -> Result<()> {
        // Field-level borrow: the views are updated while the run is borrowed.
        let run = self
            .run
            .as_mut()
            .filter(|r| r.gen == gen)
            .ok_or_else(|| not_in_progress(gen))?;
        let was_orchestrating = run.stage == Stage::Orchestrate;
        run.stage = Stage::Executed;
        run.pending.clear();
        if !ok {
            run.failed = true;
        }
        let declared = run
            .args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Device) && a.dir.writes())
            .filter_map(|a| a.alloc.map(|(p, _)| p));
        for p in declared.chain(run.written_allocs.iter().copied()) {
            self.views.mark_stale(p);
        }
        let run = self.run.as_mut().expect("checked");
        if was_orchestrating {
            run.report.phases.orchestrate = run.lap();
        } else {
            run.report.phases.execute = run.lap();
        }
        Ok(())
    }

    /// Marks the run failed (an orchestration or kernel error); copy-back will be skipped.
    pub fn fail_run(&mut self, gen: u64) {
        if let Ok(r) = self.run_mut(gen) {
            r.failed = true;
        }
    }

    /// Copies staged OUT/INOUT tensors back into the caller's arrays (`hosts[i]` is argument i's
    /// byte extent, or `None` for arguments that are not copied back). Skipped entirely when an
    /// earlier step failed. Non-dense tensors are scattered element by element, so bytes of the
    /// caller's array between the elements are never touched.
    pub fn copy_back(&mut self, gen: u64, hosts: &mut [Option<&mut [u8]>]) -> Result<()> {
        let dev = self.dev.clone();
        let run = self.run_mut(gen)?;
        if run.stage != Stage::Executed {
            return Err(Error::State("copy_back: execution has not ended".into()));
        }
        run.stage = Stage::CopiedBack;
        if run.failed {
            run.lap();
            return Ok(());
        }
        let mut result = Ok(());
        for (i, a) in run.args.iter().enumerate() {
            if !matches!(a.kind, ArgKind::Staged { .. }) || !a.dir.writes() {
                continue;
            }
            let Some((start, len)) = a.span() else {
                continue;
            };
            let Some(Some(dst)) = hosts.get_mut(i) else {
                result = Err(Error::Value(format!(
                    "copy_back: no host array for tensor {}",
                    a.name
                )));
                break;
            };
            if dst.len() as u64 != len {
                result = Err(Error::Value(format!(
                    "copy_back: tensor {}: host extent of {} bytes, device extent {len}",
                    a.name,
                    dst.len()
                )));
                break;
            }
            let r = if a.geometry.is_dense() {
                dev.copy_d2h(dst, DevPtr(start))
            } else {
                let mut tmp = vec![0u8; len as usize];
                dev.copy_d2h(&mut tmp, DevPtr(start))
                    .map(|()| a.geometry.copy_elements(&tmp, dst))
            };
            if let Err(e) = r {
                result = Err(Error::device(Phase::CopyBack, Some(&a.name), e));
                break;
            }
            run.report.counters.copied_back_bytes += len;
        }
        if result.is_err() {
            run.failed = true;
        }
        run.report.phases.copy_back = run.lap();
        result
    }

    /// Cleans up (always): fresh staging buffers are released (view first); the arena is kept.
    /// Returns the report. A cleanup failure is returned after everything was attempted.
    pub fn finish_run(&mut self, gen: u64) -> Result<RunReport> {
        self.run_mut(gen)?;
        let mut run = self.run.take().expect("checked");
        if run.stage == Stage::Orchestrate || run.stage == Stage::Execute {
            run.failed = true;
            run.lap();
        }
        let mut first_err = None;
        for (name, p) in run.fresh.drain(..).rev() {
            if let Err(e) = self.release_alloc(p) {
                log::error!("cleanup: freeing the staging buffer {p} of tensor {name} failed: {e}");
                self.orphan(p);
                first_err.get_or_insert(Error::device(Phase::Cleanup, Some(&name), e));
            }
        }
        run.report.phases.cleanup = run.lap();
        let after = self.dev.stats();
        let c = &mut run.report.counters;
        c.device_mallocs = after.allocs - run.stats_before.allocs;
        c.device_frees = after.frees - run.stats_before.frees;
        c.views_mapped = run.events.mapped;
        c.views_mirrored = run.events.mirrored;
        c.mirror_refreshes = run.events.refreshes;
        c.mirror_refresh_bytes = run.events.refresh_bytes;
        run.report.ok = !run.failed && first_err.is_none();
        match first_err {
            Some(e) => Err(e),
            None => Ok(run.report),
        }
    }

    /// Abandons the run in progress (used by `close`).
    pub(crate) fn abort_run(&mut self) {
        if let Some(gen) = self.run.as_ref().map(|r| r.gen) {
            self.fail_run(gen);
            if let Err(e) = self.finish_run(gen) {
                log::error!("aborting run {gen}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Intervals;

    #[test]
    fn intervals_merge_and_overlap() {
        let mut iv = Intervals::default();
        iv.insert(10, 10);
        iv.insert(30, 5);
        assert!(iv.overlaps(19, 1));
        assert!(!iv.overlaps(20, 10));
        assert!(!iv.overlaps(0, 10));
        iv.insert(15, 20);
        assert_eq!(iv.0.len(), 1);
        assert!(iv.overlaps(34, 1));
        assert!(!iv.overlaps(35, 1));
        assert!(!iv.overlaps(12, 0));
    }
}
