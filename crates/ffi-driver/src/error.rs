//! Driver errors: every failure names the operation, the vendor call, its code (with the
//! symbolic name where one is known), and the device address and size involved.

use std::fmt;

/// A driver operation, as counted, logged and fault-injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Alloc,
    Free,
    H2d,
    D2h,
    Map,
    Unmap,
    /// Fills device memory with a byte (poisoning never-written memory).
    Memset,
}

impl Op {
    /// All operations, in a fixed order.
    pub const ALL: [Op; 7] = [
        Op::Alloc,
        Op::Free,
        Op::H2d,
        Op::D2h,
        Op::Map,
        Op::Unmap,
        Op::Memset,
    ];

    /// The short name used in errors, counters and `inject_fault`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Alloc => "alloc",
            Op::Free => "free",
            Op::H2d => "h2d",
            Op::D2h => "d2h",
            Op::Map => "map",
            Op::Unmap => "unmap",
            Op::Memset => "memset",
        }
    }

    /// Parses a short name (`"alloc"`, `"free"`, `"h2d"`, `"d2h"`, `"map"`, `"unmap"`).
    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Driver-style status codes used by the sim backend. They follow the Ascend HAL's
/// `drvError_t` numbering (`ascend_hal.h`), so a sim failure reads like a real one.
pub mod codes {
    pub const INVALID_VALUE: i64 = 3;
    pub const OUT_OF_MEMORY: i64 = 6;
    pub const INNER_ERR: i64 = 7;
    pub const PARA_ERROR: i64 = 8;
    pub const NOT_EXIST: i64 = 11;
    pub const BUSY: i64 = 13;
    pub const BAD_ADDRESS: i64 = 79;
    pub const NOT_SUPPORT: i64 = 0xfffe;

    /// The symbolic name of a sim / HAL code, or `"UNKNOWN"`.
    pub fn name(code: i64) -> &'static str {
        match code {
            0 => "DRV_ERROR_NONE",
            1 => "DRV_ERROR_NO_DEVICE",
            2 => "DRV_ERROR_INVALID_DEVICE",
            3 => "DRV_ERROR_INVALID_VALUE",
            4 => "DRV_ERROR_INVALID_HANDLE",
            6 => "DRV_ERROR_OUT_OF_MEMORY",
            7 => "DRV_ERROR_INNER_ERR",
            8 => "DRV_ERROR_PARA_ERROR",
            9 => "DRV_ERROR_UNINIT",
            11 => "DRV_ERROR_NOT_EXIST",
            13 => "DRV_ERROR_BUSY",
            14 => "DRV_ERROR_NO_RESOURCES",
            16 => "DRV_ERROR_WAIT_TIMEOUT",
            37 => "DRV_ERROR_OVER_LIMIT",
            40 => "DRV_ERROR_MALLOC_FAIL",
            46 => "DRV_ERROR_OPER_NOT_PERMITTED",
            51 => "DRV_ERROR_TRY_AGAIN",
            79 => "DRV_ERROR_BAD_ADDRESS",
            88 => "DRV_ERROR_PERMISSION",
            0xfffe => "DRV_ERROR_NOT_SUPPORT",
            _ => "UNKNOWN",
        }
    }
}

/// A failed driver call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed with code {code} ({code_name}) [{op}{}{}]: {detail}",
    .addr.map(|a| format!(", device address {a:#x}")).unwrap_or_default(),
    .bytes.map(|b| format!(", {b} bytes")).unwrap_or_default())]
#[non_exhaustive]
pub struct DeviceError {
    /// The operation that failed.
    pub op: Op,
    /// The vendor (or sim) function that reported the failure.
    pub call: String,
    /// The driver's status code.
    pub code: i64,
    /// The symbolic name of `code`.
    pub code_name: String,
    /// The device address involved, if any.
    pub addr: Option<u64>,
    /// The size involved, if any.
    pub bytes: Option<u64>,
    /// What went wrong, in words.
    pub detail: String,
}

impl DeviceError {
    /// Builds an error for `op` reported by `call` with `code`.
    pub fn new(
        op: Op,
        call: impl Into<String>,
        code: i64,
        code_name: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        DeviceError {
            op,
            call: call.into(),
            code,
            code_name: code_name.into(),
            addr: None,
            bytes: None,
            detail: detail.into(),
        }
    }

    /// Attaches the device address involved.
    pub fn at(mut self, addr: u64) -> Self {
        self.addr = Some(addr);
        self
    }

    /// Attaches the size involved.
    pub fn sized(mut self, bytes: u64) -> Self {
        self.bytes = Some(bytes);
        self
    }
}
