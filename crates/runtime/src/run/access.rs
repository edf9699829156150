//! Orchestrator data access: `get_tensor_data`, `set_tensor_data` and `read_tensor` on the
//! arguments of the run in progress.
//!
//! An access is resolved against the argument it is made through: the bytes must lie inside that
//! argument's extent (else `NoHostView`, never a raw dereference), must not conflict with a task
//! submitted earlier in the run (else `Hazard`), and are reached through the allocation's host
//! view, established on first use (see `views.rs`). A staged argument whose arena the driver
//! refuses to map gets a per-run copy of its own span instead; writes through a mirror or a copy
//! are pushed to the device at once.

use std::sync::Arc;

use simpler_driver::{DevPtr, HostMem};

use crate::dtype::Value;
use crate::error::{Error, Phase, Result};
use crate::geometry::{span_contains, Geometry};
use crate::memory::Memory;
use crate::run::state::{ArgKind, HostWindow, Resolved, RunState, Stage};
use crate::views::{Means, ViewEvents};

/// Reads through a mapping are reported to the view cache in batches of this many.
const NOTE_READS_EVERY: u64 = 16;

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
            return Err(Error::Hazard(format!(
                "tensor {}: {verb} {len} bytes at {addr:#x}, which task {} (kernel {}) submitted \
                 earlier in this run {task_does}; tasks execute after orchestration, {why}",
                a.name,
                c.task,
                self.tasks.kernel_name(c.task)
            )));
        }
        let epoch = mem.views.epoch();
        if a.resolved.as_ref().is_some_and(|r| r.epoch == epoch) {
            return Ok(addr);
        }
        let staged = !matches!(a.kind, ArgKind::Device);
        let name = a.name.clone();
        let mut ev = ViewEvents::default();
        let means = mem
            .views
            .ensure(&*mem.dev, base, bytes, !staged, &name, &mut ev);
        self.events.add(ev);
        let resolved = match means? {
            Means::Mapped { mem: m, offset } => Resolved {
                zero_copy: m.owned_addr().is_some(),
                mem: m,
                dev_start: base.0,
                host_start: offset,
                push: false,
                mirror_of: None,
                staged_copy: false,
                epoch,
                mapped: true,
                through: None,
                base,
                pending_reads: 0,
            },
            Means::Mirror { mem: m, .. } => Resolved {
                mem: m,
                dev_start: base.0,
                host_start: 0,
                push: true,
                mirror_of: Some(base),
                staged_copy: false,
                zero_copy: true,
                epoch,
                mapped: false,
                through: None,
                base,
                pending_reads: 0,
            },
            Means::Cached {
                map, offset, cache, ..
            } => Resolved {
                mem: cache,
                dev_start: base.0,
                host_start: 0,
                push: false,
                mirror_of: None,
                staged_copy: false,
                zero_copy: true,
                epoch,
                mapped: false,
                through: Some((map, offset)),
                base,
                pending_reads: 0,
            },
            Means::Refused => {
                // A staged tensor on a driver that refuses to map the staging allocation: a
                // per-run copy of its own span, filled once from the device.
                let a = &mut self.args[arg as usize];
                let (span_start, span_len) = a.span().unwrap_or_default();
                let (ArgKind::Staged { copy, .. } | ArgKind::Scratch { copy }) = &mut a.kind else {
                    return Err(Error::State(format!(
                        "tensor {name}: the driver refused a view of a device allocation"
                    )));
                };
                if copy.is_none() {
                    let m =
                        HostMem::new(span_len as usize, 0).map_err(|e| Error::host(&name, e))?;
                    m.with_slice_mut(0, span_len as usize, |d| {
                        mem.dev.copy_d2h(d, DevPtr(span_start))
                    })
                    .map_err(|e| Error::host(&name, e))?
                    .map_err(|e| Error::device(Phase::Orchestrate, Some(&name), e))?;
                    *copy = Some(Arc::new(m));
                    self.report.counters.staged_view_copies += 1;
                }
                Resolved {
                    mem: copy.clone().unwrap_or_else(|| unreachable!("filled above")),
                    dev_start: span_start,
                    host_start: 0,
                    push: true,
                    mirror_of: None,
                    staged_copy: true,
                    zero_copy: true,
                    epoch,
                    mapped: false,
                    through: None,
                    base,
                    pending_reads: 0,
                }
            }
        };
        self.args[arg as usize].resolved = Some(resolved);
        Ok(addr)
    }

    /// Counts `n` element reads through the mapping of `arg`'s allocation, and every so often
    /// tells the view cache (which may turn the mapping into a cached view: the next access
    /// resolves again).
    fn mapped_reads(&mut self, mem: &mut Memory, arg: u32, n: u64) -> Result<()> {
        self.report.counters.mapped_reads += n;
        let Some(r) = self.args[arg as usize].resolved.as_mut() else {
            return Ok(());
        };
        r.pending_reads += n;
        if r.pending_reads < NOTE_READS_EVERY {
            return Ok(());
        }
        let (base, pending) = (r.base, std::mem::take(&mut r.pending_reads));
        let name = self.args[arg as usize].name.clone();
        let mut ev = ViewEvents::default();
        let switched = mem.views.note_mapped_reads(base, pending, &name, &mut ev)?;
        self.events.add(ev);
        if switched {
            self.args[arg as usize].resolved = None;
        }
        Ok(())
    }

    /// Tells the view cache about `n` reads through the mapping of `arg`'s allocation *before*
    /// they are made; returns whether it turned the mapping into a cached view (the reads are
    /// then served from the cache, and `arg` must be resolved again).
    fn note_reads_first(&mut self, mem: &mut Memory, arg: u32, n: u64) -> Result<bool> {
        let Some(r) = self.args[arg as usize].resolved.as_mut() else {
            return Ok(false);
        };
        let (base, pending) = (r.base, std::mem::take(&mut r.pending_reads));
        let name = self.args[arg as usize].name.clone();
        let mut ev = ViewEvents::default();
        let switched = mem
            .views
            .note_mapped_reads(base, pending + n, &name, &mut ev)?;
        self.events.add(ev);
        if switched {
            self.args[arg as usize].resolved = None;
        }
        Ok(switched)
    }

    /// The resolution `locate` just made for `arg`.
    fn resolved(&self, arg: u32) -> &Resolved {
        match &self.args[arg as usize].resolved {
            Some(r) => r,
            None => unreachable!("locate resolves the argument"),
        }
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
        let mut buf = [0u8; 8];
        r.mem
            .read(r.host_offset(addr), &mut buf[..es])
            .map_err(|e| Error::host_view(&self.args[arg as usize].name, addr, es as u64, e))?;
        let mapped = r.mapped;
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
        r.mem
            .write(r.host_offset(addr), &buf[..es])
            .map_err(|e| Error::host_view(&name, addr, es as u64, e))?;
        if let Some((map, offset)) = &r.through {
            // A cached view: the write goes to the device through the mapping, too.
            map.write(offset + (addr - r.dev_start) as usize, &buf[..es])
                .map_err(|e| Error::host_view(&name, addr, es as u64, e))?;
        }
        let crosses_bus = r.mapped || r.through.is_some();
        if r.push {
            let (mirror_of, staged_copy) = (r.mirror_of, r.staged_copy);
            if let Err(e) = mem.dev.copy_h2d(DevPtr(addr), &buf[..es]) {
                // The host copy now differs from the device: a mirror refreshes on its next read,
                // a staged copy is dropped and re-read from the device on the next access.
                if let Some(m) = mirror_of {
                    mem.views.mark_stale(m);
                }
                if staged_copy {
                    let a = &mut self.args[arg as usize];
                    a.resolved = None;
                    if let ArgKind::Staged { copy, .. } | ArgKind::Scratch { copy } = &mut a.kind {
                        *copy = None;
                    }
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
            let m = Arc::new(HostMem::new(1, 0).map_err(|e| Error::host(&name, e))?);
            return Ok(HostWindow {
                mem: m,
                offset: 0,
                len: 0,
                geometry: rebased,
                zero_copy: false,
                writable: false,
            });
        }
        let mut addr = self.locate(mem, arg, view, false)?;
        self.report.counters.orch_reads += 1;
        if self.resolved(arg).mapped {
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
        let window = if r.zero_copy {
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
