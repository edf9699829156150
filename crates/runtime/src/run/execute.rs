//! Execute: tasks run in submission order. A batch of device code is launched natively
//! (`launch.rs`) when execution reaches it. A host task's buffers are, on a driver whose device
//! memory is host memory (sim), that memory itself; elsewhere host copies (one D2H per tensor
//! before the kernel, the outputs written back after it; a non-dense view writes back only its
//! own elements), counted as host-path tasks. When execution ends, the host waits for the
//! device once, and the mirror of every allocation a task may have written goes stale, once,
//! however many tasks wrote it.

use std::sync::Arc;

use simpler_driver::{DevPtr, HostMem};

use crate::error::{Error, Phase, Result};
use crate::memory::Memory;
use crate::run::state::{ArgKind, HostWindow, PendingCopy, RunState, Stage, TaskCall};
use crate::run::tasks::Next;

impl RunState {
    /// Ends orchestration; returns the number of tasks to run.
    pub(crate) fn begin_execute(&mut self) -> Result<u64> {
        self.expect(Stage::Orchestrate, "execute already started")?;
        self.report.phases.orchestrate = self.lap();
        self.stage = Stage::Execute;
        Ok(self.tasks.len())
    }

    /// Launches the batches of device code up to the next host task, and fills `call` with
    /// that task (its kernel, scalars and one window per tensor); false after the last task.
    pub(crate) fn next_task(&mut self, mem: &mut Memory, call: &mut TaskCall) -> Result<bool> {
        self.expect(Stage::Execute, "tasks run only during execute")?;
        self.pending.clear();
        self.device_task = false;
        let (task, kernel, scalars, device_arrays) = loop {
            match self.tasks.next(&mut self.exec, &mut call.tensors) {
                None => return Ok(false),
                Some(Next::Task(t, k, s, d)) => break (t, k, s, d),
                Some(Next::Device(batch)) => self.launch_batch(mem, batch)?,
            }
        };
        let on_device = device_arrays && !mem.dev.has_kernel_memory() && mem.dev.runs_device_code();
        if !mem.dev.has_kernel_memory() && !on_device {
            self.report.counters.host_path_tasks += 1;
        }
        call.task = task;
        call.kernel = kernel;
        call.scalars.clear();
        call.scalars.extend_from_slice(scalars);
        call.buffers.clear();
        call.names.clear();
        call.needs_finish = false;
        call.on_device = on_device;
        call.device_views.clear();
        if on_device {
            return self.device_arrays_task(mem, call).map(|()| true);
        }
        for (slot, elem) in &call.tensors {
            let a = &self.args[slot.arg as usize];
            call.names.push(a.name.clone());
            let g = slot.geometry.at_offset(*elem);
            let extent = g.extent();
            let rebased = g.rebased();
            let writable = slot.dir.writes();
            let base = match a.alloc {
                Some((p, _)) if extent > 0 => p,
                _ => {
                    call.buffers
                        .push(HostWindow::empty(rebased, writable, &a.name)?);
                    continue;
                }
            };
            let addr = base.0 + g.start_byte();
            if let Some((m, offset)) = mem.dev.kernel_memory(DevPtr(addr), extent) {
                call.buffers.push(HostWindow {
                    mem: m,
                    offset,
                    len: extent as usize,
                    geometry: rebased,
                    zero_copy: true,
                    writable,
                });
                continue;
            }
            let m = HostMem::new(extent as usize, 0).map_err(|e| Error::host(&a.name, e))?;
            m.with_slice_mut(0, extent as usize, |d| mem.dev.copy_d2h(d, DevPtr(addr)))
                .map_err(|e| Error::host(&a.name, e))?
                .map_err(|e| Error::device(Phase::Execute, Some(&a.name), e))?;
            let m = Arc::new(m);
            if writable {
                call.needs_finish = true;
                self.pending.push(PendingCopy {
                    addr,
                    mem: m.clone(),
                    dir: slot.dir,
                    name: a.name.clone(),
                    geometry: rebased,
                });
            }
            call.buffers.push(HostWindow {
                mem: m,
                offset: 0,
                len: extent as usize,
                geometry: rebased,
                zero_copy: false,
                writable,
            });
        }
        Ok(true)
    }

    /// A task whose host function takes device arrays: the device addresses of its views, after
    /// the work enqueued before it has run (its inputs are ready, whatever stream the function
    /// uses).
    fn device_arrays_task(&mut self, mem: &Memory, call: &mut TaskCall) -> Result<()> {
        for (slot, elem) in &call.tensors {
            let a = &self.args[slot.arg as usize];
            call.names.push(a.name.clone());
            let g = slot.geometry.at_offset(*elem);
            let addr = match a.alloc {
                Some((p, _)) if g.numel() > 0 => p.0 + g.start_byte(),
                _ => 0,
            };
            call.device_views
                .push((addr, g.rebased(), slot.dir.writes()));
        }
        mem.dev
            .synchronize()
            .map_err(|e| Error::device(Phase::Execute, None, e))?;
        self.device_task = true;
        call.needs_finish = true;
        Ok(())
    }

    /// After a task ran on host copies: pushes its outputs back to the device. After a task
    /// over device arrays: waits until the work it enqueued (on any stream) has run.
    pub(crate) fn finish_task(&mut self, mem: &Memory) -> Result<()> {
        if std::mem::take(&mut self.device_task) {
            return mem
                .dev
                .synchronize_device()
                .map_err(|e| Error::device(Phase::Execute, None, e));
        }
        for c in self.pending.drain(..).filter(|c| c.dir.writes()) {
            let dev_err = |e| Error::device(Phase::Execute, Some(&c.name), e);
            let r = if c.geometry.is_dense() {
                c.mem
                    .with_slice(0, c.mem.len(), |s| mem.dev.copy_h2d(DevPtr(c.addr), s))
                    .map_err(|e| Error::host(&c.name, e))?
            } else {
                // Only the view's elements go back: the bytes between them may belong to another
                // view of the same task, which has its own copy.
                let mut merged = vec![0u8; c.mem.len()];
                mem.dev
                    .copy_d2h(&mut merged, DevPtr(c.addr))
                    .map_err(dev_err)?;
                c.mem
                    .with_slice(0, c.mem.len(), |s| c.geometry.copy_elements(s, &mut merged))
                    .map_err(|e| Error::host(&c.name, e))?;
                mem.dev.copy_h2d(DevPtr(c.addr), &merged)
            };
            r.map_err(dev_err)?;
        }
        Ok(())
    }

    /// Whether the run may be left pending (`pending.rs`) instead of waiting for the device:
    /// execution went through its last task without a failure, device code was launched, and no
    /// argument is staged.
    pub(crate) fn can_leave_pending(&self) -> bool {
        self.stage == Stage::Execute
            && !self.failed
            && self.pending.is_empty()
            && !self.device_task
            && self.report.counters.device_launches > 0
            && !self
                .args
                .iter()
                .any(|a| matches!(a.kind, ArgKind::Staged { .. }))
    }

    /// The bytes the run's tasks touch, per argument: `(start, end, written)`.
    pub(crate) fn touched(&self) -> Vec<(u64, u64, bool)> {
        let mut out: Vec<(u32, bool)> = Vec::new();
        for i in 0..self.tasks.slot_count() {
            let s = self.tasks.slot(i);
            match out.iter_mut().find(|(a, _)| *a == s.arg) {
                Some((_, w)) => *w |= s.dir.writes(),
                None => out.push((s.arg, s.dir.writes())),
            }
        }
        out.into_iter()
            .filter_map(|(a, w)| {
                let (start, len) = self.args[a as usize].span()?;
                Some((start, start + len, w))
            })
            .collect()
    }

    /// The mirror of every allocation a task wrote goes stale, once, however many tasks wrote
    /// it. Only tasks write device memory during a run (an orchestrator write goes through the
    /// mirror itself), so a resident argument declared OUT or INOUT that no task wrote keeps its
    /// mirror: a control tensor the orchestration advances itself is read again from the host.
    pub(crate) fn mark_written_stale(&self, mem: &mut Memory) {
        for i in self.tasks.written_args() {
            if let Some((p, _)) = self.args[i as usize].alloc {
                mem.views.mark_stale(p);
            }
        }
    }

    /// Ends execution (`ok == false` when a task failed): waits for the device once when
    /// device code was launched (a fault of a launch reports here). The mirror of every
    /// allocation a task wrote goes stale ([`RunState::mark_written_stale`]).
    pub(crate) fn end_execute(&mut self, mem: &mut Memory, ok: bool) -> Result<()> {
        self.pending.clear();
        let mut waited = Ok(());
        // A device-array kernel that failed may have left work on streams of its own.
        if std::mem::take(&mut self.device_task) {
            if let Err(e) = mem.dev.synchronize_device() {
                log::error!("waiting for the device after a failed device-array kernel: {e}");
            }
        }
        if self.report.counters.device_launches > 0 {
            let t0 = std::time::Instant::now();
            waited = mem.dev.synchronize().map_err(|mut e| {
                e.detail = format!(
                    "{} ({} launch(es) of device code in this run)",
                    e.detail, self.report.counters.device_launches
                );
                Error::device(Phase::Execute, None, e)
            });
            self.report.counters.execute_wait_ns =
                u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            // Read (or, after a failure, discard) this run's timed groups, so none is left for
            // the next run to count.
            match mem.dev.take_device_time() {
                Ok(ns) if waited.is_ok() => self.report.counters.device_ns = ns.unwrap_or(0),
                Ok(_) => {}
                Err(e) if waited.is_ok() => {
                    log::warn!("reading the device time of the run's launches: {e}")
                }
                Err(_) => {}
            }
        }
        if !ok || waited.is_err() {
            self.failed = true;
        }
        self.mark_written_stale(mem);
        if self.stage == Stage::Orchestrate {
            self.report.phases.orchestrate = self.lap();
        } else {
            self.report.phases.execute = self.lap();
            if !self.failed {
                self.price_execute(mem);
                // Pricing is the model's work, not the run's: outside every timed phase.
                self.lap();
            }
        }
        self.stage = Stage::Executed;
        waited
    }
}
