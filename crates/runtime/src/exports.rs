//! Exports of device memory to other libraries (the CUDA Array Interface, DLPack): which
//! allocations a consumer may be using right now, so that their memory is never freed under it.
//!
//! An export is counted from the moment it is made until the consumer lets go: its
//! [`ExportGuard`] is dropped (a DLPack capsule's deleter ran, or the tensor that handed out its
//! array interface is gone). While an allocation has a live export:
//! * freeing it, releasing its resident set and closing the worker are refused, naming the
//!   allocation and the count (a forced close at exit goes ahead and warns);
//! * a consumer may write through it, so its host view goes stale at the export and at the
//!   start of every run, and the next host read refreshes it;
//! * a consumer's writes are ordered before the worker's next use of its memory: while an
//!   export is live, and once more after the last one ended (its writes may still be queued),
//!   the next run, copy, host-view refresh or free first makes the worker's stream wait for the
//!   work queued so far on the legacy default stream ([`Exports::take_order`],
//!   `Memory::order_after_consumers`). The legacy stream is where torch and CuPy run unless told
//!   otherwise, and it waits for every blocking stream of the context; a consumer writing from
//!   a non-blocking stream of its own says so with the worker's `wait_stream`.
//!
//! * the process's session release (`simpler_driver::release_sessions`, which closes the
//!   devices still open) closes the worker's device only through this table
//!   ([`CloseHold`]): while an export is live it keeps the device open, with its session, and
//!   says why; once it closed the device, no export is made any more.
//!
//! The table has its own small lock, held only for its own bookkeeping (and, in that release,
//! for the device's close, so no export slips in between the check and the close), so a guard
//! can be dropped from any thread without the worker's lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use simpler_driver::{CloseHold, CloseReport, DevPtr};

use crate::error::{Error, Result};
use crate::spec::BufferRef;

/// Live exports by allocation base: `(generation, count)`; and whether the session release
/// closed the device (no export after that).
#[derive(Debug, Default)]
struct Table {
    live: HashMap<u64, (u64, u32)>,
    closed: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Exports {
    table: Mutex<Table>,
    /// The number of allocations in the table's `live`, kept beside it (updated under its
    /// lock) so that the check every run makes, "no export at all", takes no lock.
    allocations: AtomicUsize,
    /// An export was made or ended since the worker last ordered itself after consumers.
    changed: AtomicBool,
}

impl Exports {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more export of `buf`; refused once the session release closed the device.
    pub fn add(self: &Arc<Self>, buf: BufferRef) -> Result<ExportGuard> {
        let mut t = self.lock();
        if t.closed {
            return Err(Error::State(format!(
                "export of allocation {}: the device was closed by release_sessions",
                buf.ptr
            )));
        }
        let e = t.live.entry(buf.ptr.0).or_insert((buf.gen, 0));
        if e.0 != buf.gen {
            *e = (buf.gen, 0);
        }
        e.1 += 1;
        self.allocations.store(t.live.len(), Ordering::Release);
        self.changed.store(true, Ordering::Release);
        Ok(ExportGuard {
            table: self.clone(),
            ptr: buf.ptr.0,
            gen: buf.gen,
        })
    }

    /// The live exports of the allocation at `ptr`.
    pub fn count(&self, ptr: DevPtr) -> u32 {
        self.lock().live.get(&ptr.0).map_or(0, |e| e.1)
    }

    /// Whether no allocation has a live export (the common case, checked on every run; no
    /// lock).
    pub fn is_empty(&self) -> bool {
        self.allocations.load(Ordering::Acquire) == 0
    }

    /// Every allocation with live exports, and its count.
    pub fn all(&self) -> Vec<(DevPtr, u32)> {
        let mut all: Vec<(DevPtr, u32)> = self
            .lock()
            .live
            .iter()
            .map(|(&p, &(_, n))| (DevPtr(p), n))
            .collect();
        all.sort_unstable_by_key(|&(p, _)| p.0);
        all
    }

    /// Whether the worker must order its stream after consumers' work before its next use of
    /// memory (see the module docs); asking clears the "changed" mark, so a caller whose
    /// ordering fails puts it back with [`Exports::order_again`].
    pub fn take_order(&self) -> bool {
        // Cleared only when set: the common "nothing changed" costs a load, not a swap.
        let changed =
            self.changed.load(Ordering::Acquire) && self.changed.swap(false, Ordering::AcqRel);
        changed || !self.is_empty()
    }

    /// Whether [`Exports::take_order`] would ask for the ordering now (it is not cleared).
    pub fn order_pending(&self) -> bool {
        self.changed.load(Ordering::Acquire) || !self.is_empty()
    }

    /// Asks for the ordering again (the last one failed).
    pub fn order_again(&self) {
        self.changed.store(true, Ordering::Release);
    }

    /// Refuses `what` of the allocation at `ptr` while it has live exports.
    pub fn refuse(&self, ptr: DevPtr, what: &str) -> Result<()> {
        match self.count(ptr) {
            0 => Ok(()),
            n => Err(Error::State(format!(
                "{what}: allocation {ptr} has {n} live export(s) (a DLPack capsule or array made \
                 from __dlpack__, or a tensor whose __cuda_array_interface__ was read): another \
                 library may still use its memory; drop those objects first"
            ))),
        }
    }
}

impl CloseHold for Exports {
    /// The session release's close of the device (see the module docs): refused while an
    /// export is live, naming the allocations; else the device closes under this table's lock.
    fn close_unless_held(
        &self,
        close: &mut dyn FnMut() -> CloseReport,
    ) -> std::result::Result<CloseReport, String> {
        let mut t = self.lock();
        if !t.live.is_empty() {
            let mut held: Vec<(u64, u32)> = t.live.iter().map(|(&p, &(_, n))| (p, n)).collect();
            held.sort_unstable();
            let list: Vec<String> = held
                .iter()
                .map(|&(p, n)| format!("allocation {} has {n} live export(s)", DevPtr(p)))
                .collect();
            return Err(format!(
                "{} (a DLPack capsule or array made from __dlpack__, or a tensor whose \
                 __cuda_array_interface__ was read): another library may still use that memory; \
                 drop those objects, then close the worker or release again",
                list.join(", ")
            ));
        }
        t.closed = true;
        Ok(close())
    }
}

/// One live export; dropping it ends the export.
#[derive(Debug)]
pub struct ExportGuard {
    table: Arc<Exports>,
    ptr: u64,
    gen: u64,
}

impl ExportGuard {
    /// The exported allocation's base address.
    pub fn ptr(&self) -> DevPtr {
        DevPtr(self.ptr)
    }
}

impl Drop for ExportGuard {
    fn drop(&mut self) {
        let mut t = self.table.lock();
        if let Some(e) = t.live.get_mut(&self.ptr).filter(|e| e.0 == self.gen) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                t.live.remove(&self.ptr);
                self.table
                    .allocations
                    .store(t.live.len(), Ordering::Release);
            }
        }
        // The consumer's last writes may still be queued: order after them once more.
        self.table.changed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(ptr: u64, gen: u64) -> BufferRef {
        BufferRef {
            worker: 1,
            ptr: DevPtr(ptr),
            gen,
        }
    }

    #[test]
    fn guards_count_and_release_once() {
        let t = Arc::new(Exports::default());
        let a = t.add(buf(0x1000, 1)).unwrap();
        let b = t.add(buf(0x1000, 1)).unwrap();
        assert_eq!(t.count(DevPtr(0x1000)), 2);
        let e = t.refuse(DevPtr(0x1000), "free").unwrap_err().to_string();
        assert!(
            e.contains("free: allocation 0x1000 has 2 live export(s)"),
            "{e}"
        );
        assert!(!t.is_empty());
        drop(a);
        assert_eq!(t.count(DevPtr(0x1000)), 1);
        assert!(!t.is_empty());
        drop(b);
        assert_eq!(t.count(DevPtr(0x1000)), 0);
        assert!(t.is_empty(), "the count kept beside the table follows it");
        assert!(t.refuse(DevPtr(0x1000), "free").is_ok());
        assert!(t.all().is_empty());
    }

    #[test]
    fn ordering_is_asked_while_exports_live_and_once_after_the_last_ends() {
        let t = Arc::new(Exports::default());
        assert!(!t.take_order(), "nothing was ever exported");
        assert!(!t.order_pending());
        let a = t.add(buf(0x1000, 1)).unwrap();
        assert!(t.order_pending());
        assert!(t.take_order());
        assert!(t.take_order(), "asked on every use while an export is live");
        drop(a);
        assert!(t.order_pending(), "asking does not clear it");
        assert!(t.take_order(), "once more after the last export ended");
        assert!(!t.take_order());
        assert!(!t.order_pending());
        t.order_again();
        assert!(t.take_order());
    }

    #[test]
    fn a_stale_guard_does_not_release_a_newer_allocation_at_the_same_address() {
        let t = Arc::new(Exports::default());
        let old = t.add(buf(0x2000, 1)).unwrap();
        let new = t.add(buf(0x2000, 2)).unwrap();
        drop(old);
        assert_eq!(t.count(DevPtr(0x2000)), 1);
        drop(new);
        assert_eq!(t.count(DevPtr(0x2000)), 0);
    }
}
