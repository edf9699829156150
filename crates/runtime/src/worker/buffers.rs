//! The worker's buffers and resident sets: allocation, copies, host views, exports.

use simpler_driver::DevPtr;

use super::{buffer_err, CloseSummary, Worker};
use crate::error::{Error, Phase, Result};
use crate::exports::ExportGuard;
use crate::geometry::Geometry;
use crate::memory::Owner;
use crate::run::Records;
use crate::spec::{BufferRef, Direction};

impl Worker {
    // ---- buffers -------------------------------------------------------------------------

    /// Allocates a user buffer of `bytes` (> 0).
    pub fn malloc(&mut self, bytes: u64) -> Result<BufferRef> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        if bytes == 0 {
            return Err(Error::Value(
                "malloc of 0 bytes: a device buffer needs at least 1 byte".into(),
            ));
        }
        self.mem.alloc(bytes, Owner::User, Phase::Buffer, None)
    }

    /// Frees a user buffer: its host view first, then the allocation.
    pub fn free(&mut self, buf: BufferRef) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        let info = self.mem.lookup(buf, &"free")?;
        match info.owner {
            Owner::User => {}
            Owner::Resident(_) => {
                return Err(Error::State(format!(
                    "free: buffer {} is owned by a ResidentTaskArgs; release that instead",
                    buf.ptr
                )))
            }
            _ => {
                return Err(Error::State(format!(
                    "free: buffer {} is owned by the worker",
                    buf.ptr
                )))
            }
        }
        self.mem.exports.refuse(buf.ptr, "free")?;
        if self.bound_to_run(buf.ptr) {
            return Err(Error::State(format!(
                "free: buffer {} is bound as an argument of the run in progress",
                buf.ptr
            )));
        }
        self.mem.settle_before_free().map_err(buffer_err)?;
        self.mem.release(buf.ptr).map_err(buffer_err)
    }

    /// [`Worker::free`] for the end of a buffer's scope (a context manager's exit): a buffer
    /// freed already, or one of a closed worker, is nothing to do (`Ok(false)`); every other
    /// refusal (owned by a resident set, bound to the run in progress) is an error as for
    /// `free`.
    pub fn free_if_live(&mut self, buf: BufferRef) -> Result<bool> {
        if self.closed || !self.mem.names_live(buf) {
            return Ok(false);
        }
        self.free(buf).map(|()| true)
    }

    /// Copies host bytes into a buffer at `offset`. A mirror of the buffer goes stale.
    pub fn copy_to(&mut self, buf: BufferRef, offset: u64, src: &[u8]) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        self.mem
            .check_span(buf, offset, src.len() as u64, "copy_to")?;
        if src.is_empty() {
            return Ok(());
        }
        if let Some(r) = self.run.as_mut() {
            r.check_host_copy(buf.ptr, offset, src.len() as u64, true, "copy_to")?;
        }
        self.mem.order_after_consumers().map_err(buffer_err)?;
        let r = self.mem.dev.copy_h2d(DevPtr(buf.ptr.0 + offset), src);
        // Even a failed copy may have moved some bytes.
        self.mem.views.mark_stale(buf.ptr);
        r.map_err(buffer_err)
    }

    /// Copies `dst.len()` bytes at `offset` of a buffer to the host.
    pub fn copy_from(&mut self, buf: BufferRef, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        self.mem
            .check_span(buf, offset, dst.len() as u64, "copy_from")?;
        if dst.is_empty() {
            return Ok(());
        }
        if let Some(r) = self.run.as_mut() {
            r.check_host_copy(buf.ptr, offset, dst.len() as u64, false, "copy_from")?;
        }
        self.mem.order_after_consumers().map_err(buffer_err)?;
        self.mem
            .dev
            .copy_d2h(dst, DevPtr(buf.ptr.0 + offset))
            .map_err(buffer_err)
    }

    /// Checks that `geometry` fits the live buffer (a device tensor over it).
    pub fn check_tensor(
        &self,
        buf: BufferRef,
        geometry: &Geometry,
        what: &dyn std::fmt::Display,
    ) -> Result<()> {
        self.check_open()?;
        self.mem.check_tensor(buf, geometry, what).map(|_| ())
    }

    /// The host-view mechanism of the buffer's allocation: `"mapping"`, `"mirror"`, or `None`.
    pub fn host_view_info(&self, buf: BufferRef) -> Result<Option<&'static str>> {
        self.mem.lookup(buf, &"host_view_info")?;
        Ok(self.mem.views.kind(buf.ptr))
    }

    /// Releases the staging arena and the scratch pool (e.g. after a one-off large run). Not
    /// during a run.
    pub fn trim_staging(&mut self) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        if self.run.is_some() {
            return Err(Error::State("trim_staging: a run is in progress".into()));
        }
        self.spare = Records::default();
        self.arena.trim(&mut self.mem)?;
        let regions = self.mem.plans.drain();
        self.mem.bury_graphs();
        self.mem.launcher.release_row_buffers(&*self.mem.dev);
        for (p, _) in regions {
            self.mem
                .release_or_orphan(p, &"a task-row region")
                .map_err(buffer_err)?;
        }
        self.scratch.trim(&mut self.mem)
    }

    // ---- resident sets -------------------------------------------------------------------

    /// Opens an empty resident set; returns its id.
    pub fn resident_open(&mut self) -> Result<u64> {
        self.check_open()?;
        Ok(self.resident.open())
    }

    /// Makes a host fixture resident in `set` (see `resident.rs`); `Ok(None)` when it has no
    /// bytes and stays host-staged.
    pub fn resident_add(
        &mut self,
        set: u64,
        name: &str,
        geometry: &Geometry,
        dir: Direction,
        host: &[u8],
    ) -> Result<Option<BufferRef>> {
        self.enter(Phase::ResidentAdd);
        self.check_open()?;
        self.resident
            .add(&mut self.mem, set, name, geometry, dir, host)
    }

    /// Undoes the newest add of `set` (named `name`) after a later step of it failed (a view
    /// that could not be established, say): frees its allocation and forgets the name.
    pub fn resident_roll_back(&mut self, set: u64, name: &str) -> Result<()> {
        self.enter(Phase::ResidentAdd);
        self.resident.roll_back(&mut self.mem, set, name)
    }

    /// Sets the host-view policy of allocations without a hint of their own.
    pub fn set_view_policy(&mut self, policy: crate::views::ViewPolicy) {
        self.mem.views.policy = policy;
    }

    /// The host-view policy of allocations without a hint.
    pub fn view_policy(&self) -> crate::views::ViewPolicy {
        self.mem.views.policy
    }

    /// Sets the host-view policy of `buf`'s allocation (before its view is established).
    pub fn hint_view(&mut self, buf: BufferRef, policy: crate::views::ViewPolicy) -> Result<()> {
        self.check_open()?;
        self.mem.lookup(buf, &"view hint")?;
        self.mem.views.hint(buf.ptr, policy);
        Ok(())
    }

    /// Establishes the host view of a buffer now instead of at its first orchestrator access
    /// (`ResidentTaskArgs.add(..., eager=True)`), so the first run pays nothing for it.
    /// Returns the means: `"mapping"`, `"cached"` or `"mirror"`.
    pub fn establish_view(&mut self, buf: BufferRef, tensor: &str) -> Result<&'static str> {
        self.check_open()?;
        self.settle();
        self.enter(Phase::ResidentAdd);
        let info = self.mem.lookup(buf, &format_args!("tensor {tensor}"))?;
        let mut ev = crate::views::ViewEvents::default();
        let means = self.mem.views.ensure(
            &*self.mem.dev,
            buf.ptr,
            info.bytes,
            true,
            crate::views::Who {
                tensor,
                phase: Phase::ResidentAdd,
            },
            &mut ev,
        )?;
        Ok(means.kind())
    }

    /// Releases a resident set in LIFO order (see `resident.rs`): every free is attempted, and
    /// the failures come back (each also logged). `Err` when the release is refused, with nothing
    /// freed and the set still open: one of its tensors is bound to the run in progress.
    /// Releasing a released set does nothing.
    pub fn resident_release(&mut self, set: u64) -> Result<Vec<Error>> {
        self.enter(Phase::Release);
        self.settle();
        if let Some((name, _)) = self
            .resident
            .buffers(set)
            .find(|(_, b)| self.bound_to_run(b.ptr))
        {
            return Err(Error::State(format!(
                "release: resident tensor '{name}' is bound to the run in progress"
            )));
        }
        for (name, b) in self.resident.buffers(set) {
            self.mem
                .exports
                .refuse(b.ptr, &format!("release of resident tensor '{name}'"))?;
        }
        if let Err(e) = self.mem.settle_before_free() {
            return Err(Error::device(Phase::Release, None, e));
        }
        Ok(self.resident.release(&mut self.mem, set))
    }

    /// Exports `buf` to another library (see `exports.rs`): refused for a freed buffer or a
    /// closed worker; the buffer's host view goes stale (the consumer may write).
    pub fn export(&mut self, buf: BufferRef) -> Result<ExportGuard> {
        self.check_open()?;
        self.settle();
        self.mem.lookup(buf, &"export")?;
        self.mem.views.mark_stale(buf.ptr);
        self.mem.exports.add(buf)
    }

    /// Makes the worker's stream wait for the work queued so far on `stream` (a CUDA stream
    /// handle, or 1 / 2 for the legacy / per-thread default stream), without blocking the host:
    /// what another library wrote from that stream is then ordered before the worker's next
    /// run, copy, host-view refresh or free. Nothing to do on devices without streams.
    pub fn wait_stream(&mut self, stream: u64) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        self.mem.dev.wait_for_stream(stream).map_err(buffer_err)
    }

    /// `close`, refused while another library may use memory of this worker (live exports).
    pub fn close_checked(&mut self) -> Result<CloseSummary> {
        if !self.closed {
            if let Some((p, _)) = self.mem.exports.all().first() {
                self.mem.exports.refuse(*p, "close")?;
            }
        }
        Ok(self.close())
    }
}
