//! The worker's memory: the driver, the table of every live allocation (who owns it, its size,
//! its generation) and the allocation-scoped host-view cache.
//!
//! Ownership rules, kept by every path that frees (`free`, resident release, arena growth,
//! fresh-staging cleanup, `trim_staging`, `close`):
//! * a host view (mapping or mirror) is released before its allocation is freed;
//! * a free that fails leaves the allocation recorded (as an orphan when a resident set or the
//!   worker owned it), so `close` tries again and reports it;
//! * a handle names an allocation by address *and* generation, so a handle kept past `free`
//!   cannot reach a newer allocation at the same address.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use simpler_driver::{CostModel, DevPtr, Device, DeviceError};

use crate::addr::AddrMap;
use crate::error::{Error, Phase, Result};
use crate::geometry::{span_contains, Geometry};
use crate::spec::BufferRef;
use crate::views::ViewCache;

/// Who owns an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// `Worker::malloc`.
    User,
    /// A resident set (its id).
    Resident(u64),
    /// The staging arena, a fresh staging buffer or a scratch pool chunk.
    Staging,
    /// A resident or staging allocation whose free failed; `close` retries it.
    Orphan,
}

impl Owner {
    /// The allocation, in words, for messages about it.
    pub(crate) fn what(self) -> String {
        match self {
            Owner::User => "buffer".to_string(),
            Owner::Resident(set) => format!("allocation of resident set {set}"),
            Owner::Staging => "staging or scratch allocation".to_string(),
            Owner::Orphan => "allocation whose earlier release failed".to_string(),
        }
    }
}

/// What the table records of one allocation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocInfo {
    pub bytes: u64,
    pub owner: Owner,
    pub gen: u64,
}

static NEXT_WORKER: AtomicU64 = AtomicU64::new(1);

/// See the module docs.
#[derive(Debug)]
pub struct Memory {
    pub(crate) dev: Arc<dyn Device>,
    /// This worker's id: handles carry it, so a handle from another worker is refused.
    pub(crate) id: u64,
    allocs: AddrMap<AllocInfo>,
    pub(crate) views: ViewCache,
    /// Device code loaded into the device, and the task-row buffer.
    pub(crate) launcher: crate::device_code::Launcher,
    /// Live exports to other libraries (their own lock: guards drop without the worker's).
    pub(crate) exports: Arc<crate::exports::Exports>,
    /// The launch plans of earlier rounds (`run/plan_cache.rs`); a freed allocation drops the
    /// plans that bind it.
    pub(crate) plans: crate::run::PlanCache,
    next_gen: u64,
}

impl Memory {
    /// The memory of a new worker over `dev`.
    pub fn new(dev: Arc<dyn Device>) -> Memory {
        let mut views = ViewCache::default();
        views.auto_model = Some(
            dev.cost_model()
                .copied()
                .unwrap_or_else(|| CostModel::for_platform(dev.platform())),
        );
        Memory {
            dev,
            id: NEXT_WORKER.fetch_add(1, Ordering::Relaxed),
            allocs: AddrMap::default(),
            views,
            launcher: Default::default(),
            exports: Default::default(),
            plans: Default::default(),
            next_gen: 1,
        }
    }

    /// Orders the worker's stream after the work other libraries queued on the legacy default
    /// stream, when an export makes that necessary (see `exports.rs`): before a run, a copy or
    /// a free. Returns whether it did (a free then also waits for the worker's stream, so the
    /// memory is not released under that work). When the event cannot be placed, the whole
    /// context is waited for instead (`synchronize_device`); only when that fails too is it an
    /// error, and the next use asks again. Nothing to do on a device without streams.
    pub(crate) fn order_after_consumers(
        &self,
    ) -> std::result::Result<bool, simpler_driver::DeviceError> {
        if !self.exports.take_order() {
            return Ok(false);
        }
        let Err(e) = self.dev.wait_for_stream(simpler_driver::LEGACY_STREAM) else {
            return Ok(true);
        };
        if self.dev.fault().is_none() && self.dev.synchronize_device().is_ok() {
            log::warn!("ordering after other libraries' writes: {e}; waited for the whole device");
            return Ok(true);
        }
        self.exports.order_again();
        Err(e)
    }

    /// [`Memory::order_after_consumers`] before memory is freed: when it ordered, the worker's
    /// stream is waited for too.
    pub(crate) fn settle_before_free(
        &self,
    ) -> std::result::Result<(), simpler_driver::DeviceError> {
        if self.order_after_consumers()? {
            self.dev.synchronize()?;
        }
        Ok(())
    }

    /// Allocates `bytes` for `owner`; a driver failure is reported in `phase` for `tensor`.
    pub(crate) fn alloc(
        &mut self,
        bytes: u64,
        owner: Owner,
        phase: Phase,
        tensor: Option<&str>,
    ) -> Result<BufferRef> {
        let ptr = self
            .dev
            .alloc(bytes)
            .map_err(|e| Error::device(phase, tensor, e))?;
        let gen = self.next_gen;
        self.next_gen += 1;
        self.allocs.insert(ptr.0, AllocInfo { bytes, owner, gen });
        Ok(BufferRef {
            worker: self.id,
            ptr,
            gen,
        })
    }

    /// The generation of the live allocation at `ptr`.
    pub(crate) fn gen_of(&self, ptr: DevPtr) -> Option<u64> {
        self.allocs.get(&ptr.0).map(|i| i.gen)
    }

    /// Whether `buf` names a live allocation of this worker (its generation included).
    pub(crate) fn names_live(&self, buf: BufferRef) -> bool {
        buf.worker == self.id
            && self
                .allocs
                .get(&buf.ptr.0)
                .is_some_and(|i| i.gen == buf.gen)
    }

    /// The live allocation a handle names. A handle from another worker, or to an allocation
    /// that was freed (even if a newer one now starts at the same address), is an error.
    pub(crate) fn lookup(&self, buf: BufferRef, what: &dyn std::fmt::Display) -> Result<AllocInfo> {
        if buf.worker != self.id {
            return Err(Error::Value(format!(
                "{what}: buffer {} belongs to another worker",
                buf.ptr
            )));
        }
        match self.allocs.get(&buf.ptr.0) {
            Some(i) if i.gen == buf.gen => Ok(*i),
            Some(_) => Err(Error::State(format!(
                "{what}: buffer {} was freed; the allocation now at that address is a newer one \
                 (the handle outlived its allocation)",
                buf.ptr
            ))),
            None => Err(Error::State(format!(
                "{what}: device address {} is not a live allocation of this worker (freed, \
                 released or never allocated)",
                buf.ptr
            ))),
        }
    }

    /// Checks that `[offset, offset + len)` lies inside the buffer.
    pub(crate) fn check_span(
        &self,
        buf: BufferRef,
        offset: u64,
        len: u64,
        what: &str,
    ) -> Result<AllocInfo> {
        let info = self.lookup(buf, &what)?;
        if !span_contains(0, info.bytes, offset, len) {
            return Err(Error::Value(format!(
                "{what}: {len} bytes at offset {offset} run past buffer {} of {} bytes",
                buf.ptr, info.bytes
            )));
        }
        Ok(info)
    }

    /// Checks that `geometry` fits the buffer.
    pub(crate) fn check_tensor(
        &self,
        buf: BufferRef,
        geometry: &Geometry,
        what: &dyn std::fmt::Display,
    ) -> Result<AllocInfo> {
        let info = self.lookup(buf, what)?;
        if geometry.end_byte() > info.bytes {
            return Err(Error::Value(format!(
                "{what}: tensor spans bytes [{}, {}) of buffer {}, which has only {} bytes",
                geometry.start_byte(),
                geometry.end_byte(),
                buf.ptr,
                info.bytes
            )));
        }
        Ok(info)
    }

    /// Releases the allocation's host view, then frees it; forgets it only if the free
    /// succeeded.
    pub(crate) fn release(&mut self, ptr: DevPtr) -> std::result::Result<(), DeviceError> {
        self.views.release(&*self.dev, ptr)?;
        self.dev.free(ptr)?;
        self.allocs.remove(&ptr.0);
        self.plans.forget_alloc(ptr.0);
        self.bury_graphs();
        Ok(())
    }

    /// Destroys the graphs of dropped plans (a failure is logged: the device's close destroys
    /// what is left).
    pub(crate) fn bury_graphs(&mut self) {
        for g in std::mem::take(&mut self.plans.dead_graphs) {
            if let Err(e) = self.dev.destroy_graph(g) {
                log::warn!("destroying the graph of a dropped launch plan: {e}");
            }
        }
    }

    /// Releases an allocation the worker or a resident set owns; on failure it stays recorded as
    /// an orphan (so `close` retries it) and the error is logged and returned.
    pub(crate) fn release_or_orphan(
        &mut self,
        ptr: DevPtr,
        what: &dyn std::fmt::Display,
    ) -> std::result::Result<(), DeviceError> {
        let bytes = self.allocs.get(&ptr.0).map_or(0, |i| i.bytes);
        self.release(ptr).inspect_err(|e| {
            log::error!("{what}: releasing allocation {ptr} ({bytes} bytes; its host view, then the memory) failed: {e}");
            if let Some(i) = self.allocs.get_mut(&ptr.0) {
                i.owner = Owner::Orphan;
            }
        })
    }

    /// Live allocations, newest address first (the order `close` frees them in).
    pub(crate) fn live(&self) -> Vec<(DevPtr, AllocInfo)> {
        let mut v: Vec<(DevPtr, AllocInfo)> =
            self.allocs.iter().map(|(&p, &i)| (DevPtr(p), i)).collect();
        v.sort_by_key(|b| std::cmp::Reverse(b.0));
        v
    }

    /// Forgets every allocation and view (after the driver's own close removed them).
    pub(crate) fn forget_all(&mut self) {
        let auto_model = self.views.auto_model;
        self.views = ViewCache::default();
        self.views.auto_model = auto_model;
        self.allocs.clear();
    }
}
