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
    /// Page-locks host memory for faster copies (a mirror; CUDA `cuMemHostRegister`).
    Pin,
    /// Undoes [`Op::Pin`].
    Unpin,
    /// Loads device code into the device's context (CUDA `cuModuleLoadData`, resolving an entry).
    Module,
    /// Launches device code on the worker's stream (CUDA `cuLaunchKernel`); asynchronous.
    Launch,
    /// Waits until the worker's stream has finished its work (CUDA `cuStreamSynchronize`), or
    /// orders another stream after it (an event).
    Sync,
    /// Device lifecycle: binding the device or its context to a thread, resetting it. Errors
    /// only: not counted, logged or fault-injectable.
    Device,
}

impl Op {
    /// The operations that are counted, logged and fault-injectable, in a fixed order.
    pub const ALL: [Op; 12] = [
        Op::Alloc,
        Op::Free,
        Op::H2d,
        Op::D2h,
        Op::Map,
        Op::Unmap,
        Op::Memset,
        Op::Pin,
        Op::Unpin,
        Op::Module,
        Op::Launch,
        Op::Sync,
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
            Op::Pin => "pin",
            Op::Unpin => "unpin",
            Op::Module => "module",
            Op::Launch => "launch",
            Op::Sync => "sync",
            Op::Device => "device",
        }
    }

    /// What a copy or memset is, in words (the detail of its vendor call's error): `H2d` and
    /// `Memset` by name, anything else a device-to-host copy.
    pub(crate) fn transfer_what(self) -> &'static str {
        match self {
            Op::H2d => "host-to-device copy",
            Op::Memset => "device memset",
            _ => "device-to-host copy",
        }
    }

    /// Parses the short name of one of [`Op::ALL`] (`"alloc"`, `"free"`, `"h2d"`, ...).
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
    pub const UNINIT: i64 = 9;
    pub const NOT_EXIST: i64 = 11;
    pub const BUSY: i64 = 13;
    pub const NO_RESOURCES: i64 = 14;
    pub const OVER_LIMIT: i64 = 37;
    pub const MALLOC_FAIL: i64 = 40;
    pub const OPER_NOT_PERMITTED: i64 = 46;
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
///
/// Three kinds read differently: a vendor call that returned an error code ("`call` failed with
/// code ..."), one that returned success but an unusable result ("`call` returned success ...
/// but ..."), and a call the driver refused before making it, because its own checks failed
/// (`called == false`: "`op` refused before calling `call`"; `code` is the code the vendor would
/// have returned).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceError {
    /// The operation that failed.
    pub op: Op,
    /// The vendor (or sim) function that reported the failure, or would have been called.
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
    /// Whether the vendor function was called (false: the driver's own checks refused first).
    pub called: bool,
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut at = format!("[{}", self.op);
        if let Some(a) = self.addr {
            at.push_str(&format!(", device address {a:#x}"));
        }
        if let Some(b) = self.bytes {
            at.push_str(&format!(", {b} bytes"));
        }
        at.push(']');
        let (call, code, name, detail) = (&self.call, self.code, &self.code_name, &self.detail);
        if !self.called {
            write!(
                f,
                "{} refused before calling {call} {at}: {detail} ({name}, code {code})",
                self.op
            )
        } else if code == 0 {
            write!(f, "{call} returned success ({name}) {at} but {detail}")
        } else {
            write!(f, "{call} failed with code {code} ({name}) {at}: {detail}")
        }
    }
}

impl std::error::Error for DeviceError {}

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
            called: true,
        }
    }

    /// Marks the error as the driver's own refusal, made before calling the vendor function.
    pub fn before_call(mut self) -> Self {
        self.called = false;
        self
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

    /// This failure, of a call made while opening `library`, as the open's error
    /// ([`crate::LoadError::Init`]: the same call, code and detail).
    pub(crate) fn into_init(self, library: &str) -> crate::LoadError {
        crate::LoadError::Init {
            library: library.to_string(),
            call: self.call,
            code: self.code,
            code_name: self.code_name,
            detail: self.detail,
        }
    }
}

/// A vendor status other than success: its code and symbolic name. Each vendor's status type
/// (`ascend::sys::AclStatus`, `cuda::sys::CuResult`, ...) converts into one with `result()`, and
/// the driver turns it into a [`DeviceError`] or a [`crate::LoadError`] with the context it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub code: i64,
    pub name: &'static str,
}

impl Status {
    /// The error of `op` whose vendor call `call` returned this status.
    pub fn error(self, op: Op, call: &str, detail: impl Into<String>) -> DeviceError {
        DeviceError::new(op, call, self.code, self.name, detail)
    }

    /// The error of an initialization call `call` of `library` that returned this status.
    pub fn init_error(
        self,
        library: &str,
        call: &str,
        detail: impl Into<String>,
    ) -> crate::LoadError {
        crate::LoadError::Init {
            library: library.to_string(),
            call: call.to_string(),
            code: self.code,
            code_name: self.name.to_string(),
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_kinds_of_failure_read_differently() {
        let failed = DeviceError::new(
            Op::Free,
            "aclrtFree",
            507_000,
            "ACL_ERROR_RT_INTERNAL_ERROR",
            "allocation left live",
        )
        .at(0x10);
        assert_eq!(
            failed.to_string(),
            "aclrtFree failed with code 507000 (ACL_ERROR_RT_INTERNAL_ERROR) [free, device address 0x10]: allocation left live"
        );
        let null = DeviceError::new(
            Op::Alloc,
            "cuMemAlloc_v2",
            0,
            "CUDA_SUCCESS",
            "a null pointer",
        )
        .sized(8);
        assert_eq!(
            null.to_string(),
            "cuMemAlloc_v2 returned success (CUDA_SUCCESS) [alloc, 8 bytes] but a null pointer"
        );
        let refused = DeviceError::new(
            Op::Free,
            "aclrtFree",
            13,
            "DRV_ERROR_BUSY",
            "allocation still has 1 host mapping",
        )
        .before_call()
        .at(0x10);
        assert_eq!(
            refused.to_string(),
            "free refused before calling aclrtFree [free, device address 0x10]: allocation still has 1 host mapping (DRV_ERROR_BUSY, code 13)"
        );
        assert!(!refused.to_string().contains("failed"));
    }
}
