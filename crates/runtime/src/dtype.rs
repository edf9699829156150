//! Element types and typed scalar access (`get_tensor_data` / `set_tensor_data`).
//!
//! Names follow numpy / ml_dtypes (`arr.dtype.name`), so the Python layer passes `dtype.name`
//! through unchanged. float16 and bfloat16 convert through the `half` crate; the 1-byte fp8/fp4
//! kinds decode exactly and encode with round-to-nearest-even, refusing values they cannot hold.

use half::{bf16, f16};

use crate::error::{Error, Result};

/// A tensor element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    F8E4M3FN,
    F8E5M2,
    F4E2M1FN,
}

/// A typed value read from or written to a tensor element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
}

impl DType {
    /// Every supported dtype.
    pub const ALL: [DType; 16] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::F8E4M3FN,
        DType::F8E5M2,
        DType::F4E2M1FN,
    ];

    /// The numpy / ml_dtypes name.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
            DType::F8E4M3FN => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::F4E2M1FN => "float4_e2m1fn",
        }
    }

    /// Parses a numpy / ml_dtypes name.
    pub fn parse(name: &str) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                let known: Vec<_> = DType::ALL.iter().map(|d| d.name()).collect();
                Error::Type(format!(
                    "unsupported dtype '{name}' (supported: {})",
                    known.join(", ")
                ))
            })
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            _ => 1,
        }
    }

    /// Decodes one element from its little-endian bytes (`bytes.len() == self.size()`).
    pub fn decode(self, b: &[u8]) -> Value {
        let a2 = || [b[0], b[1]];
        let a4 = || [b[0], b[1], b[2], b[3]];
        let a8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        match self {
            DType::F32 => Value::Float(f32::from_le_bytes(a4()) as f64),
            DType::F64 => Value::Float(f64::from_le_bytes(a8())),
            DType::F16 => Value::Float(f16::from_le_bytes(a2()).to_f64()),
            DType::BF16 => Value::Float(bf16::from_le_bytes(a2()).to_f64()),
            DType::I8 => Value::Int(b[0] as i8 as i64),
            DType::I16 => Value::Int(i16::from_le_bytes(a2()) as i64),
            DType::I32 => Value::Int(i32::from_le_bytes(a4()) as i64),
            DType::I64 => Value::Int(i64::from_le_bytes(a8())),
            DType::U8 => Value::UInt(b[0] as u64),
            DType::U16 => Value::UInt(u16::from_le_bytes(a2()) as u64),
            DType::U32 => Value::UInt(u32::from_le_bytes(a4()) as u64),
            DType::U64 => Value::UInt(u64::from_le_bytes(a8())),
            DType::Bool => Value::Bool(b[0] != 0),
            DType::F8E4M3FN | DType::F8E5M2 | DType::F4E2M1FN => {
                Value::Float(MiniFloat::of(self).decode(b[0]))
            }
        }
    }

    /// [`DType::decode`] of the first `self.size()` bytes of `w` (an element read into a word:
    /// no bounds to check).
    #[inline(always)]
    pub fn decode_word(self, w: [u8; 8]) -> Value {
        let a2 = [w[0], w[1]];
        let a4 = [w[0], w[1], w[2], w[3]];
        match self {
            DType::F32 => Value::Float(f32::from_le_bytes(a4) as f64),
            DType::F64 => Value::Float(f64::from_le_bytes(w)),
            DType::F16 => Value::Float(f16::from_le_bytes(a2).to_f64()),
            DType::BF16 => Value::Float(bf16::from_le_bytes(a2).to_f64()),
            DType::I8 => Value::Int(w[0] as i8 as i64),
            DType::I16 => Value::Int(i16::from_le_bytes(a2) as i64),
            DType::I32 => Value::Int(i32::from_le_bytes(a4) as i64),
            DType::I64 => Value::Int(i64::from_le_bytes(w)),
            DType::U8 => Value::UInt(w[0] as u64),
            DType::U16 => Value::UInt(u16::from_le_bytes(a2) as u64),
            DType::U32 => Value::UInt(u32::from_le_bytes(a4) as u64),
            DType::U64 => Value::UInt(u64::from_le_bytes(w)),
            DType::Bool => Value::Bool(w[0] != 0),
            DType::F8E4M3FN | DType::F8E5M2 | DType::F4E2M1FN => {
                Value::Float(MiniFloat::of(self).decode(w[0]))
            }
        }
    }

    /// Encodes `v` into `out` (`out.len() == self.size()`), refusing values the type cannot hold
    /// (an integer out of range, a float for an integer type, a non-finite value a minifloat
    /// cannot represent).
    pub fn encode(self, v: Value, out: &mut [u8]) -> Result<()> {
        let range = |v: &dyn std::fmt::Display| {
            Error::Value(format!("value {v} out of range for {}", self.name()))
        };
        let as_i128 = |v: Value| -> Result<i128> {
            match v {
                Value::Int(i) => Ok(i as i128),
                Value::UInt(u) => Ok(u as i128),
                Value::Bool(b) => Ok(b as i128),
                Value::Float(f) => Err(Error::Type(format!(
                    "cannot store float {f} in a {} tensor (pass an int)",
                    self.name()
                ))),
            }
        };
        let as_f64 = |v: Value| -> f64 {
            match v {
                Value::Int(i) => i as f64,
                Value::UInt(u) => u as f64,
                Value::Float(f) => f,
                Value::Bool(b) => b as u8 as f64,
            }
        };
        macro_rules! int {
            ($t:ty) => {{
                let i = as_i128(v)?;
                let x = <$t>::try_from(i).map_err(|_| range(&i))?;
                out.copy_from_slice(&x.to_le_bytes());
            }};
        }
        match self {
            DType::I8 => int!(i8),
            DType::I16 => int!(i16),
            DType::I32 => int!(i32),
            DType::I64 => int!(i64),
            DType::U8 => int!(u8),
            DType::U16 => int!(u16),
            DType::U32 => int!(u32),
            DType::U64 => int!(u64),
            DType::Bool => {
                let i = as_i128(v)?;
                if i != 0 && i != 1 {
                    return Err(range(&i));
                }
                out[0] = i as u8;
            }
            DType::F64 => out.copy_from_slice(&as_f64(v).to_le_bytes()),
            DType::F32 | DType::F16 | DType::BF16 => {
                // A finite value the type cannot hold would silently become inf: refuse it.
                let f = as_f64(v);
                let (bytes, finite) = match self {
                    DType::F32 => {
                        let x = f as f32;
                        (x.to_le_bytes().to_vec(), x.is_finite())
                    }
                    DType::F16 => {
                        let x = f16::from_f64(f);
                        (x.to_le_bytes().to_vec(), x.is_finite())
                    }
                    _ => {
                        let x = bf16::from_f64(f);
                        (x.to_le_bytes().to_vec(), x.is_finite())
                    }
                };
                if f.is_finite() && !finite {
                    return Err(range(&f));
                }
                out.copy_from_slice(&bytes);
            }
            DType::F8E4M3FN | DType::F8E5M2 | DType::F4E2M1FN => {
                let f = as_f64(v);
                out[0] = MiniFloat::of(self).encode(f).ok_or_else(|| range(&f))?;
            }
        }
        Ok(())
    }
}

/// A 1-byte floating-point format: sign, `ebits` exponent bits (bias `bias`), `mbits` mantissa
/// bits, stored in the low bits of a byte.
#[derive(Debug, Clone, Copy)]
struct MiniFloat {
    ebits: u32,
    mbits: u32,
    bias: i32,
    /// IEEE-style: all-ones exponent is inf (mantissa 0) or NaN.
    ieee: bool,
    /// "fn" style: only S.1111.111 is NaN (e4m3fn); the rest of the top binade is finite.
    nan_all_ones: bool,
}

impl MiniFloat {
    fn of(d: DType) -> MiniFloat {
        match d {
            DType::F8E4M3FN => MiniFloat {
                ebits: 4,
                mbits: 3,
                bias: 7,
                ieee: false,
                nan_all_ones: true,
            },
            DType::F8E5M2 => MiniFloat {
                ebits: 5,
                mbits: 2,
                bias: 15,
                ieee: true,
                nan_all_ones: false,
            },
            _ => MiniFloat {
                ebits: 2,
                mbits: 1,
                bias: 1,
                ieee: false,
                nan_all_ones: false,
            },
        }
    }

    fn width(self) -> u32 {
        1 + self.ebits + self.mbits
    }

    fn decode(self, byte: u8) -> f64 {
        let bits = byte as u32 & ((1 << self.width()) - 1);
        let sign = if bits >> (self.ebits + self.mbits) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let e = (bits >> self.mbits) & ((1 << self.ebits) - 1);
        let m = bits & ((1 << self.mbits) - 1);
        let emax = (1 << self.ebits) - 1;
        if self.ieee && e == emax {
            return if m == 0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if self.nan_all_ones && e == emax && m == (1 << self.mbits) - 1 {
            return f64::NAN;
        }
        let frac = m as f64 / (1u32 << self.mbits) as f64;
        if e == 0 {
            sign * frac * 2f64.powi(1 - self.bias)
        } else {
            sign * (1.0 + frac) * 2f64.powi(e as i32 - self.bias)
        }
    }

    /// Round-to-nearest-even; `None` when the value is out of range (or NaN where the format has
    /// no NaN).
    fn encode(self, x: f64) -> Option<u8> {
        let sign_bit = 1u8 << (self.ebits + self.mbits);
        let codes = 1u8 << (self.ebits + self.mbits);
        if x.is_nan() {
            return (self.ieee || self.nan_all_ones).then_some((codes - 1) | sign_bit);
        }
        let neg = x.is_sign_negative();
        let ax = x.abs();
        // Non-negative finite codes are monotonic in value: find the nearest.
        let finite: Vec<(u8, f64)> = (0..codes)
            .map(|c| (c, self.decode(c)))
            .filter(|(_, v)| v.is_finite())
            .collect();
        let (max_code, max) = *finite.last()?;
        let s = if neg { sign_bit } else { 0 };
        if ax.is_infinite() || ax > max {
            if self.ieee {
                // Overflow rounds to inf once past max + half an ulp.
                let ulp = max - finite[finite.len() - 2].1;
                return if ax >= max + ulp / 2.0 {
                    Some((max_code + 1) | s)
                } else {
                    Some(max_code | s)
                };
            }
            let ulp = max - finite[finite.len() - 2].1;
            return (ax < max + ulp / 2.0).then_some(max_code | s);
        }
        let i = finite.partition_point(|&(_, v)| v < ax);
        let code = if i == 0 {
            finite[0].0
        } else if i == finite.len() {
            max_code
        } else {
            let (lo, hi) = (finite[i - 1], finite[i]);
            let (dl, dh) = (ax - lo.1, hi.1 - ax);
            if dl < dh || (dl == dh && lo.0 & 1 == 0) {
                lo.0
            } else {
                hi.0
            }
        };
        Some(code | s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(d: DType, v: Value) -> Value {
        let mut b = vec![0u8; d.size() as usize];
        d.encode(v, &mut b).unwrap();
        d.decode(&b)
    }

    #[test]
    fn names_and_sizes() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()).unwrap(), d);
        }
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::F8E5M2.size(), 1);
        assert!(matches!(DType::parse("complex64"), Err(Error::Type(_))));
    }

    #[test]
    fn typed_round_trips() {
        assert_eq!(round_trip(DType::I32, Value::Int(-5)), Value::Int(-5));
        assert_eq!(
            round_trip(DType::U64, Value::UInt(u64::MAX)),
            Value::UInt(u64::MAX)
        );
        assert_eq!(round_trip(DType::F16, Value::Float(1.5)), Value::Float(1.5));
        assert_eq!(
            round_trip(DType::BF16, Value::Float(3.0)),
            Value::Float(3.0)
        );
        assert_eq!(
            round_trip(DType::Bool, Value::Bool(true)),
            Value::Bool(true)
        );
        assert_eq!(
            round_trip(DType::F8E4M3FN, Value::Float(448.0)),
            Value::Float(448.0)
        );
        assert_eq!(
            round_trip(DType::F4E2M1FN, Value::Float(-6.0)),
            Value::Float(-6.0)
        );
        assert_eq!(
            round_trip(DType::F8E5M2, Value::Float(1e9)),
            Value::Float(f64::INFINITY)
        );
    }

    #[test]
    fn out_of_range_is_refused() {
        let mut b = [0u8; 1];
        assert!(DType::I8.encode(Value::Int(128), &mut b).is_err());
        assert!(DType::U8.encode(Value::Int(-1), &mut b).is_err());
        assert!(matches!(
            DType::I8.encode(Value::Float(1.0), &mut b),
            Err(Error::Type(_))
        ));
        assert!(DType::F8E4M3FN
            .encode(Value::Float(1000.0), &mut b)
            .is_err());
        assert!(DType::F4E2M1FN
            .encode(Value::Float(f64::NAN), &mut b)
            .is_err());
        assert!(DType::Bool.encode(Value::Int(2), &mut b).is_err());
    }

    #[test]
    fn minifloat_rounds_to_nearest_even() {
        // e2m1fn values: 0, 0.5, 1, 1.5, 2, 3, 4, 6. 2.5 ties between 2 (code 4) and 3 (code 5).
        assert_eq!(
            round_trip(DType::F4E2M1FN, Value::Float(2.5)),
            Value::Float(2.0)
        );
        assert_eq!(
            round_trip(DType::F4E2M1FN, Value::Float(3.5)),
            Value::Float(4.0)
        );
        assert_eq!(
            round_trip(DType::F4E2M1FN, Value::Float(0.2)),
            Value::Float(0.0)
        );
    }

    #[test]
    fn finite_values_that_overflow_are_refused() {
        let mut b2 = [0u8; 2];
        assert!(DType::F16.encode(Value::Float(1e6), &mut b2).is_err());
        assert!(DType::F16.encode(Value::Float(65504.0), &mut b2).is_ok());
        assert!(DType::F16
            .encode(Value::Float(f64::INFINITY), &mut b2)
            .is_ok());
        assert!(DType::BF16.encode(Value::Float(1e39), &mut b2).is_err());
        let mut b4 = [0u8; 4];
        assert!(DType::F32.encode(Value::Float(1e39), &mut b4).is_err());
        assert!(DType::F32.encode(Value::Float(3.0e38), &mut b4).is_ok());
        assert!(DType::F32.encode(Value::Float(f64::NAN), &mut b4).is_ok());
    }
}
