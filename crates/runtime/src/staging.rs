//! How host-staged tensors get device memory: the staging mode, and the retained staging arena
//! that staged tensors are bump-allocated from, run after run. A warm run whose footprint fits
//! does no device malloc or free.

use simpler_driver::DevPtr;

use crate::error::{Error, Phase, Result};
use crate::geometry::align_up;
use crate::memory::{Memory, Owner};

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
    /// Every mode, the default first.
    pub const ALL: [Staging; 2] = [Staging::Arena, Staging::Fresh];

    /// Parses a mode's [`name`](Staging::name).
    pub fn parse(s: &str) -> Result<Staging> {
        Staging::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::Value(format!("staging must be 'arena' or 'fresh', not '{s}'")))
    }
    /// `"arena"` / `"fresh"`.
    pub fn name(self) -> &'static str {
        match self {
            Staging::Arena => "arena",
            Staging::Fresh => "fresh",
        }
    }
}

/// Alignment of every staging slice (bytes). 512 satisfies every dtype and the DMA alignment of
/// the Ascend runtime.
pub const SLICE_ALIGN: u64 = 512;

/// Lays out slices of the given extents back to back, each aligned to [`SLICE_ALIGN`].
/// Returns each slice's offset and the total footprint. Zero extents take no space.
pub fn plan_slices<'a>(
    extents: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(Vec<u64>, u64)> {
    let mut offsets = Vec::new();
    let mut total: u64 = 0;
    for (name, extent) in extents {
        offsets.push(total);
        let padded = align_up(extent, SLICE_ALIGN)?;
        total = total.checked_add(padded).ok_or_else(|| {
            Error::geometry(
                format!("tensor {name}"),
                format!("the staging footprint ({total} + {padded} bytes) overflows"),
            )
        })?;
    }
    Ok((offsets, total))
}

/// Size to grow to when `needed` exceeds `capacity`: at least 1.5x the old capacity, so a slowly
/// growing footprint does not reallocate every run.
pub fn grown_capacity(capacity: u64, needed: u64) -> u64 {
    let target = needed.max(capacity.saturating_add(capacity / 2));
    align_up(target, 4096).unwrap_or(needed)
}

/// The retained arena allocation.
#[derive(Debug, Default)]
pub struct Arena {
    current: Option<(DevPtr, u64)>,
}

impl Arena {
    /// The current allocation and its size.
    pub fn current(&self) -> Option<(DevPtr, u64)> {
        self.current
    }

    /// Makes the arena hold at least `needed` bytes: keeps it when it fits, else releases it
    /// (view first) and allocates a grown one. A failure leaves no arena.
    pub(crate) fn ensure(&mut self, mem: &mut Memory, needed: u64) -> Result<(DevPtr, u64)> {
        let old = match self.current {
            Some((p, cap)) if cap >= needed => return Ok((p, cap)),
            Some((p, cap)) => {
                mem.release(p)
                    .map_err(|e| Error::device(Phase::Bind, Some(&arena_label(cap)), e))?;
                self.current = None;
                cap
            }
            None => 0,
        };
        let cap = grown_capacity(old, needed);
        let buf = mem.alloc(cap, Owner::Staging, Phase::Bind, Some(&arena_label(cap)))?;
        self.current = Some((buf.ptr, cap));
        Ok((buf.ptr, cap))
    }

    /// Frees the arena (view first). On failure it stays, so a retry frees it.
    pub(crate) fn trim(&mut self, mem: &mut Memory) -> Result<()> {
        if let Some((p, cap)) = self.current {
            mem.release(p)
                .map_err(|e| Error::device(Phase::Buffer, Some(&arena_label(cap)), e))?;
            self.current = None;
        }
        Ok(())
    }

    /// Forgets the arena (the worker's close released every allocation).
    pub(crate) fn forget(&mut self) {
        self.current = None;
    }
}

/// What errors about the arena call it (it is no tensor).
fn arena_label(cap: u64) -> String {
    format!("<staging arena of {cap} bytes>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slices_are_aligned_and_zero_takes_nothing() {
        let ex = [("a", 10), ("b", 0), ("c", 512), ("d", 513)];
        let (offs, total) = plan_slices(ex).unwrap();
        assert_eq!(offs, vec![0, 512, 512, 1024]);
        assert_eq!(total, 2048);
        assert!(plan_slices([("x", u64::MAX - 10)]).is_err());
        let e = plan_slices([("x", u64::MAX / 2), ("y", u64::MAX / 2)]).unwrap_err();
        assert!(e.to_string().contains("tensor y"), "{e}");
    }

    proptest! {
        #[test]
        fn slices_are_disjoint_aligned_and_inside(extents in proptest::collection::vec(0u64..1 << 20, 0..24)) {
            let (offs, total) = plan_slices(extents.iter().map(|&e| ("t", e))).unwrap();
            let cap = grown_capacity(0, total);
            prop_assert!(cap >= total);
            let mut spans: Vec<(u64, u64)> = offs.iter().zip(&extents).map(|(&o, &e)| (o, o + e)).collect();
            for &(s, e) in &spans {
                prop_assert_eq!(s % SLICE_ALIGN, 0);
                prop_assert!(e <= total);
            }
            spans.sort();
            for w in spans.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "overlap {:?}", w);
            }
        }
    }
}
