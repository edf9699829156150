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
//! The table has its own small lock, never held while anything else runs, so a guard can be
//! dropped from any thread without the worker's lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use simpler_driver::DevPtr;

use crate::error::{Error, Result};
use crate::spec::BufferRef;

/// Live exports by allocation base: `(generation, count)`.
#[derive(Debug, Default)]
pub(crate) struct Exports {
    live: Mutex<HashMap<u64, (u64, u32)>>,
    /// An export was made or ended since the worker last ordered itself after consumers.
    changed: AtomicBool,
}

impl Exports {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, (u64, u32)>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more export of `buf`.
    pub fn add(self: &Arc<Self>, buf: BufferRef) -> ExportGuard {
        let mut live = self.lock();
        let e = live.entry(buf.ptr.0).or_insert((buf.gen, 0));
        if e.0 != buf.gen {
            *e = (buf.gen, 0);
        }
        e.1 += 1;
        self.changed.store(true, Ordering::Release);
        ExportGuard {
            table: self.clone(),
            ptr: buf.ptr.0,
            gen: buf.gen,
        }
    }

    /// The live exports of the allocation at `ptr`.
    pub fn count(&self, ptr: DevPtr) -> u32 {
        self.lock().get(&ptr.0).map_or(0, |e| e.1)
    }

    /// Whether no allocation has a live export (the common case, checked on every run).
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every allocation with live exports, and its count.
    pub fn all(&self) -> Vec<(DevPtr, u32)> {
        self.lock()
            .iter()
            .map(|(&p, &(_, n))| (DevPtr(p), n))
            .collect()
    }

    /// Whether the worker must order its stream after consumers' work before its next use of
    /// memory (see the module docs); asking clears the "changed" mark, so a caller whose
    /// ordering fails puts it back with [`Exports::order_again`].
    pub fn take_order(&self) -> bool {
        let changed = self.changed.swap(false, Ordering::AcqRel);
        changed || !self.is_empty()
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
        let mut live = self.table.lock();
        if let Some(e) = live.get_mut(&self.ptr).filter(|e| e.0 == self.gen) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                live.remove(&self.ptr);
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
        let a = t.add(buf(0x1000, 1));
        let b = t.add(buf(0x1000, 1));
        assert_eq!(t.count(DevPtr(0x1000)), 2);
        let e = t.refuse(DevPtr(0x1000), "free").unwrap_err().to_string();
        assert!(
            e.contains("free: allocation 0x1000 has 2 live export(s)"),
            "{e}"
        );
        drop(a);
        assert_eq!(t.count(DevPtr(0x1000)), 1);
        drop(b);
        assert_eq!(t.count(DevPtr(0x1000)), 0);
        assert!(t.refuse(DevPtr(0x1000), "free").is_ok());
        assert!(t.all().is_empty());
    }

    #[test]
    fn ordering_is_asked_while_exports_live_and_once_after_the_last_ends() {
        let t = Arc::new(Exports::default());
        assert!(!t.take_order(), "nothing was ever exported");
        let a = t.add(buf(0x1000, 1));
        assert!(t.take_order());
        assert!(t.take_order(), "asked on every use while an export is live");
        drop(a);
        assert!(t.take_order(), "once more after the last export ended");
        assert!(!t.take_order());
        t.order_again();
        assert!(t.take_order());
    }

    #[test]
    fn a_stale_guard_does_not_release_a_newer_allocation_at_the_same_address() {
        let t = Arc::new(Exports::default());
        let old = t.add(buf(0x2000, 1));
        let new = t.add(buf(0x2000, 2));
        drop(old);
        assert_eq!(t.count(DevPtr(0x2000)), 1);
        drop(new);
        assert_eq!(t.count(DevPtr(0x2000)), 0);
    }
}
