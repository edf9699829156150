//! The worker: owner of every device allocation it makes (user buffers, resident sets, the
//! staging arena), of the allocation-scoped host-view cache, and of the run in progress.
//!
//! Ownership rules:
//! * a means (mapping or mirror) is released before its allocation is freed, on every path
//!   (`free`, resident release, arena growth, fresh-staging cleanup, `close`);
//! * a buffer owned by a resident set cannot be freed with `free`; a buffer bound to the run in
//!   progress cannot be freed at all;
//! * a free that fails leaves the allocation recorded, so `close` tries again and reports it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use simpler_driver::{CloseReport, DevPtr, Device, DeviceError, Stats};

use crate::arena::Arena;
use crate::error::{Error, Phase, Result};
use crate::geometry::{span_contains, Geometry};
use crate::run::RunState;
use crate::views::ViewCache;

/// How host-staged tensors get device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// Bump-allocated from a retained arena (no malloc/free on a warm run).
    Arena,
    /// A fresh allocation per staged tensor per run, freed at cleanup (the upstream mainline,
    /// kept so the staging cost stays observable).
    Fresh,
}

impl Staging {
    /// Parses `"arena"` / `"fresh"`.
    pub fn parse(s: &str) -> Result<Staging> {
        match s {
            "arena" => Ok(Staging::Arena),
            "fresh" => Ok(Staging::Fresh),
            _ => Err(Error::Value(format!(
                "staging must be 'arena' or 'fresh', not '{s}'"
            ))),
        }
    }
}

/// Argument direction, from a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    In,
    Out,
    InOut,
}

impl Direction {
    /// Whether the device may write it.
    pub fn writes(self) -> bool {
        !matches!(self, Direction::In)
    }
    /// Whether its host contents are uploaded.
    pub fn reads(self) -> bool {
        !matches!(self, Direction::Out)
    }
    /// `"IN"`, `"OUT"`, `"INOUT"`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::In => "IN",
            Direction::Out => "OUT",
            Direction::InOut => "INOUT",
        }
    }
}

/// Who owns an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    User,
    Resident(u64),
    Staging,
    /// A resident or staging allocation whose free failed; `close` retries it.
    Orphan,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocInfo {
    pub bytes: u64,
    pub owner: Owner,
}

#[derive(Debug)]
pub(crate) struct ResidentEntry {
    pub name: String,
    pub ptr: DevPtr,
}

/// What `close` found.
#[derive(Debug, Default, Clone)]
pub struct CloseSummary {
    /// User buffers still live at close (freed by close).
    pub user_buffers: u64,
    /// Resident sets still live at close (released by close).
    pub resident_sets: u64,
    /// What the driver's own close found after that (should be nothing).
    pub device: CloseReport,
    /// Failures while releasing.
    pub errors: Vec<Error>,
}

/// The worker. Not `Sync`: the bindings serialize access with a lock.
#[derive(Debug)]
pub struct Worker {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) staging: Staging,
    pub(crate) allocs: HashMap<u64, AllocInfo>,
    pub(crate) views: ViewCache,
    pub(crate) arena: Arena,
    /// The retained scratch pool: chunks (base, size) that `orch.scratch` tensors are carved from.
    pub(crate) scratch: Vec<(DevPtr, u64)>,
    pub(crate) resident: BTreeMap<u64, Vec<ResidentEntry>>,
    next_set: u64,
    pub(crate) run: Option<RunState>,
    pub(crate) run_gen: u64,
    closed: bool,
}

impl Worker {
    /// A worker over `dev`.
    pub fn new(dev: Arc<dyn Device>, staging: Staging) -> Worker {
        Worker {
            dev,
            staging,
            allocs: HashMap::new(),
            views: ViewCache::default(),
            arena: Arena::default(),
            scratch: Vec::new(),
            resident: BTreeMap::new(),
            next_set: 1,
            run: None,
            run_gen: 0,
            closed: false,
        }
    }

    /// The driver.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// The staging mode.
    pub fn staging(&self) -> Staging {
        self.staging
    }

    /// Cumulative driver counters.
    pub fn stats(&self) -> Stats {
        self.dev.stats()
    }

    /// The current staging arena allocation, if any.
    pub fn arena(&self) -> Option<(DevPtr, u64)> {
        self.arena.current()
    }

    /// Live host views: (mapped, mirrored, refused staging allocations).
    pub fn view_counts(&self) -> (u64, u64, u64) {
        self.views.counts()
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::State("worker is closed".into()));
        }
        Ok(())
    }

    /// Whether `close` has run.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    fn buffer_err(e: DeviceError) -> Error {
        Error::device(Phase::Buffer, None, e)
    }

    /// Allocates a user buffer of `bytes` (> 0).
    pub fn malloc(&mut self, bytes: u64) -> Result<DevPtr> {
        self.check_open()?;
        if bytes == 0 {
            return Err(Error::Value(
                "malloc of 0 bytes: a device buffer needs at least 1 byte".into(),
            ));
        }
        let ptr = self.dev.alloc(bytes).map_err(Self::buffer_err)?;
        self.allocs.insert(
            ptr.0,
            AllocInfo {
                bytes,
                owner: Owner::User,
            },
        );
        Ok(ptr)
    }

    /// The live allocation starting at `ptr`.
    pub(crate) fn alloc_info(&self, ptr: DevPtr, what: &str) -> Result<AllocInfo> {
        self.allocs.get(&ptr.0).copied().ok_or_else(|| {
            Error::State(format!(
                "{what}: device address {ptr} is not a live allocation of this worker (freed, released or never allocated)"
            ))
        })
    }

    fn bound_to_run(&self, ptr: DevPtr) -> bool {
        self.run.as_ref().is_some_and(|r| r.binds(ptr))
    }

    /// Frees a user buffer: its host view first, then the allocation.
    pub fn free(&mut self, ptr: DevPtr) -> Result<()> {
        self.check_open()?;
        let info = self.alloc_info(ptr, "free")?;
        match info.owner {
            Owner::User => {}
            Owner::Resident(_) => {
                return Err(Error::State(format!(
                    "free: buffer {ptr} is owned by a ResidentTaskArgs; release that instead"
                )))
            }
            _ => {
                return Err(Error::State(format!(
                    "free: buffer {ptr} is owned by the worker"
                )))
            }
        }
        if self.bound_to_run(ptr) {
            return Err(Error::State(format!(
                "free: buffer {ptr} is bound as an argument of the run in progress"
            )));
        }
        self.release_alloc(ptr).map_err(Self::buffer_err)
    }

    /// Unmaps/drops the view, then frees; forgets the allocation only if the free succeeded.
    pub(crate) fn release_alloc(&mut self, ptr: DevPtr) -> std::result::Result<(), DeviceError> {
        self.views.release(&*self.dev, ptr)?;
        self.dev.free(ptr)?;
        self.allocs.remove(&ptr.0);
        Ok(())
    }

    fn check_span(&self, ptr: DevPtr, offset: u64, len: u64, what: &str) -> Result<AllocInfo> {
        let info = self.alloc_info(ptr, what)?;
        if !span_contains(0, info.bytes, offset, len) {
            return Err(Error::Value(format!(
                "{what}: {len} bytes at offset {offset} run past buffer {ptr} of {} bytes",
                info.bytes
            )));
        }
        Ok(info)
    }

    /// Copies host bytes into a buffer at `offset`. A mirror of the buffer goes stale.
    pub fn copy_to(&mut self, ptr: DevPtr, offset: u64, src: &[u8]) -> Result<()> {
        self.check_open()?;
        self.check_span(ptr, offset, src.len() as u64, "copy_to")?;
        if src.is_empty() {
            return Ok(());
        }
        let r = self.dev.copy_h2d(DevPtr(ptr.0 + offset), src);
        // Even a failed copy may have moved some bytes.
        self.views.mark_stale(ptr);
        r.map_err(Self::buffer_err)
    }

    /// Copies `dst.len()` bytes at `offset` of a buffer to the host.
    pub fn copy_from(&self, ptr: DevPtr, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check_open()?;
        self.check_span(ptr, offset, dst.len() as u64, "copy_from")?;
        if dst.is_empty() {
            return Ok(());
        }
        self.dev
            .copy_d2h(dst, DevPtr(ptr.0 + offset))
            .map_err(Self::buffer_err)
    }

    /// Checks that `geometry` fits the live buffer at `ptr` (for `Buffer.tensor` and binding).
    pub fn check_tensor(&self, ptr: DevPtr, geometry: &Geometry, what: &str) -> Result<()> {
        self.check_open()?;
        let info = self.alloc_info(ptr, what)?;
        if geometry.end_byte() > info.bytes {
            return Err(Error::Value(format!(
                "{what}: tensor spans bytes [{}, {}) of buffer {ptr}, which has only {} bytes",
                geometry.start_byte(),
                geometry.end_byte(),
                info.bytes
            )));
        }
        Ok(())
    }

    /// The host-view mechanism of the allocation at `ptr`: `"mapping"`, `"mirror"`, or `None`.
    pub fn host_view_info(&self, ptr: DevPtr) -> Result<Option<&'static str>> {
        self.alloc_info(ptr, "host_view_info")?;
        Ok(self.views.kind(ptr))
    }

    // ---- resident sets -------------------------------------------------------------------

    /// Opens an empty resident set; returns its id.
    pub fn resident_open(&mut self) -> Result<u64> {
        self.check_open()?;
        let id = self.next_set;
        self.next_set += 1;
        self.resident.insert(id, Vec::new());
        Ok(id)
    }

    fn set_mut(&mut self, set: u64) -> Result<&mut Vec<ResidentEntry>> {
        self.resident
            .get_mut(&set)
            .ok_or_else(|| Error::State(format!("resident set {set} was released")))
    }

    /// Allocates a case-owned buffer for `name` (a contiguous `geometry`), uploads `host` unless
    /// `dir` is OUT, and records it in `set`. Everything is validated before the allocation; on a
    /// failure after it, nothing this call allocated stays live.
    pub fn resident_add(
        &mut self,
        set: u64,
        name: &str,
        geometry: &Geometry,
        dir: Direction,
        host: &[u8],
    ) -> Result<DevPtr> {
        self.check_open()?;
        if !geometry.is_contiguous() || geometry.offset() != 0 {
            return Err(Error::Value(format!(
                "resident tensor '{name}' must be contiguous from its first byte"
            )));
        }
        let bytes = geometry.nbytes();
        if self.set_mut(set)?.iter().any(|e| e.name == name) {
            return Err(Error::Value(format!(
                "resident tensor '{name}' was already added"
            )));
        }
        if bytes == 0 {
            return Err(Error::Value(format!(
                "resident tensor '{name}' has no bytes; zero-size fixtures stay host-staged"
            )));
        }
        if host.len() as u64 != bytes {
            return Err(Error::Value(format!(
                "resident tensor '{name}': {} host bytes for a {bytes}-byte tensor",
                host.len()
            )));
        }
        let ptr = self
            .dev
            .alloc(bytes)
            .map_err(|e| Error::device(Phase::ResidentAdd, Some(name), e))?;
        self.allocs.insert(
            ptr.0,
            AllocInfo {
                bytes,
                owner: Owner::Resident(set),
            },
        );
        if dir.reads() {
            if let Err(e) = self.dev.copy_h2d(ptr, host) {
                let err = Error::device(Phase::ResidentAdd, Some(name), e);
                if let Err(fe) = self.release_alloc(ptr) {
                    log::error!(
                        "resident add '{name}': freeing {ptr} after a failed upload failed: {fe}"
                    );
                    self.orphan(ptr);
                }
                return Err(err);
            }
        }
        self.set_mut(set)?.push(ResidentEntry {
            name: name.to_owned(),
            ptr,
        });
        Ok(ptr)
    }

    /// Keeps an allocation whose free failed recorded, owned by the worker, so `close` retries it.
    pub(crate) fn orphan(&mut self, ptr: DevPtr) {
        if let Some(i) = self.allocs.get_mut(&ptr.0) {
            i.owner = Owner::Orphan;
        }
    }

    /// Whether `set` is still open.
    pub fn resident_is_open(&self, set: u64) -> bool {
        self.resident.contains_key(&set)
    }

    /// Releases a resident set in LIFO order, attempting every free even when one fails (each
    /// failure is logged and returned). Idempotent: releasing a released set does nothing.
    pub fn resident_release(&mut self, set: u64) -> Vec<Error> {
        let Some(entries) = self.resident.get(&set) else {
            return Vec::new();
        };
        if let Some(e) = entries.iter().find(|e| self.bound_to_run(e.ptr)) {
            return vec![Error::State(format!(
                "release: resident tensor '{}' is bound to the run in progress",
                e.name
            ))];
        }
        let entries = self.resident.remove(&set).unwrap_or_default();
        let mut errors = Vec::new();
        for e in entries.into_iter().rev() {
            if let Err(err) = self.release_alloc(e.ptr) {
                log::error!(
                    "release of resident tensor '{}' ({}) failed: {err}",
                    e.name,
                    e.ptr
                );
                self.orphan(e.ptr);
                errors.push(Error::device(Phase::Release, Some(&e.name), err));
            }
        }
        errors
    }

    /// Names and addresses of a resident set, in insertion order.
    pub fn resident_entries(&self, set: u64) -> Result<Vec<(String, DevPtr)>> {
        let entries = self
            .resident
            .get(&set)
            .ok_or_else(|| Error::State(format!("resident set {set} was released")))?;
        Ok(entries.iter().map(|e| (e.name.clone(), e.ptr)).collect())
    }

    // ---- close ---------------------------------------------------------------------------

    /// Ends the run in progress (if any), releases resident sets (newest first), user buffers and
    /// the arena — each view before its allocation — then closes the driver. Idempotent.
    pub fn close(&mut self) -> CloseSummary {
        let mut s = CloseSummary::default();
        if self.closed {
            return s;
        }
        if self.run.is_some() {
            self.abort_run();
        }
        let sets: Vec<u64> = self.resident.keys().rev().copied().collect();
        s.resident_sets = sets.len() as u64;
        for set in sets {
            s.errors.extend(self.resident_release(set));
        }
        let mut rest: Vec<(u64, AllocInfo)> = self.allocs.iter().map(|(&p, &i)| (p, i)).collect();
        rest.sort_by_key(|b| std::cmp::Reverse(b.0));
        for (p, info) in rest {
            if info.owner == Owner::User {
                s.user_buffers += 1;
            }
            if let Err(e) = self.release_alloc(DevPtr(p)) {
                s.errors.push(Error::device(Phase::Close, None, e));
            }
        }
        self.arena = Arena::default();
        self.scratch.clear();
        s.device = self.dev.close();
        // The driver's close removed every mapping, including those whose unmap failed above:
        // drop their view entries too, so nothing of the device outlives close.
        self.views = ViewCache::default();
        self.allocs.clear();
        self.closed = true;
        if s.user_buffers > 0 || s.resident_sets > 0 {
            log::warn!(
                "worker closed with {} live buffer(s) and {} unreleased resident set(s); freed them",
                s.user_buffers,
                s.resident_sets
            );
        }
        s
    }
}
