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
//! * `Refused` — a staging allocation the driver refused to map. Staged tensors are small and
//!   live one run, so they get a per-run copy of their own span instead of a mirror of the whole
//!   arena; the refusal is cached so the driver is asked once per allocation.

use std::sync::Arc;

use simpler_driver::{DevPtr, Device, HostMem, MapGrant};

use crate::addr::AddrMap;
use crate::error::{Error, Phase, Result};

/// How an allocation is reached from the host.
#[derive(Debug, Clone)]
pub enum Means {
    Mapped { mem: Arc<HostMem>, offset: usize },
    Mirror { mem: Arc<HostMem>, stale: bool },
    Refused,
}

impl Means {
    /// `"mapping"`, `"mirror"` or `"refused"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Means::Mapped { .. } => "mapping",
            Means::Mirror { .. } => "mirror",
            Means::Refused => "refused",
        }
    }
}

/// What establishing or refreshing a view did, for the run report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ViewEvents {
    pub mapped: u64,
    pub mirrored: u64,
    pub refreshes: u64,
    pub refresh_bytes: u64,
}

impl ViewEvents {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: ViewEvents) {
        self.mapped += other.mapped;
        self.mirrored += other.mirrored;
        self.refreshes += other.refreshes;
        self.refresh_bytes += other.refresh_bytes;
    }
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    means: Means,
}

/// Views at or above this size log a warning when established (`docs/concepts.md`).
pub const LARGE_VIEW_BYTES: u64 = 1 << 20;

/// The cache. See the module docs.
#[derive(Debug, Default)]
pub struct ViewCache {
    entries: AddrMap<Entry>,
    /// Bumped whenever an established means may stop being what an earlier lookup returned (a
    /// mirror goes stale, an entry is released), so callers may keep a lookup while it is equal.
    epoch: u64,
}

fn dev_err(phase: Phase, tensor: &str, e: simpler_driver::DeviceError) -> Error {
    Error::device(phase, Some(tensor), e)
}

impl ViewCache {
    /// See the field: a lookup made at this epoch is still valid.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The means of an allocation, if one was established.
    pub fn kind(&self, base: DevPtr) -> Option<&'static str> {
        self.entries.get(&base.0).map(|e| e.means.kind())
    }

    /// Number of live entries by kind: (mapped, mirrored, refused).
    pub fn counts(&self) -> (u64, u64, u64) {
        let mut c = (0, 0, 0);
        for e in self.entries.values() {
            match e.means {
                Means::Mapped { .. } => c.0 += 1,
                Means::Mirror { .. } => c.1 += 1,
                Means::Refused => c.2 += 1,
            }
        }
        c
    }

    /// Returns the means for the allocation at `base` (`bytes` long), establishing it on first
    /// use. `mirror_on_refusal` chooses a whole-allocation mirror (resident) or a cached refusal
    /// (staging). A stale mirror is refreshed here, once. `tensor` names the accessing tensor.
    pub fn ensure(
        &mut self,
        dev: &dyn Device,
        base: DevPtr,
        bytes: u64,
        mirror_on_refusal: bool,
        tensor: &str,
        ev: &mut ViewEvents,
    ) -> Result<Means> {
        if let Some(e) = self.entries.get_mut(&base.0) {
            if let Means::Mirror { mem, stale } = &mut e.means {
                if *stale {
                    fill_mirror(dev, mem, base, tensor)?;
                    *stale = false;
                    ev.refreshes += 1;
                    ev.refresh_bytes += e.bytes;
                }
            }
            return Ok(e.means.clone());
        }
        let grant = dev
            .map_host(base, bytes)
            .map_err(|e| dev_err(Phase::Orchestrate, tensor, e))?;
        let means = match grant {
            MapGrant::Mapped { mem, offset } => {
                ev.mapped += 1;
                Means::Mapped { mem, offset }
            }
            MapGrant::Refused { code, reason } if mirror_on_refusal => {
                log::debug!(
                    "map_host refused for allocation {base} ({bytes} bytes, code {code}: {reason}); mirroring"
                );
                let len = usize::try_from(bytes).map_err(|_| {
                    Error::geometry(format!("tensor {tensor}"), "allocation too large to mirror")
                })?;
                let mem = dev.alloc_mirror(len).map_err(|e| {
                    Error::Value(format!(
                        "tensor {tensor}: cannot allocate a host mirror: {e}"
                    ))
                })?;
                if let Err(e) = fill_mirror(dev, &mem, base, tensor) {
                    give_back_mirror(dev, &mem, base);
                    return Err(e);
                }
                ev.mirrored += 1;
                Means::Mirror { mem, stale: false }
            }
            MapGrant::Refused { code, .. } => {
                log::debug!("map_host refused for staging allocation {base} (code {code})");
                Means::Refused
            }
        };
        if bytes >= LARGE_VIEW_BYTES {
            if mirror_on_refusal {
                log::warn!(
                    "established a host {} of {bytes} bytes for tensor {tensor} (allocation {base}); \
                     host views of large tensors cost {}",
                    means.kind(),
                    if matches!(means, Means::Mirror { .. }) {
                        "a bulk copy per refresh"
                    } else {
                        "a mapping for the allocation's life"
                    }
                );
            } else if matches!(means, Means::Mapped { .. }) {
                // A staged tensor's view maps the whole staging allocation it lives in, once for
                // that allocation's life: say how large it is.
                log::warn!(
                    "mapped the whole staging allocation {base} ({bytes} bytes) to reach staged \
                     tensor {tensor}; host views of staged tensors map the arena they share"
                );
            }
        }
        self.entries.insert(
            base.0,
            Entry {
                bytes,
                means: means.clone(),
            },
        );
        Ok(means)
    }

    /// Marks the mirror of `base` stale (a run may have written it, or the host copied into it).
    pub fn mark_stale(&mut self, base: DevPtr) {
        if let Some(Entry {
            means: Means::Mirror { stale, .. },
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
            Some(Means::Mapped { .. }) => dev.unmap_host(base)?,
            Some(Means::Mirror { mem, .. }) => give_back_mirror(dev, mem, base),
            _ => {}
        }
        self.entries.remove(&base.0);
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

fn fill_mirror(dev: &dyn Device, mem: &HostMem, base: DevPtr, tensor: &str) -> Result<()> {
    mem.with_slice_mut(0, mem.len(), |dst| dev.copy_d2h(dst, base))
        .map_err(|e| Error::Value(format!("tensor {tensor}: mirror access: {e}")))?
        .map_err(|e| dev_err(Phase::Orchestrate, tensor, e))
}
