//! Orchestrator data access: `get_tensor_data`, `set_tensor_data` and `read_tensor` on the
//! arguments of the run in progress.
//!
//! An access is resolved against the argument it is made through: the bytes must lie inside that
//! argument's extent (else `NoHostView`, never a raw dereference), must not conflict with a task
//! submitted earlier in the run (else `Hazard`), and are then reached by the argument's kind:
//! * a device argument (a buffer or a resident tensor) through its allocation's host view,
//!   established on first use and kept for the allocation's life (`views.rs`: a mapping, a
//!   cached mapping or a mirror);
//! * a staged argument never through a mapping: the host already holds its bytes, so its reads
//!   come from a per-run copy of its span, filled from the bytes the run uploaded
//!   (`supply_staged`) or, for an output that was not uploaded, by one read of the span from the
//!   device; writes update the copy and go to the device at once;
//! * a scratch argument through a mapping of the chunk it lives in where the driver grants one,
//!   switched to a per-run copy of its span (one bulk read out of the mapping; writes then go
//!   through the mapping and update the copy) once its reads would pay for it, by the same rule
//!   that turns an allocation's mapping into a cached view (`ViewPolicy::reads_from_copy`);
//!   where the driver refuses the mapping (or the policy is `mirror`), a per-run copy of its span
//!   filled by one read from the device.
//!
//! A per-run copy lives as long as the run: the arena and the scratch chunks hold other bytes in
//! the next one, and no kernel runs while the orchestration reads.

use std::sync::Arc;

use simpler_driver::{DevPtr, HostMem};

use crate::dtype::{DType, Value};
use crate::error::{Error, Phase, Result};
use crate::geometry::{span_contains, Geometry};
use crate::memory::Memory;
use crate::pending::PendingRuns;
use crate::run::hazards::Conflict;
use crate::run::state::{ArgKind, HostWindow, Resolved, RunState, Stage, Via};
use crate::views::{Means, ViewEvents, Who};

/// Reads through a mapping are reported to the view cache in batches of this many.
const NOTE_READS_EVERY: u64 = 16;

impl RunState {
    /// Whether an orchestrator access to argument `arg` (a write, or a read) must wait for the
    /// run left pending (`pending.rs`): its tasks write those bytes, or, for a write, read them.
    pub(crate) fn waits_for(&self, pending: &PendingRuns, arg: u32, write: bool) -> bool {
        pending.id().is_some()
            && self
                .args
                .get(arg as usize)
                .and_then(|a| a.span())
                .is_some_and(|(start, len)| pending.conflicts(start, len, write))
    }
}

impl RunState {
    /// Checks an access of `access` (a geometry relative to the allocation of argument `arg`)
    /// and resolves where it lands, establishing the allocation's view on first use. Returns the
    /// device address of the access's first byte.
    fn locate(
        &mut self,
        mem: &mut Memory,
        arg: u32,
        access: &Geometry,
        write: bool,
    ) -> Result<u64> {
        self.expect(
            Stage::Orchestrate,
            "tensor data is accessible only during orchestration",
        )?;
        let a = self
            .args
            .get(arg as usize)
            .ok_or_else(|| Error::Value(format!("run has no argument {arg}")))?;
        let Some((base, bytes)) = a.alloc else {
            return Err(Error::NoHostView {
                addr: access.start_byte(),
                bytes: access.extent(),
                detail: format!("tensor {} has no bytes", a.name),
            });
        };
        let addr = base.0 + access.start_byte();
        let len = access.extent();
        let (s, l) = a.span().unwrap_or_default();
        if !span_contains(s, l, addr, len) {
            return Err(Error::NoHostView {
                addr,
                bytes: len,
                detail: format!(
                    "outside every view of this run (argument {arg}, tensor {})",
                    a.name
                ),
            });
        }
        let args = &self.args;
        let place = |i: u32| {
            let a = &args[i as usize];
            a.alloc.map(|(p, _)| (a.region, p.0))
        };
        if let Some(c) = self
            .hazards
            .conflict(a.region, access, write, &self.tasks, &place)
        {
            let who = format!("tensor {}", a.name);
            return Err(self.hazard(&who, &c, write, len, addr));
        }
        let epoch = mem.views.epoch();
        if a.resolved.as_ref().is_some_and(|r| r.epoch == epoch) {
            return Ok(addr);
        }
        // A staged tensor is never mapped: the host already holds its bytes. Its reads come
        // from a copy of its span, filled from the bytes the run uploaded (given by the host,
        // see `supply_staged`) or, for an output that was not uploaded, by one read of the
        // span from the device; writes update the copy and go to the device at once.
        if matches!(a.kind, ArgKind::Staged { .. }) {
            let resolved = self.span_copy_resolved(mem, arg, epoch)?;
            self.args[arg as usize].resolved = Some(resolved);
            return Ok(addr);
        }
        // Reads through the mapping not yet noted carry over to the new resolution.
        let carried = a.resolved.as_ref().map_or(0, |r| r.pending_reads);
        let staged = !matches!(a.kind, ArgKind::Device);
        let name = a.name.clone();
        let mut ev = ViewEvents::default();
        let means = mem.views.ensure(
            &*mem.dev,
            base,
            bytes,
            !staged,
            Who {
                tensor: &name,
                phase: Phase::Orchestrate,
            },
            &mut ev,
        );
        self.events.add(ev);
        let resolved = match means? {
            Means::Mapped { mem: m, offset } => {
                let copied = if staged && self.span_copy_pays(arg, mem) {
                    self.copy_of_mapped_span(arg, &m, offset, base, epoch)
                } else {
                    None
                };
                copied.unwrap_or(Resolved {
                    mem: m,
                    dev_start: base.0,
                    host_start: offset,
                    via: Via::Mapping,
                    epoch,
                    pending_reads: carried,
                })
            }
            Means::Mirror { mem: m, .. } => Resolved {
                mem: m,
                dev_start: base.0,
                host_start: 0,
                via: Via::Mirror,
                epoch,
                pending_reads: 0,
            },
            Means::Cached {
                map, offset, cache, ..
            } => Resolved {
                mem: cache,
                dev_start: base.0,
                host_start: 0,
                via: Via::Through(map, offset),
                epoch,
                pending_reads: 0,
            },
            Means::Refused => {
                // A scratch tensor whose chunk is not mapped: a per-run copy of its own span.
                self.span_copy_resolved(mem, arg, epoch)?
            }
        };
        self.args[arg as usize].resolved = Some(resolved);
        Ok(addr)
    }

    /// The resolution of argument `arg` through the run's copy of its span: the copy there is
    /// (one supplied from the host bytes the run uploaded), else one filled by a single read of
    /// the span from the device.
    fn span_copy_resolved(&mut self, mem: &Memory, arg: u32, epoch: u64) -> Result<Resolved> {
        let a = &self.args[arg as usize];
        let (span_start, _) = a.span().unwrap_or_default();
        let name = a.name.clone();
        let dev = &mem.dev;
        let (copy, _) = self.span_copy(arg, |dst| {
            dev.copy_d2h(dst, DevPtr(span_start))
                .map_err(|e| Error::device(Phase::Orchestrate, Some(&name), e))
        })?;
        Ok(Resolved {
            mem: copy,
            dev_start: span_start,
            host_start: 0,
            via: Via::SpanCopy,
            epoch,
            pending_reads: 0,
        })
    }

    /// Whether orchestrator reads of argument `arg` would be served from the host bytes the
    /// run uploaded, once the host supplies them (`supply_staged`): a staged tensor that was
    /// uploaded (not an output only), not read yet this run.
    pub(crate) fn wants_staged_bytes(&self, arg: u32) -> bool {
        self.stage == Stage::Orchestrate
            && self.args.get(arg as usize).is_some_and(|a| {
                matches!(a.kind, ArgKind::Staged { .. })
                    && a.dir.reads()
                    && a.alloc.is_some()
                    && a.span_copy.mem.is_none()
            })
    }

    /// Makes the copy that serves staged argument `arg`'s orchestrator reads from `host`, the
    /// bytes of its extent that the run uploaded (no device read, no mapping). Nothing when
    /// `arg` does not want them (see `wants_staged_bytes`).
    pub(crate) fn supply_staged(&mut self, arg: u32, host: &[u8]) -> Result<()> {
        if !self.wants_staged_bytes(arg) {
            return Ok(());
        }
        let a = &self.args[arg as usize];
        let (_, span_len) = a.span().unwrap_or_default();
        if host.len() as u64 != span_len {
            return Err(Error::Value(format!(
                "tensor {}: {} host bytes for a staged span of {span_len} bytes",
                a.name,
                host.len()
            )));
        }
        self.span_copy(arg, |dst| {
            dst.copy_from_slice(host);
            Ok(())
        })?;
        let a = &mut self.args[arg as usize];
        a.span_copy.from_host = true;
        a.resolved = None;
        Ok(())
    }

    /// Whether a staged or scratch argument reached through a mapping should read from a host
    /// copy of its span instead: it has one already, or the worker's policy says its reads this
    /// run are to come from a copy; not after a copy could not be made this run.
    fn span_copy_pays(&self, arg: u32, mem: &Memory) -> bool {
        let a = &self.args[arg as usize];
        let c = &a.span_copy;
        let (_, span_len) = a.span().unwrap_or_default();
        c.mem.is_some()
            || !c.failed
                && mem
                    .views
                    .policy
                    .reads_from_copy(span_len, c.reads, &mem.views.auto_model())
    }

    /// The resolution of staged or scratch argument `arg` through a per-run host copy of its
    /// span, filled by one bulk read out of `map` (the arena's mapping, the arena at `offset`);
    /// writes go through the mapping too. `None` when the copy cannot be made: it is an
    /// optimization, so the mapping keeps serving (for the rest of the run), with a warning.
    fn copy_of_mapped_span(
        &mut self,
        arg: u32,
        map: &Arc<HostMem>,
        offset: usize,
        base: DevPtr,
        epoch: u64,
    ) -> Option<Resolved> {
        let a = &self.args[arg as usize];
        let name = a.name.clone();
        let (span_start, _) = a.span().unwrap_or_default();
        let map_offset = offset + (span_start - base.0) as usize;
        let made = self.span_copy(arg, |dst| {
            map.read(map_offset, dst)
                .map_err(|e| Error::host_view(&name, span_start, dst.len() as u64, e))
        });
        let (copy, filled) = match made {
            Ok(made) => made,
            Err(e) => {
                log::warn!("{e}; reading through the mapping instead");
                self.args[arg as usize].span_copy.failed = true;
                return None;
            }
        };
        if filled {
            // A bulk read out of a mapping, priced like a cache fill.
            self.events.cache_fills += 1;
            self.events.cache_fill_bytes += copy.len() as u64;
        }
        Some(Resolved {
            mem: copy,
            dev_start: span_start,
            host_start: 0,
            via: Via::Through(map.clone(), map_offset),
            epoch,
            pending_reads: 0,
        })
    }

    /// The run's host copy of staged or scratch argument `arg`'s span, made (and filled by
    /// `fill`) on first use, and counted as a staged view copy; `true` when made by this call.
    fn span_copy(
        &mut self,
        arg: u32,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<(Arc<HostMem>, bool)> {
        let a = &mut self.args[arg as usize];
        if let Some(c) = &a.span_copy.mem {
            return Ok((c.clone(), false));
        }
        let (span_start, span_len) = a.span().unwrap_or_default();
        let m = HostMem::new(span_len as usize, 0).map_err(|e| {
            Error::Value(format!(
                "tensor {}: cannot allocate a host copy of its span ({span_len} bytes at \
                 {span_start:#x}): {e}",
                a.name
            ))
        })?;
        m.with_slice_mut(0, span_len as usize, fill)
            .map_err(|e| Error::host(&a.name, e))??;
        let m = Arc::new(m);
        a.span_copy.mem = Some(m.clone());
        self.report.counters.staged_view_copies += 1;
        Ok((m, true))
    }

    /// Counts `n` element reads through the mapping of `arg`'s allocation, and every so often
    /// notes them (which may give the argument a host copy: the next access resolves again).
    fn mapped_reads(&mut self, mem: &mut Memory, arg: u32, n: u64) -> Result<()> {
        self.report.counters.mapped_reads += n;
        let Some(r) = self.args[arg as usize].resolved.as_mut() else {
            return Ok(());
        };
        r.pending_reads += n;
        if r.pending_reads < NOTE_READS_EVERY {
            return Ok(());
        }
        let pending = std::mem::take(&mut r.pending_reads);
        self.note_reads(mem, arg, pending)?;
        Ok(())
    }

    /// Notes `n` reads through the mapping of `arg`'s allocation *before* they are made; returns
    /// whether they are now to be served from a host copy (and `arg` must be resolved again).
    fn note_reads_first(&mut self, mem: &mut Memory, arg: u32, n: u64) -> Result<bool> {
        let Some(r) = self.args[arg as usize].resolved.as_mut() else {
            return Ok(false);
        };
        let pending = std::mem::take(&mut r.pending_reads);
        self.note_reads(mem, arg, pending + n)
    }

    /// Notes `reads` through the mapping of `arg`'s allocation: a resident allocation's view
    /// cache may turn the mapping into a cached view; a staged or scratch argument may pass the
    /// point where a copy of its span pays. Returns whether `arg` must be resolved again.
    fn note_reads(&mut self, mem: &mut Memory, arg: u32, reads: u64) -> Result<bool> {
        let a = &mut self.args[arg as usize];
        let (Some(_), Some((base, _))) = (&a.resolved, a.alloc) else {
            return Ok(false);
        };
        let switched = if matches!(a.kind, ArgKind::Device) {
            let mut ev = ViewEvents::default();
            let switched = mem.views.note_mapped_reads(base, reads, &a.name, &mut ev)?;
            self.events.add(ev);
            switched
        } else {
            a.span_copy.reads += reads;
            self.span_copy_pays(arg, mem)
        };
        if switched {
            self.args[arg as usize].resolved = None;
        }
        Ok(switched)
    }

    /// The error for a host access (`who`: the tensor, or the copy) of `len` bytes at `addr`
    /// that conflicts with task `c.task`.
    fn hazard(&self, who: &str, c: &Conflict, write: bool, len: u64, addr: u64) -> Error {
        let (verb, task_does) = if write {
            ("writing", if c.writes { "writes" } else { "reads" })
        } else {
            ("reading", "writes")
        };
        let why = if write {
            "so the task would see the wrong bytes"
        } else {
            "so this read would see stale bytes"
        };
        Error::Hazard(format!(
            "{who}: {verb} {len} bytes at {addr:#x}, which task {} (kernel {}) submitted earlier \
             in this run {task_does}; tasks execute after orchestration, {why}",
            c.task,
            self.tasks.kernel_name(c.task)
        ))
    }

    /// Refuses a host copy into (`write`) or out of bytes `[offset, offset + len)` of the
    /// allocation at `base` (`what`: `copy_to` / `copy_from`) while a task of this run that
    /// reads or writes them is pending: the task runs after orchestration, so the copy would
    /// change its input, or read bytes it is about to write. Copies outside orchestration, or
    /// into allocations the run does not bind, are not this run's business.
    pub(crate) fn check_host_copy(
        &mut self,
        base: DevPtr,
        offset: u64,
        len: u64,
        write: bool,
        what: &str,
    ) -> Result<()> {
        if self.stage != Stage::Orchestrate || len == 0 {
            return Ok(());
        }
        let Some(a) = self
            .args
            .iter()
            .find(|a| a.alloc.is_some_and(|(p, _)| p == base))
        else {
            return Ok(());
        };
        let (region, name) = (a.region, a.name.clone());
        let access = Geometry::new(&what, DType::U8, &[len], None, offset)?;
        let args = &self.args;
        let place = |i: u32| {
            let a = &args[i as usize];
            a.alloc.map(|(p, _)| (a.region, p.0))
        };
        match self
            .hazards
            .conflict(region, &access, write, &self.tasks, &place)
        {
            Some(c) => {
                let dir = if write { "into" } else { "out of" };
                let who = format!("{what} {dir} the buffer of tensor {name}");
                Err(self.hazard(&who, &c, write, len, base.0 + offset))
            }
            None => Ok(()),
        }
    }

    /// Whether an access to argument `arg` reaches its bytes without bulk work: its view is
    /// resolved for the view cache's current epoch (no view to establish, no mirror or cache to
    /// refresh). A host releases its interpreter lock for the other accesses.
    pub(crate) fn is_resolved(&self, mem: &Memory, arg: u32) -> bool {
        let epoch = mem.views.epoch();
        self.args
            .get(arg as usize)
            .and_then(|a| a.resolved.as_ref())
            .is_some_and(|r| r.epoch == epoch)
    }

    /// The resolution `locate` just made for `arg`.
    fn resolved(&self, arg: u32) -> &Resolved {
        match &self.args[arg as usize].resolved {
            Some(r) => r,
            None => unreachable!("locate resolves the argument"),
        }
    }

    /// `get_tensor_data` on the hot path: the element at `index` of `view` (a view of argument
    /// `arg`) when everything is in place — the run orchestrating, the argument resolved for
    /// the view cache's epoch, the index inside the view, the element inside the argument, no
    /// task submitted earlier writing it. `None` otherwise: [`RunState::read`] then does the
    /// same checks in the same order, and reports what failed (or establishes the view).
    /// Nothing is counted unless the read is made here.
    #[inline]
    pub(crate) fn read_quick(
        &mut self,
        mem: &mut Memory,
        arg: u32,
        view: &Geometry,
        index: &[i64],
    ) -> Option<Result<Value>> {
        if self.stage != Stage::Orchestrate {
            return None;
        }
        let epoch = mem.views.epoch();
        let a = self.args.get(arg as usize)?;
        let r = a.resolved.as_ref().filter(|r| r.epoch == epoch)?;
        let (base, _) = a.alloc?;
        let byte = view.byte_offset_of(&a.name, index).ok()?;
        let dtype = view.dtype();
        let es = dtype.size();
        let addr = base.0.checked_add(byte)?;
        let (s, l) = a.span()?;
        if !span_contains(s, l, addr, es) {
            return None;
        }
        let args = &self.args;
        let place = |i: u32| {
            let a = &args[i as usize];
            a.alloc.map(|(p, _)| (a.region, p.0))
        };
        let element = Geometry::element_at(dtype, byte / es);
        if self
            .hazards
            .conflict(a.region, &element, false, &self.tasks, &place)
            .is_some()
        {
            return None;
        }
        let buf = r.mem.read_element(r.host_offset(addr), es as usize).ok()?;
        let mapped = r.mapped();
        self.report.counters.orch_reads += 1;
        if mapped {
            if let Err(e) = self.mapped_reads(mem, arg, 1) {
                return Some(Err(e));
            }
        }
        Some(Ok(dtype.decode_word(buf)))
    }

    /// `get_tensor_data`: the element at `index` of `view` (a view of argument `arg`).
    pub(crate) fn read(
        &mut self,
        mem: &mut Memory,
        arg: u32,
        view: &Geometry,
        index: &[i64],
    ) -> Result<Value> {
        let element = view.element(&self.arg(arg)?.name, index)?;
        let addr = self.locate(mem, arg, &element, false)?;
        let r = self.resolved(arg);
        let es = view.dtype().size() as usize;
        let buf = r
            .mem
            .read_element(r.host_offset(addr), es)
            .map_err(|e| Error::host_view(&self.args[arg as usize].name, addr, es as u64, e))?;
        let mapped = r.mapped();
        self.report.counters.orch_reads += 1;
        if mapped {
            self.mapped_reads(mem, arg, 1)?;
        }
        Ok(view.dtype().decode(&buf[..es]))
    }

    /// `set_tensor_data`: writes `value` at `index`; mirrors and staged copies push the element to
    /// the device at once.
    pub(crate) fn write(
        &mut self,
        mem: &mut Memory,
        arg: u32,
        view: &Geometry,
        index: &[i64],
        value: Value,
    ) -> Result<()> {
        let name = self.arg(arg)?.name.clone();
        let element = view.element(&name, index)?;
        let es = view.dtype().size() as usize;
        let mut buf = [0u8; 8];
        view.dtype()
            .encode(value, &mut buf[..es])
            .map_err(|e| match e {
                Error::Value(m) => Error::Value(format!("tensor {name}: {m}")),
                Error::Type(m) => Error::Type(format!("tensor {name}: {m}")),
                other => other,
            })?;
        let addr = self.locate(mem, arg, &element, true)?;
        let r = self.resolved(arg);
        if let Via::Through(map, offset) = &r.via {
            // A host copy of a mapping: the write goes to the device through the mapping first,
            // so a failed one leaves the copy equal to the device.
            map.write(offset + (addr - r.dev_start) as usize, &buf[..es])
                .map_err(|e| Error::host_view(&name, addr, es as u64, e))?;
        }
        r.mem
            .write(r.host_offset(addr), &buf[..es])
            .map_err(|e| Error::host_view(&name, addr, es as u64, e))?;
        let crosses_bus = matches!(r.via, Via::Mapping | Via::Through(..));
        if let via @ (Via::Mirror | Via::SpanCopy) = &r.via {
            let mirror = matches!(via, Via::Mirror);
            // A mirror is the allocation's own (page-locked where the driver pins mirrors): the
            // push is queued on the stream, behind device work a run left pending and before the
            // tasks of this run, without waiting for either. A span copy is the run's, pushed
            // at once.
            let pushed = if mirror {
                mem.dev
                    .copy_h2d_async(DevPtr(addr), &r.mem, r.host_offset(addr), es)
            } else {
                mem.dev.copy_h2d(DevPtr(addr), &buf[..es])
            };
            if let Err(e) = pushed {
                // The host copy now differs from the device: a mirror refreshes on its next read,
                // a span copy is dropped and re-read from the device on the next access.
                let a = &mut self.args[arg as usize];
                if mirror {
                    if let Some((base, _)) = a.alloc {
                        mem.views.mark_stale(base);
                    }
                } else {
                    a.resolved = None;
                    a.span_copy.mem = None;
                    a.span_copy.from_host = false;
                }
                return Err(Error::device(Phase::Orchestrate, Some(&name), e));
            }
        }
        if crosses_bus {
            self.report.counters.mapped_writes += 1;
        }
        self.report.counters.orch_writes += 1;
        Ok(())
    }

    /// `read_tensor`: a host window over the view's bytes. Zero-copy over a mapping of host-owned
    /// memory, a fresh mirror, or a staged copy; a copy over a vendor mapping (which can be
    /// revoked).
    pub(crate) fn read_window(
        &mut self,
        mem: &mut Memory,
        arg: u32,
        view: &Geometry,
    ) -> Result<HostWindow> {
        let name = self.arg(arg)?.name.clone();
        let extent = view.extent();
        let rebased = view.rebased();
        if extent == 0 {
            self.expect(
                Stage::Orchestrate,
                "tensor data is accessible only during orchestration",
            )?;
            return HostWindow::empty(rebased, false, &name);
        }
        let mut addr = self.locate(mem, arg, view, false)?;
        self.report.counters.orch_reads += 1;
        if self.resolved(arg).mapped() {
            // numpy reads every element of the window through the mapping: a window this large
            // may turn the mapping into a cached view first, and then it is served from the cache.
            let n: u64 = view.shape().iter().product();
            if self.note_reads_first(mem, arg, n)? {
                addr = self.locate(mem, arg, view, false)?;
            } else {
                self.report.counters.mapped_reads += n;
            }
        }
        let r = self.resolved(arg);
        let offset = r.host_offset(addr);
        let window = if r.zero_copy() {
            HostWindow {
                mem: r.mem.clone(),
                offset,
                len: extent as usize,
                geometry: rebased,
                zero_copy: true,
                writable: false,
            }
        } else {
            let copy = HostMem::new(extent as usize, 0).map_err(|e| Error::host(&name, e))?;
            r.mem
                .with_slice(offset, extent as usize, |s| copy.write(0, s))
                .map_err(|e| Error::host_view(&name, addr, extent, e))?
                .map_err(|e| Error::host(&name, e))?;
            HostWindow {
                mem: Arc::new(copy),
                offset: 0,
                len: extent as usize,
                geometry: rebased,
                zero_copy: false,
                writable: false,
            }
        };
        Ok(window)
    }
}
