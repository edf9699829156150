//! Checked tensor geometry.
//!
//! A tensor is a dtype, a shape, element strides and a start offset (elements) over a base
//! address. Every derived quantity is computed with checked arithmetic, and an overflow is an
//! error naming the tensor, never a wrap (DESIGN 4.1). The byte *extent* is what a strided view
//! touches, `(1 + sum((shape_i - 1) * stride_i)) * elem_size`; staging, registration and host
//! views all use it, so a transposed or sliced view moves intact.
//!
//! Shapes have at most [`MAX_DIMS`] dimensions (8: more than any of our workloads need, and it
//! keeps index validation cheap). Strides are non-negative; the Python layer turns a
//! negative-stride numpy view into a contiguous copy before it gets here.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Largest supported rank.
pub const MAX_DIMS: usize = 8;

/// The layout of a tensor over a base address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    dtype: DType,
    shape: Vec<u64>,
    strides: Vec<u64>,
    offset: u64,
    numel: u64,
    /// `offset * elem_size`.
    start: u64,
    /// Bytes spanned from `start`; 0 for a zero-element tensor.
    extent: u64,
}

fn ovf(what: &str, quantity: &str) -> Error {
    Error::geometry(what, format!("{quantity} overflows 64 bits"))
}

/// Row-major (C) element strides of `shape`.
pub fn contiguous_strides(what: &str, shape: &[u64]) -> Result<Vec<u64>> {
    let mut strides = vec![0u64; shape.len()];
    let mut acc: u64 = 1;
    for (i, &s) in shape.iter().enumerate().rev() {
        strides[i] = acc;
        acc = acc
            .checked_mul(s.max(1))
            .ok_or_else(|| ovf(what, "the element count"))?;
    }
    Ok(strides)
}

/// Rounds `x` up to a multiple of `align` (a power of two).
pub fn align_up(x: u64, align: u64) -> Result<u64> {
    if !align.is_power_of_two() {
        return Err(Error::Value(format!(
            "alignment {align} is not a power of two"
        )));
    }
    x.checked_add(align - 1)
        .map(|v| v & !(align - 1))
        .ok_or_else(|| {
            Error::geometry(
                format!("{x} bytes"),
                format!("aligning up to {align} overflows"),
            )
        })
}

/// Whether `[start, start + len)` lies inside `[outer, outer + outer_len)`, without overflow.
pub fn span_contains(outer: u64, outer_len: u64, start: u64, len: u64) -> bool {
    match (outer.checked_add(outer_len), start.checked_add(len)) {
        (Some(oe), Some(e)) => start >= outer && e <= oe,
        _ => false,
    }
}

impl Geometry {
    /// Builds and validates a geometry. `what` names the tensor in errors.
    pub fn new(
        what: &str,
        dtype: DType,
        shape: Vec<u64>,
        strides: Option<Vec<u64>>,
        offset: u64,
    ) -> Result<Geometry> {
        if shape.len() > MAX_DIMS {
            return Err(Error::geometry(
                what,
                format!(
                    "rank {} exceeds the supported maximum of {MAX_DIMS}",
                    shape.len()
                ),
            ));
        }
        let strides = match strides {
            Some(s) if s.len() != shape.len() => {
                return Err(Error::geometry(
                    what,
                    format!("{} strides for a rank-{} shape", s.len(), shape.len()),
                ))
            }
            Some(s) => s,
            None => contiguous_strides(what, &shape)?,
        };
        let numel = shape
            .iter()
            .try_fold(1u64, |acc, &s| acc.checked_mul(s))
            .ok_or_else(|| ovf(what, &format!("the element count of shape {shape:?}")))?;
        let es = dtype.size();
        numel
            .checked_mul(es)
            .ok_or_else(|| ovf(what, &format!("nbytes of shape {shape:?}")))?;
        let extent = if numel == 0 {
            0
        } else {
            let last = shape.iter().zip(&strides).try_fold(0u64, |acc, (&n, &st)| {
                (n - 1).checked_mul(st).and_then(|x| acc.checked_add(x))
            });
            last.and_then(|l| l.checked_add(1))
                .and_then(|e| e.checked_mul(es))
                .ok_or_else(|| {
                    ovf(
                        what,
                        &format!("the byte extent of shape {shape:?} strides {strides:?}"),
                    )
                })?
        };
        let start = offset
            .checked_mul(es)
            .ok_or_else(|| ovf(what, "the start byte offset"))?;
        start
            .checked_add(extent)
            .ok_or_else(|| ovf(what, "the end of the byte span"))?;
        Ok(Geometry {
            dtype,
            shape,
            strides,
            offset,
            numel,
            start,
            extent,
        })
    }

    /// A contiguous geometry of `shape` at offset 0.
    pub fn contiguous(what: &str, dtype: DType, shape: Vec<u64>) -> Result<Geometry> {
        Geometry::new(what, dtype, shape, None, 0)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    pub fn strides(&self) -> &[u64] {
        &self.strides
    }
    /// Start offset in elements.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> u64 {
        self.numel
    }
    /// `numel * elem_size`.
    pub fn nbytes(&self) -> u64 {
        self.numel * self.dtype.size()
    }
    /// Byte offset of the first element from the base.
    pub fn start_byte(&self) -> u64 {
        self.start
    }
    /// Bytes the tensor spans from `start_byte` (0 when it has no elements).
    pub fn extent(&self) -> u64 {
        self.extent
    }
    /// `start_byte + extent`: the base buffer must be at least this large.
    pub fn end_byte(&self) -> u64 {
        self.start + self.extent
    }

    /// Row-major contiguous (dimensions of size 1 ignore their stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1u64;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expect {
                return false;
            }
            expect = expect.saturating_mul(n);
        }
        true
    }

    /// No gaps and no overlap: every byte of the extent belongs to exactly one element (any
    /// permutation of the dimensions). Sorted by stride, each dimension of size > 1 must step
    /// over exactly the elements of the ones before it; `extent == nbytes` alone is not enough
    /// (a zero stride can hide a gap behind an overlap).
    pub fn is_dense(&self) -> bool {
        let mut dims: Vec<(u64, u64)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&n, _)| n > 1)
            .map(|(&n, &st)| (st, n))
            .collect();
        dims.sort_unstable();
        let mut expect = 1u64;
        for (st, n) in dims {
            if st != expect {
                return false;
            }
            expect = expect.saturating_mul(n);
        }
        true
    }

    /// Copies the bytes of every element (offsets relative to `start_byte`) from `src` to `dst`,
    /// both extent-sized; the bytes between elements of `dst` are left as they are.
    pub fn copy_elements(&self, src: &[u8], dst: &mut [u8]) {
        let es = self.dtype.size() as usize;
        self.for_each_element(|o| {
            let o = o as usize;
            dst[o..o + es].copy_from_slice(&src[o..o + es]);
        });
    }

    /// Whether any element's bytes intersect `[lo, hi)` (offsets relative to `start_byte`).
    pub fn elements_overlap(&self, lo: u64, hi: u64) -> bool {
        if self.is_dense() {
            return lo < self.extent && hi > 0 && lo < hi;
        }
        let es = self.dtype.size();
        self.any_element(|o| o < hi && lo < o + es)
    }

    /// The same layout re-based so the extent starts at byte 0 (offset 0).
    pub fn rebased(&self) -> Geometry {
        Geometry {
            offset: 0,
            start: 0,
            ..self.clone()
        }
    }

    /// Byte offset from the base of the element at `index` (one entry per dimension). `name`
    /// names the tensor in errors (formatted only on failure: this is the orchestrator's hot path).
    pub fn byte_offset_of(&self, name: &str, index: &[i64]) -> Result<u64> {
        if index.len() != self.shape.len() {
            return Err(Error::Value(format!(
                "tensor {name}: index {index:?} has {} entries, tensor has rank {} (shape {:?})",
                index.len(),
                self.shape.len(),
                self.shape
            )));
        }
        let mut elem = self.offset;
        for (d, ((&i, &n), &s)) in index.iter().zip(&self.shape).zip(&self.strides).enumerate() {
            if i < 0 || i as u64 >= n {
                return Err(Error::Value(format!(
                    "tensor {name}: index {index:?} out of bounds for shape {:?} (dimension {d})",
                    self.shape
                )));
            }
            // In range and inside the validated extent, so this cannot overflow; still checked.
            elem = (i as u64)
                .checked_mul(s)
                .and_then(|x| elem.checked_add(x))
                .ok_or_else(|| ovf(&format!("tensor {name}"), "the element offset"))?;
        }
        elem.checked_mul(self.dtype.size())
            .ok_or_else(|| ovf(&format!("tensor {name}"), "the byte offset"))
    }

    /// A sub-view: `shape` elements starting at `offsets` in every dimension, same strides.
    pub fn view(&self, what: &str, shape: &[i64], offsets: &[i64]) -> Result<Geometry> {
        if shape.len() != self.ndim() || offsets.len() != self.ndim() {
            return Err(Error::Value(format!(
                "{what}: view shape {shape:?} / offsets {offsets:?} must both have rank {}",
                self.ndim()
            )));
        }
        let mut new_shape = Vec::with_capacity(shape.len());
        let mut elem = self.offset;
        for d in 0..self.ndim() {
            let (n, o) = (shape[d], offsets[d]);
            let end = n.checked_add(o);
            if n < 0 || o < 0 || end.is_none_or(|e| e as u64 > self.shape[d]) {
                return Err(Error::Value(format!(
                    "{what}: view shape {shape:?} at offsets {offsets:?} runs past shape {:?} (dimension {d})",
                    self.shape
                )));
            }
            new_shape.push(n as u64);
            elem = (o as u64)
                .checked_mul(self.strides[d])
                .and_then(|x| elem.checked_add(x))
                .ok_or_else(|| ovf(what, "the view offset"))?;
        }
        Geometry::new(
            what,
            self.dtype,
            new_shape,
            Some(self.strides.clone()),
            elem,
        )
    }

    /// Visits the byte offset (relative to `start_byte`) of every element, in row-major order.
    pub fn for_each_element(&self, mut f: impl FnMut(u64)) {
        self.any_element(|o| {
            f(o);
            false
        });
    }

    /// Visits element byte offsets in row-major order until `f` returns true; returns whether it
    /// did.
    pub fn any_element(&self, mut f: impl FnMut(u64) -> bool) -> bool {
        if self.numel == 0 {
            return false;
        }
        let es = self.dtype.size();
        let nd = self.ndim();
        let mut idx = vec![0u64; nd];
        loop {
            let off: u64 = idx
                .iter()
                .zip(&self.strides)
                .map(|(i, s)| i * s)
                .sum::<u64>()
                * es;
            if f(off) {
                return true;
            }
            let mut d = nd;
            loop {
                if d == 0 {
                    return false;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn contiguous_basics() {
        let g = Geometry::contiguous("t", DType::F32, vec![2, 3]).unwrap();
        assert_eq!((g.numel(), g.nbytes(), g.extent()), (6, 24, 24));
        assert_eq!(g.strides(), &[3, 1]);
        assert!(g.is_contiguous() && g.is_dense());
        assert_eq!(g.byte_offset_of("t", &[1, 2]).unwrap(), 20);
        assert!(g.byte_offset_of("t", &[2, 0]).is_err());
        assert!(g.byte_offset_of("t", &[0]).is_err());
        assert!(g.byte_offset_of("t", &[-1, 0]).is_err());
    }

    #[test]
    fn transposed_extent_is_exact() {
        // A (3, 4) float32 transposed: shape (4, 3), strides (1, 4).
        let g = Geometry::new("t", DType::F32, vec![4, 3], Some(vec![1, 4]), 0).unwrap();
        assert_eq!(g.extent(), 48);
        assert!(!g.is_contiguous());
        assert!(g.is_dense());
        // Every other column of a (4, 6) array: shape (4, 3), strides (6, 2) -> (3*6 + 2*2 + 1) * 4.
        let g = Geometry::new("t", DType::F32, vec![4, 3], Some(vec![6, 2]), 1).unwrap();
        assert_eq!((g.extent(), g.start_byte(), g.end_byte()), (92, 4, 96));
        assert!(!g.is_dense());
    }

    #[test]
    fn huge_shapes_are_errors_not_wraps() {
        let e = Geometry::contiguous("x", DType::F32, vec![1 << 40, 1 << 40]).unwrap_err();
        assert!(matches!(e, Error::Geometry { .. }), "{e}");
        assert!(e.to_string().contains("x"), "{e}");
        let e = Geometry::new("y", DType::F64, vec![4], Some(vec![1]), u64::MAX / 4).unwrap_err();
        assert!(e.to_string().contains("start byte offset"), "{e}");
        assert!(Geometry::contiguous("z", DType::U8, vec![1; 9]).is_err());
        assert!(align_up(u64::MAX, 512).is_err());
        assert_eq!(align_up(513, 512).unwrap(), 1024);
    }

    #[test]
    fn zero_element_tensors_name_no_bytes() {
        let g = Geometry::contiguous("e", DType::F32, vec![0, 5]).unwrap();
        assert_eq!((g.numel(), g.extent()), (0, 0));
    }

    #[test]
    fn views_are_contained() {
        let g = Geometry::contiguous("kv", DType::F16, vec![8, 4, 16]).unwrap();
        let v = g.view("kv", &[1, 4, 16], &[3, 0, 0]).unwrap();
        assert_eq!((v.start_byte(), v.extent()), (3 * 64 * 2, 128));
        assert!(g.view("kv", &[2, 4, 16], &[7, 0, 0]).is_err());
        assert!(g.view("kv", &[1, 4], &[0, 0]).is_err());
        assert!(g.view("kv", &[-1, 4, 16], &[0, 0, 0]).is_err());
        assert!(g.view("kv", &[1, 4, 16], &[i64::MAX, 0, 0]).is_err());
    }

    #[test]
    fn density_sees_through_overlap() {
        // as_strided(base, (2, 2), (12, 0)) of float32: extent 16 == nbytes 16, but elements
        // 1 and 2 of the base are gaps and each element is viewed twice.
        let g = Geometry::new("t", DType::F32, vec![2, 2], Some(vec![3, 0]), 0).unwrap();
        assert_eq!(g.extent(), g.nbytes());
        assert!(!g.is_dense());
        assert!(
            Geometry::new("t", DType::F32, vec![4, 3], Some(vec![1, 4]), 0)
                .unwrap()
                .is_dense()
        );
        let col = Geometry::new("t", DType::F32, vec![4, 1], Some(vec![2, 1]), 0).unwrap();
        assert!(
            col.elements_overlap(0, 4) && !col.elements_overlap(4, 8) && col.elements_overlap(8, 9)
        );
        let mut dst = [9u8; 16];
        let g2 = Geometry::new("t", DType::U8, vec![2], Some(vec![8]), 0).unwrap();
        g2.copy_elements(&[1u8; 9], &mut dst[..9]);
        assert_eq!(&dst[..9], &[1, 9, 9, 9, 9, 9, 9, 9, 1]);
    }

    #[test]
    fn element_walk_matches_strides() {
        let g = Geometry::new("t", DType::I16, vec![2, 2], Some(vec![1, 3]), 0).unwrap();
        let mut offs = vec![];
        g.for_each_element(|o| offs.push(o));
        assert_eq!(offs, vec![0, 6, 2, 8]);
    }

    fn exact_extent(shape: &[u64], strides: &[u64], es: u64) -> u128 {
        if shape.contains(&0) {
            return 0;
        }
        let last: u128 = shape
            .iter()
            .zip(strides)
            .map(|(&n, &s)| (n as u128 - 1) * s as u128)
            .sum();
        (last + 1) * es as u128
    }

    proptest! {
        #[test]
        fn geometry_matches_u128(
            dims in proptest::collection::vec((0u64..1 << 22, 0u64..1 << 22), 0..6),
            offset in 0u64..1 << 40,
            di in 0usize..DType::ALL.len(),
        ) {
            let dtype = DType::ALL[di];
            let shape: Vec<u64> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<u64> = dims.iter().map(|d| d.1).collect();
            let es = dtype.size() as u128;
            let numel: u128 = shape.iter().map(|&n| n as u128).product();
            let extent = exact_extent(&shape, &strides, dtype.size());
            let start = offset as u128 * es;
            let fits = numel * es <= u64::MAX as u128 && numel <= u64::MAX as u128
                && extent <= u64::MAX as u128 && start + extent <= u64::MAX as u128;
            match Geometry::new("p", dtype, shape.clone(), Some(strides.clone()), offset) {
                Ok(g) => {
                    prop_assert!(fits);
                    prop_assert_eq!(g.numel() as u128, numel);
                    prop_assert_eq!(g.nbytes() as u128, numel * es);
                    prop_assert_eq!(g.extent() as u128, extent);
                    prop_assert_eq!(g.end_byte() as u128, start + extent);
                }
                Err(e) => {
                    prop_assert!(!fits, "rejected a geometry that fits: {}", e);
                    let is_geometry = matches!(e, Error::Geometry { .. });
                    prop_assert!(is_geometry);
                }
            }
        }

        #[test]
        fn align_up_matches_u128(x in any::<u64>(), p in 0u32..20) {
            let a = 1u64 << p;
            let exact = (x as u128).div_ceil(a as u128) * a as u128;
            match align_up(x, a) {
                Ok(v) => prop_assert_eq!(v as u128, exact),
                Err(_) => prop_assert!(exact > u64::MAX as u128),
            }
        }

        #[test]
        fn index_offsets_stay_inside_the_extent(
            dims in proptest::collection::vec((1u64..16, 0u64..64), 1..5),
            seed in any::<u64>(),
        ) {
            let shape: Vec<u64> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<u64> = dims.iter().map(|d| d.1).collect();
            let g = Geometry::new("p", DType::F32, shape.clone(), Some(strides), 3).unwrap();
            let idx: Vec<i64> = shape.iter().enumerate()
                .map(|(i, &n)| ((seed >> (i * 8)) % n) as i64).collect();
            let off = g.byte_offset_of("p", &idx).unwrap();
            prop_assert!(span_contains(g.start_byte(), g.extent(), off, 4));
        }
    }
}
