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
use crate::run::state::{ArgKind, HostWindow, RunState, Stage};
use crate::views::{Means, ViewEvents};

/// Where an access lands: host bytes, plus the device address to push writes to.
struct Target {
    mem: Arc<HostMem>,
    offset: usize,
    push: Option<u64>,
    mirror_of: Option<DevPtr>,
    /// The bytes are this run's staged copy of the argument.
    staged_copy: bool,
    zero_copy: bool,
}

pub(crate) fn host_err(what: &str, e: simpler_driver::HostMemError) -> Error {
    Error::Value(format!("{what}: host view access failed: {e}"))
}

impl RunState {
    /// Resolves an access of `access` (a geometry relative to the allocation of argument `arg`),
    /// establishing the allocation's view on first use.
    fn locate(
        &mut self,
        mem: &mut Memory,
        arg: u32,
        access: &Geometry,
        write: bool,
    ) -> Result<Target> {
        self.expect(
            Stage::Orchestrate,
            "tensor data is accessible only during orchestration",
        )?;
        let a = self.arg(arg)?;
        let name = a.name.clone();
        let Some((base, bytes)) = a.alloc else {
            return Err(Error::NoHostView {
                addr: access.start_byte(),
                bytes: access.extent(),
                detail: format!("tensor {name} has no bytes"),
            });
        };
        let addr = base.0 + access.start_byte();
        let len = access.extent();
        let (s, l) = a.span().unwrap_or_default();
        if !span_contains(s, l, addr, len) {
            return Err(Error::NoHostView {
                addr,
                bytes: len,
                detail: format!("outside every view of this run (argument {arg}, tensor {name})"),
            });
        }
        let staged = !matches!(a.kind, ArgKind::Device);
        let region = a.region;
        if let Some(c) = self.hazards.conflict(region, access, write, &self.tasks) {
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
                "tensor {name}: {verb} {len} bytes at {addr:#x}, which task {} submitted earlier in \
                 this run {task_does}; tasks execute after orchestration, {why}",
                c.task
            )));
        }
        let mut ev = ViewEvents::default();
        let means = mem
            .views
            .ensure(&*mem.dev, base, bytes, !staged, &name, &mut ev);
        self.events.add(ev);
        let off_in_alloc = (addr - base.0) as usize;
        match means? {
            Means::Mapped { mem, offset } => Ok(Target {
                zero_copy: mem.owned_addr().is_some(),
                mem,
                offset: offset + off_in_alloc,
                push: None,
                mirror_of: None,
                staged_copy: false,
            }),
            Means::Mirror { mem, .. } => Ok(Target {
                mem,
                offset: off_in_alloc,
                push: Some(addr),
                mirror_of: Some(base),
                staged_copy: false,
                zero_copy: true,
            }),
            Means::Refused => {
                let a = &mut self.args[arg as usize];
                let (span_start, span_len) = a.span().unwrap_or_default();
                let (ArgKind::Staged { copy, .. } | ArgKind::Scratch { copy }) = &mut a.kind else {
                    return Err(Error::State(format!(
                        "tensor {name}: the driver refused a view of a device allocation"
                    )));
                };
                if copy.is_none() {
                    let m = HostMem::new(span_len as usize, 0).map_err(|e| host_err(&name, e))?;
                    m.with_slice_mut(0, span_len as usize, |d| {
                        mem.dev.copy_d2h(d, DevPtr(span_start))
                    })
                    .map_err(|e| host_err(&name, e))?
                    .map_err(|e| Error::device(Phase::Orchestrate, Some(&name), e))?;
                    *copy = Some(Arc::new(m));
                    self.report.counters.staged_view_copies += 1;
                }
                Ok(Target {
                    mem: copy.clone().unwrap_or_else(|| unreachable!("filled above")),
                    offset: (addr - span_start) as usize,
                    push: Some(addr),
                    mirror_of: None,
                    staged_copy: true,
                    zero_copy: true,
                })
            }
        }
    }

    /// The name of argument `arg` (for messages).
    fn arg_name(&self, arg: u32) -> Result<Arc<str>> {
        Ok(self.arg(arg)?.name.clone())
    }

    /// `get_tensor_data`: the element at `index` of `view` (a view of argument `arg`).
    pub(crate) fn read(
        &mut self,
        mem: &mut Memory,
        arg: u32,
        view: &Geometry,
        index: &[i64],
    ) -> Result<Value> {
        let name = self.arg_name(arg)?;
        let element = view.element(&name, index)?;
        let t = self.locate(mem, arg, &element, false)?;
        let es = view.dtype().size() as usize;
        let mut buf = [0u8; 8];
        t.mem
            .read(t.offset, &mut buf[..es])
            .map_err(|e| host_err(&name, e))?;
        self.report.counters.orch_reads += 1;
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
        let name = self.arg_name(arg)?;
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
        let t = self.locate(mem, arg, &element, true)?;
        t.mem
            .write(t.offset, &buf[..es])
            .map_err(|e| host_err(&name, e))?;
        if let Some(dst) = t.push {
            if let Err(e) = mem.dev.copy_h2d(DevPtr(dst), &buf[..es]) {
                // The host copy now differs from the device: a mirror refreshes on its next read,
                // a staged copy is dropped and re-read from the device on the next access.
                if let Some(m) = t.mirror_of {
                    mem.views.mark_stale(m);
                }
                if t.staged_copy {
                    if let ArgKind::Staged { copy, .. } | ArgKind::Scratch { copy } =
                        &mut self.args[arg as usize].kind
                    {
                        *copy = None;
                    }
                }
                return Err(Error::device(Phase::Orchestrate, Some(&name), e));
            }
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
        let name = self.arg_name(arg)?;
        let extent = view.extent();
        let rebased = view.rebased();
        if extent == 0 {
            self.expect(
                Stage::Orchestrate,
                "tensor data is accessible only during orchestration",
            )?;
            let m = Arc::new(HostMem::new(1, 0).map_err(|e| host_err(&name, e))?);
            return Ok(HostWindow {
                mem: m,
                offset: 0,
                len: 0,
                geometry: rebased,
                zero_copy: false,
                writable: false,
            });
        }
        let t = self.locate(mem, arg, view, false)?;
        self.report.counters.orch_reads += 1;
        if t.zero_copy {
            return Ok(HostWindow {
                mem: t.mem,
                offset: t.offset,
                len: extent as usize,
                geometry: rebased,
                zero_copy: true,
                writable: false,
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
            writable: false,
        })
    }
}
