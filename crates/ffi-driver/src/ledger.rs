//! `Ledger`: the bookkeeping every backend shares — counters, the call log, live allocation
//! sizes and injected faults — so that `stats()`, `call_log()` and `inject_fault()` mean the same
//! thing on sim and on vendor drivers.

use std::collections::{BTreeMap, VecDeque};

use crate::model::PerModel;
use crate::{CallRecord, DevPtr, MapGrant, Stats};
use crate::{DeviceError, Op};

/// A backend's lock-protected state: whatever it keeps, it keeps a [`Ledger`].
pub trait Ledgered {
    fn ledger(&mut self) -> &mut Ledger;
}

/// How a successful call's result appears in the call log.
pub trait Outcome {
    /// The logged code: 0, except for a refused mapping, which logs the refusal's code.
    fn log_code(&self) -> i64 {
        0
    }
    /// The logged address when the call produced it (an allocation).
    fn log_addr(&self) -> Option<u64> {
        None
    }
}

impl Outcome for () {}
impl Outcome for crate::ModuleId {}
impl Outcome for crate::FuncId {}
impl Outcome for crate::FuncLimits {}

impl Outcome for DevPtr {
    fn log_addr(&self) -> Option<u64> {
        Some(self.0)
    }
}

impl Outcome for MapGrant {
    fn log_code(&self) -> i64 {
        match self {
            MapGrant::Mapped { .. } => 0,
            MapGrant::Refused { code, .. } => *code,
        }
    }
}

/// The answer to a page-lock request: a refusal is an answer (the memory stays pageable), logged
/// with the vendor's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinned {
    Yes,
    No { code: i64 },
}

impl Outcome for Pinned {
    fn log_code(&self) -> i64 {
        match self {
            Pinned::Yes => 0,
            Pinned::No { code } => *code,
        }
    }
}

/// One driver call, the same way on every backend: a pending injected fault fails it before
/// `body` runs (the backend names the error with `injected`); otherwise `body` makes the call.
/// Either way the call is logged, and a successful copy is counted.
pub fn traced<S: Ledgered, T: Outcome>(
    st: &mut S,
    op: Op,
    addr: u64,
    bytes: u64,
    injected: impl FnOnce(i64) -> DeviceError,
    body: impl FnOnce(&mut S) -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    if let Some(code) = st.ledger().injected(op, addr, bytes) {
        // An op without an address or a size (a launch, a wait) names neither.
        let e = injected(code);
        let e = if addr != 0 { e.at(addr) } else { e };
        return Err(if addr != 0 || bytes != 0 {
            e.sized(bytes)
        } else {
            e
        });
    }
    let r = body(st);
    let ledger = st.ledger();
    match &r {
        Ok(v) => {
            ledger.on_copy(op, bytes);
            ledger.record(op, v.log_addr().unwrap_or(addr), bytes, v.log_code());
        }
        Err(e) => ledger.record(op, addr, bytes, e.code),
    }
    r
}

/// How many calls the log keeps (the oldest are dropped first).
pub const CALL_LOG_CAPACITY: usize = 1 << 16;

#[derive(Debug)]
struct Fault {
    op: Op,
    remaining: u64,
    code: i64,
}

/// Counters, call log, live allocations and pending faults of one device.
#[derive(Debug, Default)]
pub struct Ledger {
    stats: Stats,
    /// Live allocations: base address -> size (ordered, so a range lookup is a tree search).
    live: BTreeMap<u64, u64>,
    log: VecDeque<CallRecord>,
    faults: Vec<Fault>,
    phase: &'static str,
    /// Modeled nanoseconds by phase label, one entry per cost model of the device (a device
    /// with cost models charges them).
    modeled: Vec<(&'static str, PerModel)>,
}

impl Ledger {
    /// A fresh ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Counts one call of `op` against pending faults; returns the injected code if this call
    /// must fail. Each injected fault fires once.
    pub fn take_fault(&mut self, op: Op) -> Option<i64> {
        let mut fired = None;
        for f in self.faults.iter_mut().filter(|f| f.op == op) {
            f.remaining -= 1;
            if f.remaining == 0 && fired.is_none() {
                fired = Some(f.code);
            }
        }
        self.faults.retain(|f| f.remaining > 0);
        fired
    }

    /// Arms a fault: the `nth` (>= 1) next call of `op` fails with `code`.
    pub fn inject(&mut self, op: Op, nth: u64, code: i64) -> Result<(), DeviceError> {
        if nth == 0 {
            return Err(DeviceError::new(
                op,
                "inject_fault",
                crate::codes::INVALID_VALUE,
                "INVALID_VALUE",
                "nth must be >= 1 (1 = the next call)",
            ));
        }
        self.faults.push(Fault {
            op,
            remaining: nth,
            code,
        });
        Ok(())
    }

    /// Counts a call against pending faults and, when an injected fault fires, logs the call as
    /// failed and returns its code (see [`traced`]).
    pub fn injected(&mut self, op: Op, addr: u64, bytes: u64) -> Option<i64> {
        let code = self.take_fault(op)?;
        self.record(op, addr, bytes, code);
        Some(code)
    }

    /// Logs the outcome of a call made outside [`traced`] (teardown in `close`) and passes it on.
    pub fn logged<T>(
        &mut self,
        op: Op,
        addr: u64,
        bytes: u64,
        r: Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let code = r.as_ref().err().map_or(0, |e| e.code);
        self.record(op, addr, bytes, code);
        r
    }

    /// Drops pending faults.
    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// Appends a call to the log.
    pub fn record(&mut self, op: Op, addr: u64, bytes: u64, code: i64) {
        if self.log.len() == CALL_LOG_CAPACITY {
            self.log.pop_front();
        }
        self.log.push_back(CallRecord {
            op,
            addr,
            bytes,
            code,
            phase: self.phase,
        });
    }

    /// Labels the calls recorded from now on (see [`crate::Device::set_phase`]).
    pub fn set_phase(&mut self, phase: &'static str) {
        self.phase = phase;
    }

    /// The call log, oldest first.
    pub fn log(&self) -> Vec<CallRecord> {
        self.log.iter().cloned().collect()
    }

    /// Counts a successful allocation.
    pub fn on_alloc(&mut self, ptr: DevPtr, bytes: u64) {
        self.live.insert(ptr.0, bytes);
        self.stats.allocs += 1;
        self.stats.live_allocations += 1;
        self.stats.live_bytes += bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.live_bytes);
    }

    /// Counts a successful free; returns the freed size.
    pub fn on_free(&mut self, ptr: DevPtr) -> Option<u64> {
        let bytes = self.live.remove(&ptr.0)?;
        self.stats.frees += 1;
        self.stats.live_allocations -= 1;
        self.stats.live_bytes -= bytes;
        Some(bytes)
    }

    /// The size of a live allocation starting at `ptr`.
    pub fn live_size(&self, ptr: DevPtr) -> Option<u64> {
        self.live.get(&ptr.0).copied()
    }

    /// The live allocation `(base, size)` that contains all of `[addr, addr + bytes)`; `None`
    /// when no allocation contains `addr` or the range runs past the one that does. A zero-byte
    /// range must still start inside an allocation.
    pub fn containing(&self, addr: u64, bytes: u64) -> Option<(DevPtr, u64)> {
        let (&base, &size) = self.live.range(..=addr).next_back()?;
        let end = base.checked_add(size)?;
        let range_end = addr.checked_add(bytes)?;
        (addr < end && range_end <= end).then_some((DevPtr(base), size))
    }

    /// The live allocation `(base, size)` containing `[addr, addr + bytes)`, else the error
    /// `refuse` makes of the reason (the address and size attached): the check every vendor
    /// driver makes before a copy, memset or mapping reaches the vendor.
    pub fn require(
        &self,
        addr: u64,
        bytes: u64,
        refuse: impl FnOnce(&'static str) -> DeviceError,
    ) -> Result<(u64, u64), DeviceError> {
        self.containing(addr, bytes)
            .map(|(b, s)| (b.0, s))
            .ok_or_else(|| {
                refuse(
                    "no live allocation contains this range (unknown address, freed, or the \
                     range runs past its allocation)",
                )
                .at(addr)
                .sized(bytes)
            })
    }

    /// The size of the live allocation starting at `ptr`, else the error `refuse` makes of the
    /// reason (the address attached): the check before a free reaches the vendor.
    pub fn require_live(
        &self,
        ptr: DevPtr,
        refuse: impl FnOnce(&'static str) -> DeviceError,
    ) -> Result<u64, DeviceError> {
        self.live_size(ptr).ok_or_else(|| {
            refuse("not a live allocation (unknown address or already freed)").at(ptr.0)
        })
    }

    /// Live allocations (base, size), largest address first (the reverse of a bump order).
    pub fn live_allocations(&self) -> Vec<(DevPtr, u64)> {
        self.live
            .iter()
            .rev()
            .map(|(&p, &b)| (DevPtr(p), b))
            .collect()
    }

    /// Counts a copy (or a memset).
    pub fn on_copy(&mut self, op: Op, bytes: u64) {
        match op {
            Op::H2d => {
                self.stats.h2d_calls += 1;
                self.stats.h2d_bytes += bytes;
            }
            Op::D2h => {
                self.stats.d2h_calls += 1;
                self.stats.d2h_bytes += bytes;
            }
            Op::Memset => {
                self.stats.memset_calls += 1;
                self.stats.memset_bytes += bytes;
            }
            Op::Launch => self.stats.launches += 1,
            Op::Sync => self.stats.syncs += 1,
            _ => {}
        }
    }

    /// Counts a module loaded into the device's context.
    pub fn on_module_load(&mut self) {
        self.stats.module_loads += 1;
    }

    /// Counts a map call: granted or refused.
    pub fn on_map(&mut self, granted: bool) {
        self.stats.maps += 1;
        if granted {
            self.stats.live_mappings += 1;
        } else {
            self.stats.map_refusals += 1;
        }
    }

    /// Counts a page-locked mirror of `bytes`.
    pub fn on_pin(&mut self, bytes: u64) {
        self.stats.pins += 1;
        self.stats.pinned_bytes += bytes;
    }

    /// Counts an unlocked mirror of `bytes`.
    pub fn on_unpin(&mut self, bytes: u64) {
        self.stats.unpins += 1;
        self.stats.pinned_bytes = self.stats.pinned_bytes.saturating_sub(bytes);
    }

    /// Counts a successful unmap.
    pub fn on_unmap(&mut self) {
        self.stats.unmaps += 1;
        self.stats.live_mappings = self.stats.live_mappings.saturating_sub(1);
    }

    /// Adds `ns` modeled nanoseconds (per cost model) to the current phase.
    pub fn charge(&mut self, ns: PerModel) {
        self.charge_to(self.phase, ns);
    }

    /// Adds `ns` modeled nanoseconds (per cost model) to the phase labelled `phase`; the
    /// cumulative `modeled_ns` counter follows the primary model (the first).
    pub fn charge_to(&mut self, phase: &'static str, ns: PerModel) {
        match self.modeled.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, t)) => {
                for (a, b) in t.iter_mut().zip(ns) {
                    *a += b;
                }
            }
            None => self.modeled.push((phase, ns)),
        }
        self.stats.modeled_ns += ns[0];
    }

    /// Modeled nanoseconds so far, by phase label, per cost model.
    pub fn modeled(&self) -> Vec<(&'static str, PerModel)> {
        self.modeled.clone()
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Ledgered for Ledger {
        fn ledger(&mut self) -> &mut Ledger {
            self
        }
    }

    fn fail(code: i64) -> DeviceError {
        DeviceError::new(Op::H2d, "test_copy", code, "TEST", "failed")
    }

    #[test]
    fn traced_logs_every_outcome_and_counts_only_successful_copies() {
        let mut l = Ledger::new();
        traced(&mut l, Op::H2d, 0x10, 8, fail, |_| Ok(())).unwrap();
        let e = traced(&mut l, Op::H2d, 0x10, 8, fail, |_| -> Result<(), _> {
            Err(fail(5))
        });
        assert_eq!(e.unwrap_err().code, 5);
        l.inject(Op::H2d, 1, 9).unwrap();
        let e = traced(&mut l, Op::H2d, 0x10, 8, fail, |_| -> Result<(), _> {
            unreachable!("an injected fault fails the call before its body")
        });
        assert_eq!(
            (e.as_ref().unwrap_err().code, e.unwrap_err().addr),
            (9, Some(0x10))
        );
        let p = traced(&mut l, Op::Alloc, 0, 4, fail, |_| Ok(DevPtr(0x40))).unwrap();
        let refused = MapGrant::Refused {
            code: 0xfffe,
            reason: String::new(),
        };
        traced(&mut l, Op::Map, p.0, 4, fail, |_| Ok(refused)).unwrap();
        let s = l.stats();
        assert_eq!((s.h2d_calls, s.h2d_bytes), (1, 8));
        let log: Vec<(Op, u64, i64)> = l.log().iter().map(|c| (c.op, c.addr, c.code)).collect();
        assert_eq!(
            log,
            [
                (Op::H2d, 0x10, 0),
                (Op::H2d, 0x10, 5),
                (Op::H2d, 0x10, 9),
                (Op::Alloc, 0x40, 0),
                (Op::Map, 0x40, 0xfffe)
            ]
        );
    }

    #[test]
    fn faults_fire_on_the_nth_call_once() {
        let mut l = Ledger::new();
        l.inject(Op::H2d, 2, 7).unwrap();
        assert_eq!(l.take_fault(Op::D2h), None);
        assert_eq!(l.take_fault(Op::H2d), None);
        assert_eq!(l.take_fault(Op::H2d), Some(7));
        assert_eq!(l.take_fault(Op::H2d), None);
        assert!(l.inject(Op::Alloc, 0, 1).is_err());
    }

    #[test]
    fn counters_track_live_and_peak() {
        let mut l = Ledger::new();
        l.on_alloc(DevPtr(1), 10);
        l.on_alloc(DevPtr(2), 20);
        assert_eq!(l.on_free(DevPtr(1)), Some(10));
        assert_eq!(l.on_free(DevPtr(1)), None);
        let s = l.stats();
        assert_eq!(
            (s.live_allocations, s.live_bytes, s.peak_bytes),
            (1, 20, 30)
        );
    }

    #[test]
    fn containing_finds_the_enclosing_allocation() {
        let mut l = Ledger::new();
        l.on_alloc(DevPtr(100), 10);
        l.on_alloc(DevPtr(200), 10);
        assert_eq!(l.containing(100, 10), Some((DevPtr(100), 10)));
        assert_eq!(l.containing(105, 5), Some((DevPtr(100), 10)));
        assert_eq!(l.containing(109, 0), Some((DevPtr(100), 10)));
        assert_eq!(l.containing(105, 6), None);
        assert_eq!(l.containing(110, 0), None);
        assert_eq!(l.containing(99, 1), None);
        assert_eq!(l.containing(150, 1), None);
        assert_eq!(l.containing(205, u64::MAX), None);
    }
}
