//! Execute: tasks run in submission order. On a driver whose device memory is host memory (sim)
//! a kernel's buffers are that memory itself; elsewhere they are host copies (one D2H per tensor
//! before the kernel, the outputs written back after it; a non-dense view writes back only its
//! own elements). When execution ends, the mirror of every allocation a task may have written
//! goes stale, once, however many tasks wrote it.

use std::sync::Arc;

use simpler_driver::{DevPtr, HostMem};

use crate::error::{Error, Phase, Result};
use crate::memory::Memory;
use crate::run::state::{ArgKind, HostWindow, PendingCopy, RunState, Stage, TaskCall};

impl RunState {
    /// Ends orchestration; returns the number of tasks to run.
    pub(crate) fn begin_execute(&mut self) -> Result<u64> {
        self.expect(Stage::Orchestrate, "execute already started")?;
        self.report.phases.orchestrate = self.lap();
        self.stage = Stage::Execute;
        Ok(self.tasks.len())
    }

    /// Fills `call` with the next task (its kernel, scalars and one window per tensor); false
    /// after the last task.
    pub(crate) fn next_task(&mut self, mem: &Memory, call: &mut TaskCall) -> Result<bool> {
        self.expect(Stage::Execute, "tasks run only during execute")?;
        self.pending.clear();
        let Some((task, kernel, scalars)) = self.tasks.next(&mut self.exec, &mut call.tensors)
        else {
            return Ok(false);
        };
        call.task = task;
        call.kernel = kernel;
        call.scalars.clear();
        call.scalars.extend_from_slice(scalars);
        call.buffers.clear();
        call.names.clear();
        call.needs_finish = false;
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

    /// After a task ran on host copies: pushes its outputs back to the device.
    pub(crate) fn finish_task(&mut self, mem: &Memory) -> Result<()> {
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

    /// Ends execution (`ok == false` when a task failed). The mirror of every resident argument
    /// the callable declares OUT/INOUT, and of every allocation a task wrote, goes stale.
    pub(crate) fn end_execute(&mut self, mem: &mut Memory, ok: bool) {
        self.pending.clear();
        if !ok {
            self.failed = true;
        }
        let declared = self
            .args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Device) && a.dir.writes())
            .filter_map(|a| a.alloc.map(|(p, _)| p));
        let written = self
            .tasks
            .written_args()
            .into_iter()
            .filter_map(|i| self.args[i as usize].alloc.map(|(p, _)| p));
        for p in declared.chain(written) {
            mem.views.mark_stale(p);
        }
        if self.stage == Stage::Orchestrate {
            self.report.phases.orchestrate = self.lap();
        } else {
            self.report.phases.execute = self.lap();
        }
        self.stage = Stage::Executed;
    }
}
