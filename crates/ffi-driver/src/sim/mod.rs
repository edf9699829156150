//! The `sim` backend: host memory standing in for device memory.
//!
//! It is the platform every test runs on, so it is deliberately strict:
//! * device addresses live in a non-canonical range (`SIM_BASE` upward), never equal to the host
//!   pointers backing them, so code that dereferences a device address crashes in tests instead
//!   of silently working; allocations are separated by a guard gap, so a copy across two
//!   allocations is an error; by default addresses are never reused, so a use after free is an
//!   error too, and with [`SimConfig::reuse_addresses`] a freed address is handed out again to
//!   the next allocation of the same size, as real drivers do (to prove that handles kept past
//!   `free` cannot reach the newer allocation);
//! * a mapping policy ([`SvmPolicy`]) grants or refuses `map_host` per allocation, mimicking hosts
//!   that refuse small ordinary-page allocations; mapping twice and unmapping what was never mapped
//!   are errors, as on the real HAL; freeing an allocation that is still mapped is an error;
//! * fresh allocations are poison-filled, so reads of never-written memory show;
//! * every call is counted, logged and can be made to fail (`inject_fault`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::{CloseReport, DevPtr, Device, MapGrant};
use crate::error::codes;
use crate::model::{per_model, PerModel};
use crate::{traced, CostModel, DeviceError, HostMem, HostMemError, Ledger, Ledgered, Op};

/// First sim device address. Non-canonical on x86-64 (4- and 5-level paging) and outside any
/// aarch64 user range, so a dereference faults.
pub const SIM_BASE: u64 = 0x8d00_0000_0000_0000;
/// Alignment of sim device addresses.
pub const SIM_ALIGN: u64 = 4096;
/// Unmapped gap left after every allocation.
const GUARD: u64 = 4096;
use crate::POISON;
/// Default simulated device capacity.
pub const DEFAULT_CAPACITY: u64 = 16 << 30;

/// Options of a sim device.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub svm: SvmPolicy,
    /// Byte written into every fresh allocation; `None` leaves it zeroed.
    pub poison: Option<u8>,
    /// Simulated device memory size; an allocation past it fails with OUT_OF_MEMORY.
    pub capacity: u64,
    /// Hand freed addresses out again (to the next allocation of the same aligned size).
    pub reuse_addresses: bool,
    /// Price every operation with these cost models (modeled time beside measured time), the
    /// primary one first (at most one of each name).
    pub models: Vec<CostModel>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            svm: SvmPolicy::Always,
            poison: Some(POISON),
            capacity: DEFAULT_CAPACITY,
            reuse_addresses: false,
            models: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Block {
    size: u64,
    mem: Arc<HostMem>,
    /// Live mappings: (start address, length).
    mappings: Vec<(u64, u64)>,
}

#[derive(Debug)]
struct State {
    next: u64,
    /// Freed addresses by aligned size, most recent last (with `reuse_addresses`).
    free: BTreeMap<u64, Vec<u64>>,
    /// Mirrors the cost model counts as page-locked: host address -> length.
    pinned: BTreeMap<usize, usize>,
    blocks: BTreeMap<u64, Block>,
    ledger: Ledger,
}

/// The sim device. See the module docs.
#[derive(Debug)]
pub struct SimDevice {
    config: SimConfig,
    state: Mutex<State>,
}

fn err(op: Op, call: &str, code: i64, detail: impl Into<String>) -> DeviceError {
    DeviceError::new(op, call, code, codes::name(code), detail)
}

fn call_name(op: Op) -> &'static str {
    match op {
        Op::Alloc => "sim_malloc",
        Op::Free => "sim_free",
        Op::H2d => "sim_memcpy_h2d",
        Op::D2h => "sim_memcpy_d2h",
        Op::Map => "sim_host_register",
        Op::Unmap => "sim_host_unregister",
        Op::Memset => "sim_memset",
        Op::Pin | Op::Unpin => "(sim mirrors are not page-locked)",
        Op::Module | Op::Launch | Op::Sync => "(sim runs kernels on the host)",
        Op::Device => "(sim has no device lifecycle)",
    }
}

impl State {
    /// The block containing `[addr, addr + bytes)`, with the offset of `addr` inside it.
    fn find(&self, op: Op, addr: u64, bytes: u64) -> Result<(u64, &Block), DeviceError> {
        let (base, block) = self.blocks.range(..=addr).next_back().ok_or_else(|| {
            err(
                op,
                call_name(op),
                codes::BAD_ADDRESS,
                "no live allocation at this address",
            )
            .at(addr)
            .sized(bytes)
        })?;
        let end = addr.checked_add(bytes);
        if addr >= base + block.size || end.is_none_or(|e| e > base + block.size) {
            return Err(err(
                op,
                call_name(op),
                codes::BAD_ADDRESS,
                format!(
                    "range runs past its allocation (allocation {base:#x}, {} bytes)",
                    block.size
                ),
            )
            .at(addr)
            .sized(bytes));
        }
        Ok((addr - base, block))
    }
}

impl Ledgered for State {
    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

fn injected(op: Op) -> impl FnOnce(i64) -> DeviceError {
    move |code| err(op, call_name(op), code, "injected fault")
}

impl SimDevice {
    /// A sim device with the given options.
    pub fn new(config: SimConfig) -> SimDevice {
        SimDevice {
            config,
            state: Mutex::new(State {
                next: SIM_BASE,
                free: BTreeMap::new(),
                pinned: BTreeMap::new(),
                blocks: BTreeMap::new(),
                ledger: Ledger::new(),
            }),
        }
    }

    /// The options this device was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Whether the primary model page-locks mirrors (the driver's `pins` counters follow it).
    fn primary_pins(&self) -> bool {
        self.config.models.first().is_some_and(|m| m.pins_mirrors)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges a successful `op` of `bytes` to the cost models (if any); `host` is the host
    /// side of a copy, which counts as page-locked when it lies in a pinned mirror; `alloc` is
    /// the size of the allocation the operation works on.
    fn charge(&self, st: &mut State, op: Op, bytes: u64, host: Option<(usize, usize)>, alloc: u64) {
        if self.config.models.is_empty() {
            return;
        }
        let pinned = host.is_some_and(|(addr, len)| {
            st.pinned
                .range(..=addr)
                .next_back()
                .is_some_and(|(&a, &l)| addr + len <= a + l)
        });
        let ns = per_model(&self.config.models, |m| {
            m.op_ns(op, bytes, pinned && m.pins_mirrors, alloc)
        });
        st.ledger.charge(ns);
    }

    fn do_alloc(&self, st: &mut State, bytes: u64) -> Result<DevPtr, DeviceError> {
        if bytes == 0 {
            return Err(err(
                Op::Alloc,
                "sim_malloc",
                codes::INVALID_VALUE,
                "zero-byte allocation",
            )
            .sized(0));
        }
        let live = st.ledger.stats().live_bytes;
        if live
            .checked_add(bytes)
            .is_none_or(|t| t > self.config.capacity)
        {
            return Err(err(
                Op::Alloc,
                "sim_malloc",
                codes::OUT_OF_MEMORY,
                format!(
                    "device capacity {} bytes, {live} in use",
                    self.config.capacity
                ),
            )
            .sized(bytes));
        }
        let oom = || {
            err(
                Op::Alloc,
                "sim_malloc",
                codes::OUT_OF_MEMORY,
                "host memory exhausted",
            )
            .sized(bytes)
        };
        let len = usize::try_from(bytes).map_err(|_| oom())?;
        let mem = HostMem::new(len, self.config.poison.unwrap_or(0)).map_err(|_| oom())?;
        let exhausted = || {
            err(
                Op::Alloc,
                "sim_malloc",
                codes::OUT_OF_MEMORY,
                "address space exhausted",
            )
            .sized(bytes)
        };
        let span = bytes
            .checked_next_multiple_of(SIM_ALIGN)
            .ok_or_else(exhausted)?;
        let recycled = if self.config.reuse_addresses {
            st.free.get_mut(&span).and_then(Vec::pop)
        } else {
            None
        };
        let addr = match recycled {
            Some(a) => a,
            None => {
                let addr = st.next;
                st.next = addr
                    .checked_add(span)
                    .and_then(|e| e.checked_add(GUARD))
                    .ok_or_else(exhausted)?;
                addr
            }
        };
        st.blocks.insert(
            addr,
            Block {
                size: bytes,
                mem: Arc::new(mem),
                mappings: Vec::new(),
            },
        );
        st.ledger.on_alloc(DevPtr(addr), bytes);
        self.charge(st, Op::Alloc, bytes, None, bytes);
        Ok(DevPtr(addr))
    }

    fn do_free(&self, st: &mut State, ptr: DevPtr) -> Result<(), DeviceError> {
        let Some(block) = st.blocks.get(&ptr.0) else {
            return Err(err(
                Op::Free,
                "sim_free",
                codes::BAD_ADDRESS,
                "not a live allocation (unknown address or already freed)",
            )
            .at(ptr.0));
        };
        if !block.mappings.is_empty() {
            return Err(err(
                Op::Free,
                "sim_free",
                codes::BUSY,
                format!(
                    "allocation still has {} host mapping(s); unmap first",
                    block.mappings.len()
                ),
            )
            .at(ptr.0)
            .sized(block.size));
        }
        let size = block.size;
        st.blocks.remove(&ptr.0);
        if self.config.reuse_addresses {
            // The span `do_alloc` computed the same way: it did not overflow there, so it is `Some`.
            if let Some(span) = size.checked_next_multiple_of(SIM_ALIGN) {
                st.free.entry(span).or_default().push(ptr.0);
            }
        }
        st.ledger.on_free(ptr);
        Ok(())
    }

    fn do_map(&self, st: &mut State, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError> {
        let (offset, block) = st.find(Op::Map, ptr.0, bytes)?;
        let block_size = block.size;
        let base = ptr.0 - offset;
        let end = ptr.0 + bytes;
        if block
            .mappings
            .iter()
            .any(|&(s, l)| s < end && ptr.0 < s + l)
        {
            return Err(err(
                Op::Map,
                "sim_host_register",
                codes::PARA_ERROR,
                "range is already mapped (a mapping leaked?)",
            )
            .at(ptr.0)
            .sized(bytes));
        }
        if bytes == 0 {
            return Err(err(
                Op::Map,
                "sim_host_register",
                codes::INVALID_VALUE,
                "zero-byte mapping",
            )
            .at(ptr.0));
        }
        if !self.config.svm.grants(block_size) {
            st.ledger.on_map(false);
            return Ok(MapGrant::Refused {
                code: codes::NOT_SUPPORT,
                reason: format!(
                    "sim svm policy {:?} refuses an allocation of {block_size} bytes",
                    self.config.svm
                ),
            });
        }
        let mem = block.mem.clone();
        st.blocks
            .get_mut(&base)
            .expect("found above")
            .mappings
            .push((ptr.0, bytes));
        st.ledger.on_map(true);
        Ok(MapGrant::Mapped {
            mem,
            offset: offset as usize,
        })
    }

    fn do_unmap(st: &mut State, ptr: DevPtr) -> Result<(), DeviceError> {
        let (offset, _) = st.find(Op::Unmap, ptr.0, 1)?;
        let block = st.blocks.get_mut(&(ptr.0 - offset)).expect("found above");
        let Some(i) = block.mappings.iter().position(|&(s, _)| s == ptr.0) else {
            return Err(err(
                Op::Unmap,
                "sim_host_unregister",
                codes::NOT_EXIST,
                "no host mapping starts at this address",
            )
            .at(ptr.0));
        };
        block.mappings.swap_remove(i);
        st.ledger.on_unmap();
        Ok(())
    }
}

impl Device for SimDevice {
    fn platform(&self) -> &'static str {
        "sim"
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        traced(&mut *self.lock(), op, 0, bytes, injected(op), |st| {
            self.do_alloc(st, bytes)
        })
    }

    fn free(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let mut st = self.lock();
        let size = st.blocks.get(&ptr.0).map_or(0, |b| b.size);
        let op = Op::Free;
        traced(&mut *st, op, ptr.0, size, injected(op), |st| {
            self.do_free(st, ptr)?;
            self.charge(st, op, size, None, size);
            Ok(())
        })
    }

    fn copy_h2d(&self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::H2d, src.len() as u64);
        traced(&mut *self.lock(), op, dst.0, bytes, injected(op), |st| {
            let (off, b) = st.find(op, dst.0, bytes)?;
            b.mem
                .write(off as usize, src)
                .map_err(|e| err(op, call_name(op), codes::BAD_ADDRESS, e.to_string()).at(dst.0))?;
            let alloc = b.size;
            self.charge(
                st,
                op,
                bytes,
                Some((src.as_ptr() as usize, src.len())),
                alloc,
            );
            Ok(())
        })
    }

    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::D2h, dst.len() as u64);
        let host = (dst.as_ptr() as usize, dst.len());
        traced(&mut *self.lock(), op, src.0, bytes, injected(op), |st| {
            let (off, b) = st.find(op, src.0, bytes)?;
            b.mem
                .read(off as usize, dst)
                .map_err(|e| err(op, call_name(op), codes::BAD_ADDRESS, e.to_string()).at(src.0))?;
            let alloc = b.size;
            self.charge(st, op, bytes, Some(host), alloc);
            Ok(())
        })
    }

    fn fill(&self, dst: DevPtr, bytes: u64, value: u8) -> Result<(), DeviceError> {
        let op = Op::Memset;
        traced(&mut *self.lock(), op, dst.0, bytes, injected(op), |st| {
            let (off, b) = st.find(op, dst.0, bytes)?;
            b.mem
                .fill(off as usize, bytes as usize, value)
                .map_err(|e| err(op, call_name(op), codes::BAD_ADDRESS, e.to_string()).at(dst.0))?;
            let alloc = b.size;
            self.charge(st, op, bytes, None, alloc);
            Ok(())
        })
    }

    fn map_host(&self, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError> {
        let op = Op::Map;
        traced(&mut *self.lock(), op, ptr.0, bytes, injected(op), |st| {
            let grant = self.do_map(st, ptr, bytes)?;
            if matches!(grant, MapGrant::Mapped { .. }) {
                let alloc = st.find(op, ptr.0, bytes).map_or(bytes, |(_, b)| b.size);
                self.charge(st, op, bytes, None, alloc);
            }
            Ok(grant)
        })
    }

    fn unmap_host(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let mut st = self.lock();
        // The mapping's size, for the log and the error (0 when nothing is mapped here), and
        // its allocation's (registration is priced per page of the allocation's page size).
        let (bytes, alloc) = st.find(Op::Unmap, ptr.0, 1).ok().map_or((0, 0), |(_, b)| {
            let span = b.mappings.iter().find(|&&(s, _)| s == ptr.0);
            (span.map_or(0, |&(_, l)| l), b.size)
        });
        let op = Op::Unmap;
        traced(&mut *st, op, ptr.0, bytes, injected(op), |st| {
            Self::do_unmap(st, ptr).map_err(|e| e.sized(bytes))?;
            self.charge(st, op, bytes, None, alloc);
            Ok(())
        })
    }

    fn has_kernel_memory(&self) -> bool {
        true
    }

    fn cost_models(&self) -> &[CostModel] {
        &self.config.models
    }

    fn modeled(&self) -> Vec<(&'static str, PerModel)> {
        self.lock().ledger.modeled()
    }

    fn charge_modeled(&self, phase: &'static str, ns: PerModel) {
        if !self.config.models.is_empty() {
            self.lock().ledger.charge_to(phase, ns);
        }
    }

    /// A plain mirror. Under a model whose platform page-locks mirrors, it counts as pinned for
    /// that model (its copies run at pinned bandwidth and its locking is charged); the
    /// driver's `pins` counters follow the primary model.
    fn alloc_mirror(&self, len: usize) -> Result<Arc<HostMem>, HostMemError> {
        let mem = Arc::new(HostMem::new(len, 0)?);
        if self.config.models.iter().any(|m| m.pins_mirrors) {
            if let Some(addr) = mem.owned_addr() {
                let mut st = self.lock();
                st.pinned.insert(addr, len);
                if self.primary_pins() {
                    st.ledger.on_pin(len as u64);
                }
                self.charge(&mut st, Op::Pin, len as u64, None, 0);
            }
        }
        Ok(mem)
    }

    fn free_mirror(&self, mem: &Arc<HostMem>) -> Result<(), DeviceError> {
        if let Some(addr) = mem.owned_addr() {
            let mut st = self.lock();
            if let Some(len) = st.pinned.remove(&addr) {
                if self.primary_pins() {
                    st.ledger.on_unpin(len as u64);
                }
            }
        }
        Ok(())
    }

    fn kernel_memory(&self, ptr: DevPtr, bytes: u64) -> Option<(Arc<HostMem>, usize)> {
        let st = self.lock();
        let (off, block) = st.find(Op::D2h, ptr.0, bytes).ok()?;
        Some((block.mem.clone(), off as usize))
    }

    fn with_ledger(&self, f: &mut dyn FnMut(&mut Ledger)) {
        f(&mut self.lock().ledger);
    }

    fn default_fault_code(&self, _op: Op) -> i64 {
        codes::INNER_ERR
    }

    fn close(&self) -> CloseReport {
        let mut st = self.lock();
        st.ledger.clear_faults();
        let mut report = CloseReport::default();
        let bases: Vec<u64> = st.blocks.keys().rev().copied().collect();
        for base in bases {
            let mappings = std::mem::take(&mut st.blocks.get_mut(&base).expect("live").mappings);
            for (start, len) in mappings {
                report.leaked_mappings += 1;
                st.ledger.on_unmap();
                st.ledger.record(Op::Unmap, start, len, 0);
            }
            let size = st.blocks[&base].size;
            report.leaked_allocations += 1;
            report.leaked_bytes += size;
            let r = self.do_free(&mut st, DevPtr(base));
            if let Err(e) = st.ledger.logged(Op::Free, base, size, r) {
                report.errors.push(e);
            }
        }
        if report.leaked_allocations > 0 {
            log::warn!(
                "sim device closed with {} live allocation(s) ({} bytes) and {} mapping(s); freed them",
                report.leaked_allocations,
                report.leaked_bytes,
                report.leaked_mappings
            );
        }
        report
    }

    fn closed(&self) -> bool {
        false
    }
}

mod svm;
#[cfg(test)]
mod tests;

pub use svm::SvmPolicy;
