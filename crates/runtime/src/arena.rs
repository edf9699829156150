//! The staging arena: one retained device allocation that host-staged tensors are bump-allocated
//! from, run after run. A warm run whose footprint fits does no device malloc or free.

use simpler_driver::DevPtr;

use crate::error::{Error, Result};
use crate::geometry::align_up;

/// Alignment of every staging slice (bytes). 512 satisfies every dtype and the DMA alignment of
/// the Ascend runtime.
pub const SLICE_ALIGN: u64 = 512;

/// Lays out slices of the given extents back to back, each aligned to [`SLICE_ALIGN`].
/// Returns each slice's offset and the total footprint. Zero extents take no space.
pub fn plan_slices(extents: &[(String, u64)]) -> Result<(Vec<u64>, u64)> {
    let mut offsets = Vec::with_capacity(extents.len());
    let mut total: u64 = 0;
    for (name, extent) in extents {
        offsets.push(total);
        let padded = align_up(*extent, SLICE_ALIGN)?;
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
    pub(crate) ptr: Option<DevPtr>,
    pub(crate) capacity: u64,
}

impl Arena {
    /// The current allocation and its size.
    pub fn current(&self) -> Option<(DevPtr, u64)> {
        self.ptr.map(|p| (p, self.capacity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slices_are_aligned_and_zero_takes_nothing() {
        let ex = vec![
            ("a".into(), 10),
            ("b".into(), 0),
            ("c".into(), 512),
            ("d".into(), 513),
        ];
        let (offs, total) = plan_slices(&ex).unwrap();
        assert_eq!(offs, vec![0, 512, 512, 1024]);
        assert_eq!(total, 2048);
        assert!(plan_slices(&[("x".into(), u64::MAX - 10)]).is_err());
        let e = plan_slices(&[("x".into(), u64::MAX / 2), ("y".into(), u64::MAX / 2)]).unwrap_err();
        assert!(e.to_string().contains("tensor y"), "{e}");
    }

    proptest! {
        #[test]
        fn slices_are_disjoint_aligned_and_inside(extents in proptest::collection::vec(0u64..1 << 20, 0..24)) {
            let named: Vec<(String, u64)> = extents.iter().enumerate().map(|(i, &e)| (format!("t{i}"), e)).collect();
            let (offs, total) = plan_slices(&named).unwrap();
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
