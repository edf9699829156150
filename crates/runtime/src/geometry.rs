//! Checked tensor geometry.
//!
//! A tensor is a dtype, a shape, element strides and a start offset (elements) over a base
//! address. Every derived quantity is computed with checked arithmetic, and an overflow is an
//! error naming the tensor, never a wrap. The byte *extent* is what a strided view touches,
//! `(1 + sum((shape_i - 1) * stride_i)) * elem_size`; staging, registration and host views all
//! use it, so a transposed or sliced view moves intact (see `docs/concepts.md`).
//!
//! Shapes have at most [`MAX_DIMS`] dimensions and are stored inline, so a geometry is a plain
//! `Copy` value: making a view or recording a task tensor allocates nothing. Strides are
//! non-negative; the Python layer turns a negative-stride numpy view into a contiguous copy
//! before it gets here. Constructors take the tensor's name as a `Display` value that is only
//! formatted when an error is reported (views are made on the orchestrator's hot path).

use std::fmt::{self, Display};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Largest supported rank.
pub const MAX_DIMS: usize = 8;

/// The layout of a tensor over a base address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    dtype: DType,
    ndim: u8,
    shape: [u64; MAX_DIMS],
    strides: [u64; MAX_DIMS],
    /// Start offset in elements.
    offset: u64,
    numel: u64,
    /// Bytes spanned from the first element; 0 for a zero-element tensor.
    extent: u64,
}

impl fmt::Debug for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Geometry")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("offset", &self.offset)
            .finish()
    }
}

fn ovf(what: &dyn Display, quantity: &str) -> Error {
    Error::geometry(what.to_string(), format!("{quantity} overflows 64 bits"))
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
    /// Builds and validates a geometry (`strides: None` is row-major contiguous). `what` names the
    /// tensor in errors and is formatted only when one is reported.
    pub fn new(
        what: &dyn Display,
        dtype: DType,
        shape: &[u64],
        strides: Option<&[u64]>,
        offset: u64,
    ) -> Result<Geometry> {
        let ndim = shape.len();
        if ndim > MAX_DIMS {
            return Err(Error::geometry(
                what.to_string(),
                format!("rank {ndim} exceeds the supported maximum of {MAX_DIMS}"),
            ));
        }
        let mut g = Geometry {
            dtype,
            ndim: ndim as u8,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
            offset,
            numel: 0,
            extent: 0,
        };
        g.shape[..ndim].copy_from_slice(shape);
        match strides {
            Some(s) if s.len() != ndim => {
                return Err(Error::geometry(
                    what.to_string(),
                    format!("{} strides for a rank-{ndim} shape", s.len()),
                ))
            }
            Some(s) => g.strides[..ndim].copy_from_slice(s),
            None => {
                let mut acc: u64 = 1;
                for i in (0..ndim).rev() {
                    g.strides[i] = acc;
                    acc = acc
                        .checked_mul(shape[i].max(1))
                        .ok_or_else(|| ovf(what, "the element count"))?;
                }
            }
        }
        g.numel = shape
            .iter()
            .try_fold(1u64, |acc, &s| acc.checked_mul(s))
            .ok_or_else(|| ovf(what, &format!("the element count of shape {shape:?}")))?;
        let es = dtype.size();
        g.numel
            .checked_mul(es)
            .ok_or_else(|| ovf(what, &format!("nbytes of shape {shape:?}")))?;
        if g.numel > 0 {
            let last = g.shape[..ndim]
                .iter()
                .zip(&g.strides[..ndim])
                .try_fold(0u64, |acc, (&n, &st)| {
                    (n - 1).checked_mul(st).and_then(|x| acc.checked_add(x))
                });
            g.extent = last
                .and_then(|l| l.checked_add(1))
                .and_then(|e| e.checked_mul(es))
                .ok_or_else(|| {
                    ovf(
                        what,
                        &format!(
                            "the byte extent of shape {shape:?} strides {:?}",
                            g.strides()
                        ),
                    )
                })?;
        }
        let start = offset
            .checked_mul(es)
            .ok_or_else(|| ovf(what, "the start byte offset"))?;
        start
            .checked_add(g.extent)
            .ok_or_else(|| ovf(what, "the end of the byte span"))?;
        Ok(g)
    }

    /// A contiguous geometry of `shape` at offset 0.
    pub fn contiguous(what: &dyn Display, dtype: DType, shape: &[u64]) -> Result<Geometry> {
        Geometry::new(what, dtype, shape, None, 0)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[u64] {
        &self.shape[..self.ndim as usize]
    }
    pub fn strides(&self) -> &[u64] {
        &self.strides[..self.ndim as usize]
    }
    /// Start offset in elements.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// The start offset, borrowed (a one-element slice of offsets is made from it).
    pub(crate) fn offset_ref(&self) -> &u64 {
        &self.offset
    }
    pub fn ndim(&self) -> usize {
        self.ndim as usize
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
        self.offset * self.dtype.size()
    }
    /// Bytes the tensor spans from `start_byte` (0 when it has no elements).
    pub fn extent(&self) -> u64 {
        self.extent
    }
    /// `start_byte + extent`: the base buffer must be at least this large.
    pub fn end_byte(&self) -> u64 {
        self.start_byte() + self.extent
    }

    /// The same layout starting at element `offset` of the base. The caller guarantees the
    /// result stays inside a validated span (a task view whose containment was checked).
    pub(crate) fn at_offset(&self, offset: u64) -> Geometry {
        Geometry { offset, ..*self }
    }

    /// Row-major contiguous (dimensions of size 1 ignore their stride; a tensor without
    /// elements is contiguous).
    pub fn is_contiguous(&self) -> bool {
        if self.numel == 0 {
            return true;
        }
        let mut expect = 1u64;
        for (&n, &s) in self.shape().iter().zip(self.strides()).rev() {
            if n != 1 && s != expect {
                return false;
            }
            expect = expect.saturating_mul(n);
        }
        true
    }

    /// [`Geometry::is_contiguous`] from the first element, or the error naming `what` and its
    /// layout.
    pub fn require_contiguous(&self, what: &dyn std::fmt::Display) -> Result<()> {
        if self.is_contiguous() && self.offset() == 0 {
            return Ok(());
        }
        Err(Error::not_contiguous(
            what,
            &format_args!(
                "shape {:?}, element strides {:?}",
                self.shape(),
                self.strides()
            ),
        ))
    }

    /// Where a copy of `len` bytes to or from this tensor, starting `offset` bytes into it, lands
    /// in its allocation (a byte offset from the allocation's start). The tensor's elements must
    /// be contiguous (a copy is bytes in order) and the bytes must lie within them.
    pub fn copy_window(&self, what: &dyn std::fmt::Display, offset: u64, len: u64) -> Result<u64> {
        if !self.is_contiguous() {
            return Err(Error::Value(format!(
                "{what}: the tensor is not contiguous (shape {:?}, element strides {:?}): a copy \
                 moves bytes in order; copy a contiguous tensor (or its buffer)",
                self.shape(),
                self.strides()
            )));
        }
        let nbytes = self.nbytes();
        match offset.checked_add(len) {
            Some(end) if end <= nbytes => {}
            _ => {
                return Err(Error::Value(format!(
                    "{what}: {len} bytes at byte offset {offset} run past the tensor ({nbytes} \
                     bytes)"
                )))
            }
        }
        self.offset()
            .checked_mul(self.dtype().size())
            .and_then(|start| start.checked_add(offset))
            .ok_or_else(|| Error::geometry(what.to_string(), "byte offset overflows 64 bits"))
    }

    /// No gaps and no overlap: every byte of the extent belongs to exactly one element (any
    /// permutation of the dimensions). Sorted by stride, each dimension of size > 1 must step
    /// over exactly the elements of the ones before it; `extent == nbytes` alone is not enough
    /// (a zero stride can hide a gap behind an overlap).
    pub fn is_dense(&self) -> bool {
        let mut dims = [(0u64, 0u64); MAX_DIMS];
        let mut k = 0;
        for (&n, &st) in self.shape().iter().zip(self.strides()) {
            if n > 1 {
                dims[k] = (st, n);
                k += 1;
            }
        }
        let dims = &mut dims[..k];
        dims.sort_unstable();
        let mut expect = 1u64;
        for &(st, n) in dims.iter() {
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
        if lo >= hi || self.numel == 0 {
            return false;
        }
        if self.is_dense() {
            return lo < self.extent && hi > 0;
        }
        let es = self.dtype.size();
        self.any_element(|o| o < hi && lo < o + es)
    }

    /// Sorted, merged byte intervals `[start, end)` of the elements, relative to the base
    /// (`start_byte` included). Dense tensors are one interval.
    pub fn element_intervals(&self) -> Vec<(u64, u64)> {
        let base = self.start_byte();
        if self.numel == 0 {
            return Vec::new();
        }
        if self.is_dense() {
            return vec![(base, base + self.extent)];
        }
        let es = self.dtype.size();
        let mut v = Vec::with_capacity(self.numel as usize);
        self.for_each_element(|o| v.push((base + o, base + o + es)));
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        out
    }

    /// Whether an element of `self` placed at device address `a` shares a byte with an element
    /// of `other` placed at `b` (each geometry relative to its own base address). Exact for
    /// strided layouts; dense ones compare spans.
    pub fn elements_intersect(&self, a: u64, other: &Geometry, b: u64) -> bool {
        let (sa, sb) = (a + self.start_byte(), b + other.start_byte());
        if self.numel == 0 || other.numel == 0 || sa + self.extent <= sb || sb + other.extent <= sa
        {
            return false;
        }
        match (self.is_dense(), other.is_dense()) {
            (true, true) => true,
            (true, false) => {
                other.elements_overlap(sa.saturating_sub(sb), (sa + self.extent).saturating_sub(sb))
            }
            (false, true) => self.elements_overlap(
                sb.saturating_sub(sa),
                (sb + other.extent).saturating_sub(sa),
            ),
            (false, false) => {
                let x = self.element_intervals();
                let y = other.element_intervals();
                let (mut i, mut j) = (0, 0);
                while i < x.len() && j < y.len() {
                    let (xs, xe) = (a + x[i].0, a + x[i].1);
                    let (ys, ye) = (b + y[j].0, b + y[j].1);
                    if xs < ye && ys < xe {
                        return true;
                    }
                    if xe <= ye {
                        i += 1;
                    } else {
                        j += 1;
                    }
                }
                false
            }
        }
    }

    /// The same layout re-based so the extent starts at byte 0 (offset 0).
    pub fn rebased(&self) -> Geometry {
        Geometry { offset: 0, ..*self }
    }

    /// Byte offset from the base of the element at `index` (one entry per dimension). `name`
    /// names the tensor in errors (formatted only on failure: this is the orchestrator's hot path).
    #[inline]
    pub fn byte_offset_of(&self, name: &dyn Display, index: &[i64]) -> Result<u64> {
        let nd = self.ndim();
        if index.len() != nd {
            return Err(self.index_error(name, index, None));
        }
        let mut elem = self.offset;
        for d in 0..nd {
            let i = index[d];
            if i < 0 || i as u64 >= self.shape[d] {
                return Err(self.index_error(name, index, Some(d)));
            }
            // In range and inside the validated extent, so this cannot overflow; still checked.
            elem = match (i as u64)
                .checked_mul(self.strides[d])
                .and_then(|x| elem.checked_add(x))
            {
                Some(e) => e,
                None => return Err(ovf(&format_args!("tensor {name}"), "the element offset")),
            };
        }
        elem.checked_mul(self.dtype.size())
            .ok_or_else(|| ovf(&format_args!("tensor {name}"), "the byte offset"))
    }

    /// The error for `index` of the wrong rank (`dim` `None`) or out of bounds in `dim`.
    #[cold]
    #[inline(never)]
    fn index_error(&self, name: &dyn Display, index: &[i64], dim: Option<usize>) -> Error {
        match dim {
            None => Error::Value(format!(
                "tensor {name}: index {index:?} has {} entries, tensor has rank {} (shape {:?})",
                index.len(),
                self.ndim(),
                self.shape()
            )),
            Some(d) => Error::Value(format!(
                "tensor {name}: index {index:?} out of bounds for shape {:?} (dimension {d})",
                self.shape()
            )),
        }
    }

    /// The single element at `index`, as a rank-0 geometry at that element's offset (what an
    /// element access touches).
    pub fn element(&self, name: &dyn Display, index: &[i64]) -> Result<Geometry> {
        let byte = self.byte_offset_of(name, index)?;
        Ok(Geometry::element_at(self.dtype, byte / self.dtype.size()))
    }

    /// A single element of `dtype` at element offset `offset` (rank 0).
    pub(crate) fn element_at(dtype: DType, offset: u64) -> Geometry {
        Geometry {
            dtype,
            ndim: 0,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
            offset,
            numel: 1,
            extent: dtype.size(),
        }
    }

    /// The element offset of a sub-view `shape` at `offsets`, after checking that it lies inside
    /// this tensor in every dimension (the one rule behind `view` and batched views).
    #[inline(always)]
    pub fn view_offset(&self, what: &dyn Display, shape: &[i64], offsets: &[i64]) -> Result<u64> {
        if shape.len() != self.ndim() || offsets.len() != self.ndim() {
            return Err(Error::Value(format!(
                "{what}: view shape {shape:?} / offsets {offsets:?} must both have rank {}",
                self.ndim()
            )));
        }
        let mut elem = self.offset;
        for d in 0..self.ndim() {
            let (n, o) = (shape[d], offsets[d]);
            let end = n.checked_add(o);
            if n < 0 || o < 0 || end.is_none_or(|e| e as u64 > self.shape[d]) {
                return Err(Error::Value(format!(
                    "{what}: view shape {shape:?} at offsets {offsets:?} runs past shape {:?} (dimension {d})",
                    self.shape()
                )));
            }
            elem = (o as u64)
                .checked_mul(self.strides[d])
                .and_then(|x| elem.checked_add(x))
                .ok_or_else(|| ovf(what, "the view offset"))?;
        }
        Ok(elem)
    }

    /// A sub-view: `shape` elements starting at `offsets` in every dimension, same strides.
    ///
    /// The orchestrator's hot path (`t.view(shape, offsets)` per task): a view with elements lies
    /// inside this tensor in every dimension (`view_offset` checked that), so its element count,
    /// extent and end are at most this tensor's, which `Geometry::new` validated; they are
    /// computed directly. A view without elements takes `Geometry::new` (its offset may lie at
    /// the very end of a dimension).
    #[inline(always)]
    pub fn view(&self, what: &dyn Display, shape: &[i64], offsets: &[i64]) -> Result<Geometry> {
        let elem = self.view_offset(what, shape, offsets)?;
        let nd = self.ndim();
        let mut g = Geometry {
            dtype: self.dtype,
            ndim: self.ndim,
            shape: [0; MAX_DIMS],
            strides: self.strides,
            offset: elem,
            numel: 1,
            extent: 0,
        };
        for (d, &n) in shape.iter().enumerate().take(nd) {
            g.shape[d] = n as u64; // `view_offset` checked 0 <= n <= shape[d]
        }
        if g.shape[..nd].contains(&0) {
            return Geometry::new(what, self.dtype, &g.shape[..nd], Some(self.strides()), elem);
        }
        let mut last = 0u64;
        for d in 0..nd {
            g.numel *= g.shape[d];
            last += (g.shape[d] - 1) * self.strides[d];
        }
        g.extent = (last + 1) * self.dtype.size();
        Ok(g)
    }

    /// A placeholder (no elements, rank 0) for a slot of a fixed-size array of geometries that
    /// holds none yet; never a tensor's layout.
    pub const PLACEHOLDER: Geometry = Geometry {
        dtype: DType::U8,
        ndim: 0,
        shape: [0; MAX_DIMS],
        strides: [0; MAX_DIMS],
        offset: 0,
        numel: 0,
        extent: 0,
    };

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
        let mut idx = [0u64; MAX_DIMS];
        loop {
            let off: u64 = idx[..nd]
                .iter()
                .zip(self.strides())
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
        let g = Geometry::contiguous(&"t", DType::F32, &[2, 3]).unwrap();
        assert_eq!((g.numel(), g.nbytes(), g.extent()), (6, 24, 24));
        assert_eq!(g.strides(), &[3, 1]);
        assert!(g.is_contiguous() && g.is_dense());
        assert_eq!(g.byte_offset_of(&"t", &[1, 2]).unwrap(), 20);
        assert!(g.byte_offset_of(&"t", &[2, 0]).is_err());
        assert!(g.byte_offset_of(&"t", &[0]).is_err());
        assert!(g.byte_offset_of(&"t", &[-1, 0]).is_err());
    }

    #[test]
    fn transposed_extent_is_exact() {
        // A (3, 4) float32 transposed: shape (4, 3), strides (1, 4).
        let g = Geometry::new(&"t", DType::F32, &[4, 3], Some(&[1, 4]), 0).unwrap();
        assert_eq!(g.extent(), 48);
        assert!(!g.is_contiguous());
        assert!(g.is_dense());
        // Every other column of a (4, 6) array: shape (4, 3), strides (6, 2) -> (3*6 + 2*2 + 1) * 4.
        let g = Geometry::new(&"t", DType::F32, &[4, 3], Some(&[6, 2]), 1).unwrap();
        assert_eq!((g.extent(), g.start_byte(), g.end_byte()), (92, 4, 96));
        assert!(!g.is_dense());
    }

    #[test]
    fn huge_shapes_are_errors_not_wraps() {
        let e = Geometry::contiguous(&"x", DType::F32, &[1 << 40, 1 << 40]).unwrap_err();
        assert!(matches!(e, Error::Geometry { .. }), "{e}");
        assert!(e.to_string().contains("x"), "{e}");
        let e = Geometry::new(&"y", DType::F64, &[4], Some(&[1]), u64::MAX / 4).unwrap_err();
        assert!(e.to_string().contains("start byte offset"), "{e}");
        assert!(Geometry::contiguous(&"z", DType::U8, &[1; 9]).is_err());
        assert!(align_up(u64::MAX, 512).is_err());
        assert_eq!(align_up(513, 512).unwrap(), 1024);
    }

    #[test]
    fn zero_element_tensors_name_no_bytes() {
        let g = Geometry::contiguous(&"e", DType::F32, &[0, 5]).unwrap();
        assert_eq!((g.numel(), g.extent()), (0, 0));
    }

    #[test]
    fn views_are_contained() {
        let g = Geometry::contiguous(&"kv", DType::F16, &[8, 4, 16]).unwrap();
        let v = g.view(&"kv", &[1, 4, 16], &[3, 0, 0]).unwrap();
        assert_eq!((v.start_byte(), v.extent()), (3 * 64 * 2, 128));
        assert!(g.view(&"kv", &[2, 4, 16], &[7, 0, 0]).is_err());
        assert!(g.view(&"kv", &[1, 4], &[0, 0]).is_err());
        assert!(g.view(&"kv", &[-1, 4, 16], &[0, 0, 0]).is_err());
        assert!(g.view(&"kv", &[1, 4, 16], &[i64::MAX, 0, 0]).is_err());
    }

    proptest! {
        /// The direct sub-view is the geometry `Geometry::new` makes of the same shape, strides
        /// and offset, and refuses what `view_offset` refuses.
        #[test]
        fn views_match_new(
            dims in proptest::collection::vec((1u64..6, 1u64..9, 0u64..6, 0u64..6), 0..5),
            offset in 0u64..100,
            di in 0usize..DType::ALL.len(),
        ) {
            let dt = DType::ALL[di];
            let shape: Vec<u64> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<u64> = dims.iter().map(|d| d.1).collect();
            let g = Geometry::new(&"t", dt, &shape, Some(&strides), offset).unwrap();
            let sub: Vec<i64> = dims.iter().map(|d| d.2 as i64).collect();
            let at: Vec<i64> = dims.iter().map(|d| d.3 as i64).collect();
            match g.view(&"t", &sub, &at) {
                Ok(v) => {
                    let elem = g.view_offset(&"t", &sub, &at).unwrap();
                    let sub: Vec<u64> = sub.iter().map(|&n| n as u64).collect();
                    let want = Geometry::new(&"t", dt, &sub, Some(&strides), elem).unwrap();
                    prop_assert_eq!(v, want);
                }
                Err(_) => prop_assert!(g.view_offset(&"t", &sub, &at).is_err()),
            }
        }
    }

    #[test]
    fn density_sees_through_overlap() {
        // as_strided(base, (2, 2), (12, 0)) of float32: extent 16 == nbytes 16, but elements
        // 1 and 2 of the base are gaps and each element is viewed twice.
        let g = Geometry::new(&"t", DType::F32, &[2, 2], Some(&[3, 0]), 0).unwrap();
        assert_eq!(g.extent(), g.nbytes());
        assert!(!g.is_dense());
        assert!(Geometry::new(&"t", DType::F32, &[4, 3], Some(&[1, 4]), 0)
            .unwrap()
            .is_dense());
        let col = Geometry::new(&"t", DType::F32, &[4, 1], Some(&[2, 1]), 0).unwrap();
        assert!(
            col.elements_overlap(0, 4) && !col.elements_overlap(4, 8) && col.elements_overlap(8, 9)
        );
        let mut dst = [9u8; 16];
        let g2 = Geometry::new(&"t", DType::U8, &[2], Some(&[8]), 0).unwrap();
        g2.copy_elements(&[1u8; 9], &mut dst[..9]);
        assert_eq!(&dst[..9], &[1, 9, 9, 9, 9, 9, 9, 9, 1]);
    }

    #[test]
    fn element_walk_matches_strides() {
        let g = Geometry::new(&"t", DType::I16, &[2, 2], Some(&[1, 3]), 0).unwrap();
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
            match Geometry::new(&"p", dtype, &shape, Some(&strides), offset) {
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
            let g = Geometry::new(&"p", DType::F32, &shape, Some(&strides), 3).unwrap();
            let idx: Vec<i64> = shape.iter().enumerate()
                .map(|(i, &n)| ((seed >> (i * 8)) % n) as i64).collect();
            let off = g.byte_offset_of(&"p", &idx).unwrap();
            prop_assert!(span_contains(g.start_byte(), g.extent(), off, 4));
        }
    }
}

#[cfg(test)]
mod intersect_tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes_of(g: &Geometry, base: u64) -> std::collections::BTreeSet<u64> {
        let es = g.dtype().size();
        let mut s = std::collections::BTreeSet::new();
        g.for_each_element(|o| {
            for b in 0..es {
                s.insert(base + g.start_byte() + o + b);
            }
        });
        s
    }

    proptest! {
        #[test]
        fn intersection_matches_byte_sets(
            a in prop::collection::vec((1u64..5, 0u64..7), 1..3),
            b in prop::collection::vec((1u64..5, 0u64..7), 1..3),
            oa in 0u64..12, ob in 0u64..12, shift in 0u64..16,
        ) {
            let sa: Vec<u64> = a.iter().map(|d| d.0).collect();
            let ta: Vec<u64> = a.iter().map(|d| d.1).collect();
            let sb: Vec<u64> = b.iter().map(|d| d.0).collect();
            let tb: Vec<u64> = b.iter().map(|d| d.1).collect();
            let ga = Geometry::new(&"a", DType::I16, &sa, Some(&ta), oa).unwrap();
            let gb = Geometry::new(&"b", DType::I16, &sb, Some(&tb), ob).unwrap();
            let (base_a, base_b) = (1000, 1000 + shift);
            let expect = !bytes_of(&ga, base_a).is_disjoint(&bytes_of(&gb, base_b));
            prop_assert_eq!(ga.elements_intersect(base_a, &gb, base_b), expect);
            prop_assert_eq!(gb.elements_intersect(base_b, &ga, base_a), expect);
        }
    }
}
