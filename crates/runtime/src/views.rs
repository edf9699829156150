//! The allocation-scoped host-view cache (see `docs/concepts.md`, "Host views").
//!
//! Keyed by allocation base address, owned by the worker (who owns malloc/free), and released
//! before the allocation is freed. A means is established on first access and kept for the
//! allocation's life:
//! * `Mapped` — the driver granted `map_host` for this allocation; reads and writes hit device
//!   bytes.
//! * `Mirror` — the driver refused; one bulk D2H fills a host copy, reads hit it, writes update it
//!   and are pushed to the device at once. It goes stale when a run may have written the
//!   allocation, or the host copied into it; the next read refreshes it with one D2H.
//! * `Cached` — a mapping, read through a host cache of the allocation: one bulk copy out of the
//!   mapping fills it (no driver call), reads hit it, writes go through the mapping and update
//!   it; it goes stale by the mirror's rule and the next read refreshes it. A mapping is a poor
//!   place to read from (write-combined device memory behind the bus: every read is an uncached
//!   round trip), so read-heavy allocations are better served from host memory.
//! * `Refused` — a chunk of the scratch pool the driver refused to map (or that the mirror policy
//!   keeps unmapped). Scratch tensors live one run, so they get a per-run copy of their own span
//!   (one D2H) instead of a mirror of the whole chunk; the refusal is cached so the driver is
//!   asked once per allocation. A scratch tensor read often through a granted mapping gets a
//!   per-run copy of its span too, filled out of the mapping (`run/access.rs`). (Staged tensors
//!   never come here: they are read from the bytes the run uploaded.)
//!
//! Which of mapping, cached and mirror an allocation gets is its [`ViewPolicy`]: the worker's
//! default or a per-allocation hint. Under `Auto` a granted mapping starts as `Mapped` and is
//! turned into `Cached` once the reads through it would have paid for a bulk copy (see
//! [`ViewCache::note_mapped_reads`]).

use std::sync::Arc;

use simpler_driver::{CostModel, DevPtr, Device, HostMem, HostMemError, MapGrant};

use crate::addr::AddrMap;
use crate::error::{Error, Phase, Result};

/// How an allocation is reached from the host.
#[derive(Debug, Clone)]
pub enum Means {
    Mapped {
        mem: Arc<HostMem>,
        offset: usize,
    },
    Mirror {
        mem: Arc<HostMem>,
        stale: bool,
    },
    /// A mapping (`map`, at `offset`) read through a host cache of the whole allocation.
    Cached {
        map: Arc<HostMem>,
        offset: usize,
        cache: Arc<HostMem>,
        stale: bool,
    },
    Refused,
}

impl Means {
    /// `"mapping"`, `"mirror"`, `"cached"` or `"refused"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Means::Mapped { .. } => "mapping",
            Means::Mirror { .. } => "mirror",
            Means::Cached { .. } => "cached",
            Means::Refused => "refused",
        }
    }
}

/// How a resident allocation is reached from the host (`docs/host-views.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ViewPolicy {
    /// A mapping where the driver grants one, turned into a cached view once reads dominate;
    /// a mirror otherwise.
    #[default]
    Auto,
    /// A mapping where the driver grants one (reads and writes through it); a mirror otherwise.
    Mapping,
    /// A mapping read through a host cache; a mirror where the driver refuses to map.
    Cached,
    /// A mirror (one bulk D2H per stale read), even where the driver would map.
    Mirror,
}

impl ViewPolicy {
    /// Every policy, in documentation order.
    pub const ALL: [ViewPolicy; 4] = [
        ViewPolicy::Auto,
        ViewPolicy::Mapping,
        ViewPolicy::Cached,
        ViewPolicy::Mirror,
    ];

    /// Parses a policy's [`name`](ViewPolicy::name).
    pub fn parse(s: &str) -> Option<ViewPolicy> {
        ViewPolicy::ALL.into_iter().find(|p| p.name() == s)
    }

    /// `"auto"`, `"mapping"`, `"cached"` or `"mirror"`.
    pub fn name(self) -> &'static str {
        match self {
            ViewPolicy::Auto => "auto",
            ViewPolicy::Mapping => "mapping",
            ViewPolicy::Cached => "cached",
            ViewPolicy::Mirror => "mirror",
        }
    }
}

/// Under [`ViewPolicy::Auto`], a mapping becomes a cached view once the element reads through
/// it have cost what one bulk copy of the allocation out of the mapping costs, as the worker's
/// cost model prices both ([`CostModel::reads_worth_a_copy`]: ~1.7 us per uncached read
/// against ~0.3 GB/s of streaming loads, one read per ~510 bytes; `docs/cost-model.md`) ...
/// but never before this many reads.
pub const AUTO_CACHE_MIN_READS: u64 = 16;
/// Allocations larger than this stay mappings under `Auto` (a cache doubles their host memory).
pub const AUTO_CACHE_MAX_BYTES: u64 = 64 << 20;

impl ViewPolicy {
    /// Whether the reads through a mapping of `bytes`, `reads` of them made so far, are to be
    /// served from a host copy: always under `Cached`; under `Auto` once they have reached the
    /// point where the copy pays under `model` (see [`AUTO_CACHE_MIN_READS`]; never for more
    /// than [`AUTO_CACHE_MAX_BYTES`]); never under `Mapping` and `Mirror`.
    pub fn reads_from_copy(self, bytes: u64, reads: u64, model: &CostModel) -> bool {
        match self {
            ViewPolicy::Cached => true,
            ViewPolicy::Auto => {
                bytes <= AUTO_CACHE_MAX_BYTES
                    && reads >= model.reads_worth_a_copy(bytes).max(AUTO_CACHE_MIN_READS)
            }
            ViewPolicy::Mapping | ViewPolicy::Mirror => false,
        }
    }
}

/// Who is reaching an allocation through its view: the tensor (named in errors) and the phase
/// the worker is in (a driver error is filed under it).
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    pub tensor: &'a str,
    pub phase: Phase,
}

/// What establishing or refreshing a view did, for the run report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ViewEvents {
    pub mapped: u64,
    pub mirrored: u64,
    pub refreshes: u64,
    pub refresh_bytes: u64,
    /// Cached views established (or turned from a mapping), and their fills / refreshes.
    pub cached: u64,
    pub cache_fills: u64,
    pub cache_fill_bytes: u64,
}

impl ViewEvents {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: ViewEvents) {
        self.mapped += other.mapped;
        self.mirrored += other.mirrored;
        self.refreshes += other.refreshes;
        self.refresh_bytes += other.refresh_bytes;
        self.cached += other.cached;
        self.cache_fills += other.cache_fills;
        self.cache_fill_bytes += other.cache_fill_bytes;
    }
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    means: Means,
    /// Element reads made through the mapping (`Mapped` under `Auto`).
    mapped_reads: u64,
    /// A resident allocation (staging allocations are never cached: they change every run).
    resident: bool,
}

/// Views at or above this size log a warning when established (`docs/concepts.md`).
pub const LARGE_VIEW_BYTES: u64 = 1 << 20;

/// The cache. See the module docs.
#[derive(Debug, Default)]
pub struct ViewCache {
    entries: AddrMap<Entry>,
    /// The policy of allocations without a hint.
    pub policy: ViewPolicy,
    /// The cost model whose figures decide when `auto` turns a mapping into a cache: the
    /// worker's primary model, else its platform's ([`CostModel::for_platform`]); `None` reads
    /// as the sim's.
    pub auto_model: Option<CostModel>,
    /// Per-allocation policies (`ResidentTaskArgs.add(..., host_view=...)`).
    hints: AddrMap<ViewPolicy>,
    /// Bumped whenever an established means may stop being what an earlier lookup returned (a
    /// mirror goes stale, an entry is released), so callers may keep a lookup while it is equal.
    epoch: u64,
}

fn dev_err(phase: Phase, tensor: &str, e: simpler_driver::DeviceError) -> Error {
    Error::device(phase, Some(tensor), e)
}

impl ViewCache {
    /// See the field [`ViewCache::auto_model`].
    pub fn auto_model(&self) -> CostModel {
        self.auto_model
            .unwrap_or_else(|| CostModel::for_platform("sim"))
    }

    /// See the field: a lookup made at this epoch is still valid.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The means of an allocation, if one was established.
    pub fn kind(&self, base: DevPtr) -> Option<&'static str> {
        self.entries.get(&base.0).map(|e| e.means.kind())
    }

    /// Sets the policy of the allocation at `base` (before its view is established).
    pub fn hint(&mut self, base: DevPtr, policy: ViewPolicy) {
        self.hints.insert(base.0, policy);
    }

    fn policy_of(&self, base: DevPtr) -> ViewPolicy {
        self.hints.get(&base.0).copied().unwrap_or(self.policy)
    }

    /// Number of live entries by kind: (mapped, mirrored, refused); a cached view counts as
    /// mapped (it holds a mapping).
    pub fn counts(&self) -> (u64, u64, u64) {
        let mut c = (0, 0, 0);
        for e in self.entries.values() {
            match e.means {
                Means::Mapped { .. } | Means::Cached { .. } => c.0 += 1,
                Means::Mirror { .. } => c.1 += 1,
                Means::Refused => c.2 += 1,
            }
        }
        c
    }

    /// Returns the means for the allocation at `base` (`bytes` long), establishing it on first
    /// use. `resident`: a resident allocation (its policy applies; a refused mapping becomes a
    /// whole-allocation mirror), else a run-scoped allocation, a scratch chunk (a mapping or a
    /// cached refusal, never a cache: it changes every run). A stale mirror or cache is refreshed here, once.
    /// `tensor` names the accessing tensor.
    pub fn ensure(
        &mut self,
        dev: &dyn Device,
        base: DevPtr,
        bytes: u64,
        resident: bool,
        who: Who<'_>,
        ev: &mut ViewEvents,
    ) -> Result<Means> {
        let tensor = who.tensor;
        if let Some(e) = self.entries.get_mut(&base.0) {
            match &mut e.means {
                Means::Mirror { mem, stale } if *stale => {
                    fill_mirror(dev, mem, base, who)?;
                    *stale = false;
                    ev.refreshes += 1;
                    ev.refresh_bytes += e.bytes;
                }
                Means::Cached {
                    map,
                    offset,
                    cache,
                    stale,
                } if *stale => {
                    fill_cache(map, *offset, cache, base, tensor)?;
                    *stale = false;
                    ev.cache_fills += 1;
                    ev.cache_fill_bytes += e.bytes;
                }
                _ => {}
            }
            return Ok(e.means.clone());
        }
        // A scratch chunk is mapped unless the worker's policy is the mirror one; what a scratch
        // tensor's reads go through from there is the run's choice (`run/access.rs`).
        let policy = match (resident, self.policy) {
            (true, _) => self.policy_of(base),
            (false, ViewPolicy::Mirror) => ViewPolicy::Mirror,
            (false, _) => ViewPolicy::Mapping,
        };
        let grant = if policy == ViewPolicy::Mirror {
            MapGrant::Refused {
                code: 0,
                reason: "the mirror policy".to_string(),
            }
        } else {
            dev.map_host(base, bytes)
                .map_err(|e| dev_err(who.phase, tensor, e))?
        };
        let means = match grant {
            MapGrant::Mapped { mem, offset } => {
                ev.mapped += 1;
                // The cache is an optimization: without host memory for it, the mapping serves.
                match policy
                    .reads_from_copy(bytes, 0, &self.auto_model())
                    .then(|| new_cache(&mem, offset, bytes, base, tensor))
                {
                    Some(Ok(cache)) => {
                        ev.cached += 1;
                        ev.cache_fills += 1;
                        ev.cache_fill_bytes += bytes;
                        Means::Cached {
                            map: mem,
                            offset,
                            cache,
                            stale: false,
                        }
                    }
                    Some(Err(e)) => {
                        log::warn!("{e}; reading through the mapping instead");
                        Means::Mapped { mem, offset }
                    }
                    None => Means::Mapped { mem, offset },
                }
            }
            MapGrant::Refused { code, reason } if resident => {
                log::debug!(
                    "map_host refused for allocation {base} ({bytes} bytes, code {code}: {reason}); mirroring"
                );
                let len = usize::try_from(bytes).map_err(|_| {
                    Error::geometry(format!("tensor {tensor}"), "allocation too large to mirror")
                })?;
                let mem = dev.alloc_mirror(len).map_err(|e| {
                    Error::Value(format!(
                        "tensor {tensor}: cannot allocate a host mirror of allocation {base} \
                         ({bytes} bytes): {e}"
                    ))
                })?;
                if let Err(e) = fill_mirror(dev, &mem, base, who) {
                    give_back_mirror(dev, &mem, base);
                    return Err(e);
                }
                ev.mirrored += 1;
                Means::Mirror { mem, stale: false }
            }
            MapGrant::Refused { code, reason } => {
                log::debug!(
                    "no mapping of scratch allocation {base} (code {code}: {reason}); scratch \
                     tensors read through per-run copies of their spans"
                );
                Means::Refused
            }
        };
        if bytes >= LARGE_VIEW_BYTES {
            if resident {
                log::warn!(
                    "established a host {} of {bytes} bytes for tensor {tensor} (allocation {base}); \
                     host views of large tensors cost {}",
                    means.kind(),
                    match means {
                        Means::Mirror { .. } => "a bulk copy per refresh",
                        Means::Cached { .. } => "a host copy and a bulk read per refresh",
                        _ => "a mapping for the allocation's life",
                    }
                );
            } else if matches!(means, Means::Mapped { .. }) {
                // A scratch tensor's view maps the whole chunk it lives in, once for that
                // chunk's life: say how large it is.
                log::warn!(
                    "mapped the whole scratch allocation {base} ({bytes} bytes) to reach scratch \
                     tensor {tensor}; host views of scratch tensors map the chunk they share"
                );
            }
        }
        self.entries.insert(
            base.0,
            Entry {
                bytes,
                means: means.clone(),
                mapped_reads: 0,
                resident,
            },
        );
        Ok(means)
    }

    /// Records `reads` element reads made through the mapping of `base`; under
    /// [`ViewPolicy::Auto`], turns the mapping into a cached view once the reads would have paid
    /// for a bulk copy of the allocation (returns whether it did: earlier lookups are stale).
    pub fn note_mapped_reads(
        &mut self,
        base: DevPtr,
        reads: u64,
        tensor: &str,
        ev: &mut ViewEvents,
    ) -> Result<bool> {
        let policy = self.policy_of(base);
        let model = self.auto_model();
        let Some(e) = self.entries.get_mut(&base.0) else {
            return Ok(false);
        };
        e.mapped_reads += reads;
        // Under `Cached` the cache was made at establishment; one that failed is not retried.
        if !e.resident
            || policy != ViewPolicy::Auto
            || !policy.reads_from_copy(e.bytes, e.mapped_reads, &model)
        {
            return Ok(false);
        }
        let Means::Mapped { mem, offset } = &e.means else {
            return Ok(false);
        };
        let cache = match new_cache(mem, *offset, e.bytes, base, tensor) {
            Ok(c) => c,
            Err(err) => {
                // The cache is an optimization: the mapping keeps serving; try again later.
                log::warn!("{err}; reading through the mapping instead");
                e.mapped_reads = 0;
                return Ok(false);
            }
        };
        log::debug!(
            "allocation {base} ({} bytes): {} reads through its mapping; reading through a host cache from now on",
            e.bytes,
            e.mapped_reads
        );
        e.means = Means::Cached {
            map: mem.clone(),
            offset: *offset,
            cache,
            stale: false,
        };
        ev.cached += 1;
        ev.cache_fills += 1;
        ev.cache_fill_bytes += e.bytes;
        self.epoch += 1;
        Ok(true)
    }

    /// Marks the mirror or cache of `base` stale (a run may have written it, or the host copied
    /// into it).
    pub fn mark_stale(&mut self, base: DevPtr) {
        if let Some(Entry {
            means: Means::Mirror { stale, .. } | Means::Cached { stale, .. },
            ..
        }) = self.entries.get_mut(&base.0)
        {
            *stale = true;
            self.epoch += 1;
        }
    }

    /// Releases the means of `base` before its allocation is freed: unmaps a mapping (revoking
    /// nothing the driver still owns), drops a mirror. On an unmap failure the entry stays, so a
    /// retry unmaps again and the allocation is never freed while mapped.
    pub fn release(
        &mut self,
        dev: &dyn Device,
        base: DevPtr,
    ) -> std::result::Result<(), simpler_driver::DeviceError> {
        self.epoch += 1;
        match self.entries.get(&base.0).map(|e| &e.means) {
            Some(Means::Mapped { .. } | Means::Cached { .. }) => dev.unmap_host(base)?,
            Some(Means::Mirror { mem, .. }) => give_back_mirror(dev, mem, base),
            _ => {}
        }
        // The cache (host memory) goes with the entry.
        self.entries.remove(&base.0);
        self.hints.remove(&base.0);
        Ok(())
    }
}

/// Returns a mirror's memory to the driver (unlocking its pages where it locked them). A failure
/// does not hold up the allocation's free: the driver keeps the memory alive and retries at close.
fn give_back_mirror(dev: &dyn Device, mem: &Arc<HostMem>, base: DevPtr) {
    if let Err(e) = dev.free_mirror(mem) {
        log::warn!("mirror of allocation {base}: {e}");
    }
}

/// A host cache of the `bytes` of allocation `base` mapped at `offset` of `map`, filled from it.
fn new_cache(
    map: &HostMem,
    offset: usize,
    bytes: u64,
    base: DevPtr,
    tensor: &str,
) -> Result<Arc<HostMem>> {
    let cache = usize::try_from(bytes)
        .map_err(|_| HostMemError::Alloc(usize::MAX))
        .and_then(|len| HostMem::new(len, 0))
        .map_err(|e| {
            Error::Value(format!(
                "tensor {tensor}: cannot allocate a host cache of allocation {base} ({bytes} \
                 bytes): {e}"
            ))
        })?;
    let cache = Arc::new(cache);
    fill_cache(map, offset, &cache, base, tensor)?;
    Ok(cache)
}

/// Copies the mapped allocation into its cache: one bulk read out of the mapping, no driver call.
fn fill_cache(
    map: &HostMem,
    offset: usize,
    cache: &HostMem,
    base: DevPtr,
    tensor: &str,
) -> Result<()> {
    let fail = |e: HostMemError| {
        Error::Value(format!(
            "tensor {tensor}: filling the host cache of allocation {base} ({} bytes) from its \
             mapping: {e}",
            cache.len()
        ))
    };
    map.with_slice(offset, cache.len(), |src| cache.write(0, src))
        .map_err(fail)?
        .map_err(fail)
}

fn fill_mirror(dev: &dyn Device, mem: &HostMem, base: DevPtr, who: Who<'_>) -> Result<()> {
    let tensor = who.tensor;
    mem.with_slice_mut(0, mem.len(), |dst| dev.copy_d2h(dst, base))
        .map_err(|e| {
            Error::Value(format!(
                "tensor {tensor}: filling the mirror of allocation {base} ({} bytes): {e}",
                mem.len()
            ))
        })?
        .map_err(|e| dev_err(who.phase, tensor, e))
}
