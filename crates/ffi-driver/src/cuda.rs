//! The `cuda` backend: the CUDA driver API (`libcuda.so.1`) opened at run time, through the
//! `_v2` symbols and the device's primary context (`cuda.h`).
//!
//! `cuMemAlloc` memory has no host mapping, so `map_host` always answers `Refused` (without a
//! vendor call; still counted as a refusal) and every host view is a mirror. Every call is
//! validated against the ledger first (zero-byte allocations, copies past their allocation and
//! unknown addresses fail before any vendor call), counted and logged like sim; an injected fault
//! fails the call before the vendor function runs. The device may be used from several threads:
//! the primary context is made current (`cuCtxSetCurrent`) before each call.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use crate::device::{CallRecord, CloseReport, DevPtr, Device, MapGrant, Stats};
use crate::loader::{self, LoadError, VendorLib};
use crate::{traced, DeviceError, Ledger, Ledgered, Op};

/// Environment override: the path (or name) of the CUDA driver library.
pub const ENV_CUDA_LIB: &str = "SIMPLER_CUDA_LIB";
/// Library names tried when no override is given (the loader's search path applies).
pub const DEFAULT_CUDA_LIBS: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

const CUDA_ERROR_INVALID_VALUE: i64 = 1;
const CUDA_ERROR_NOT_SUPPORTED: i64 = 801;

/// The symbolic name of a `CUresult` (`cuda.h`), or `"UNKNOWN"`.
pub fn cuda_code_name(code: i64) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        _ => "UNKNOWN",
    }
}

/// Options of a CUDA device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaConfig {
    /// Device ordinal (as `cuDeviceGet` numbers devices, after `CUDA_VISIBLE_DEVICES`).
    pub device_id: u32,
    /// Path of the driver library; overrides `SIMPLER_CUDA_LIB` and the default names.
    pub lib_path: Option<PathBuf>,
}

/// `CUcontext`: an opaque pointer.
type CuContext = *mut c_void;
/// `CUdevice`: an int.
type CuDevice = c_int;
/// `CUdeviceptr` (v2): unsigned long long.
type CuDevicePtr = c_ulonglong;

// Raw signatures (cuda.h); CUresult is a C enum (int).
type CuInitFn = unsafe extern "C" fn(flags: c_uint) -> c_int;
type CuDeviceGetFn = unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> c_int;
type CuPrimaryCtxRetainFn = unsafe extern "C" fn(pctx: *mut CuContext, dev: CuDevice) -> c_int;
type CuPrimaryCtxReleaseFn = unsafe extern "C" fn(dev: CuDevice) -> c_int;
type CuCtxSetCurrentFn = unsafe extern "C" fn(ctx: CuContext) -> c_int;
type CuMemAllocFn = unsafe extern "C" fn(dptr: *mut CuDevicePtr, bytesize: usize) -> c_int;
type CuMemFreeFn = unsafe extern "C" fn(dptr: CuDevicePtr) -> c_int;
type CuMemcpyHtoDFn =
    unsafe extern "C" fn(dst: CuDevicePtr, src: *const c_void, bytes: usize) -> c_int;
type CuMemcpyDtoHFn =
    unsafe extern "C" fn(dst: *mut c_void, src: CuDevicePtr, bytes: usize) -> c_int;
type CuMemsetD8Fn = unsafe extern "C" fn(dst: CuDevicePtr, uc: u8, n: usize) -> c_int;

#[derive(Clone, Copy)]
struct CudaFns {
    primary_ctx_release: CuPrimaryCtxReleaseFn,
    ctx_set_current: CuCtxSetCurrentFn,
    mem_alloc: CuMemAllocFn,
    mem_free: CuMemFreeFn,
    memcpy_htod: CuMemcpyHtoDFn,
    memcpy_dtoh: CuMemcpyDtoHFn,
    memset_d8: CuMemsetD8Fn,
}

impl Ledgered for State {
    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

#[derive(Debug)]
struct State {
    ledger: Ledger,
    /// The retained primary context; null once released.
    ctx: CuContext,
}

/// An NVIDIA GPU through the CUDA driver API. See the module docs.
pub struct CudaDevice {
    config: CudaConfig,
    lib: VendorLib,
    dev: CuDevice,
    f: CudaFns,
    state: Mutex<State>,
}

// SAFETY: the only non-thread-safe field is the raw `CUcontext` inside `state`, an opaque handle
// the CUDA driver allows to be made current on any thread; it is only read under the mutex.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; every access to the context and the ledger goes through the mutex.
unsafe impl Sync for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("device_id", &self.config.device_id)
            .field("library", &self.lib.path)
            .finish_non_exhaustive()
    }
}

fn init_err(lib: VendorLib, call: &str, code: c_int, detail: String) -> LoadError {
    let code = i64::from(code);
    LoadError::Init {
        library: lib.name.to_string(),
        call: call.to_string(),
        code,
        code_name: cuda_code_name(code).to_string(),
        detail,
    }
}

impl CudaDevice {
    /// Opens device `config.device_id`: loads the driver library (config path, else
    /// `SIMPLER_CUDA_LIB`, else `libcuda.so.1` / `libcuda.so` on the loader's search path),
    /// `cuInit(0)`, and retains the device's primary context.
    pub fn open(config: CudaConfig) -> Result<CudaDevice, LoadError> {
        let ordinal = c_int::try_from(config.device_id).map_err(|_| LoadError::Config {
            what: "device_id".to_string(),
            detail: format!("{} does not fit int", config.device_id),
        })?;
        let paths: Vec<PathBuf> = match (&config.lib_path, std::env::var_os(ENV_CUDA_LIB)) {
            (Some(p), _) => vec![p.clone()],
            (None, Some(p)) if !p.is_empty() => vec![PathBuf::from(p)],
            _ => DEFAULT_CUDA_LIBS.iter().map(PathBuf::from).collect(),
        };
        let lib = loader::open_first("libcuda.so.1", &paths)?;
        // SAFETY: each type is the exact cuda.h signature of the named (v2) symbol.
        let (init, device_get, retain, f) = unsafe {
            (
                lib.sym::<CuInitFn>("cuInit")?,
                lib.sym::<CuDeviceGetFn>("cuDeviceGet")?,
                lib.sym::<CuPrimaryCtxRetainFn>("cuDevicePrimaryCtxRetain")?,
                CudaFns {
                    primary_ctx_release: lib
                        .sym::<CuPrimaryCtxReleaseFn>("cuDevicePrimaryCtxRelease_v2")?,
                    ctx_set_current: lib.sym::<CuCtxSetCurrentFn>("cuCtxSetCurrent")?,
                    mem_alloc: lib.sym::<CuMemAllocFn>("cuMemAlloc_v2")?,
                    mem_free: lib.sym::<CuMemFreeFn>("cuMemFree_v2")?,
                    memcpy_htod: lib.sym::<CuMemcpyHtoDFn>("cuMemcpyHtoD_v2")?,
                    memcpy_dtoh: lib.sym::<CuMemcpyDtoHFn>("cuMemcpyDtoH_v2")?,
                    memset_d8: lib.sym::<CuMemsetD8Fn>("cuMemsetD8_v2")?,
                },
            )
        };
        // SAFETY: `CUresult cuInit(unsigned int Flags)`, Flags must be 0.
        let code = unsafe { init(0) };
        if code != 0 {
            return Err(init_err(
                lib,
                "cuInit",
                code,
                format!("opened from {}", lib.path),
            ));
        }
        let mut dev: CuDevice = 0;
        // SAFETY: `&mut dev` is valid for the int the call writes.
        let code = unsafe { device_get(&mut dev, ordinal) };
        if code != 0 {
            return Err(init_err(
                lib,
                "cuDeviceGet",
                code,
                format!("ordinal {ordinal}"),
            ));
        }
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: `&mut ctx` is valid for the pointer the call writes; `dev` came from
        // cuDeviceGet.
        let code = unsafe { retain(&mut ctx, dev) };
        if code != 0 || ctx.is_null() {
            return Err(init_err(
                lib,
                "cuDevicePrimaryCtxRetain",
                code,
                format!("device {ordinal}"),
            ));
        }
        Ok(CudaDevice {
            config,
            lib,
            dev,
            f,
            state: Mutex::new(State {
                ledger: Ledger::new(),
                ctx,
            }),
        })
    }

    /// The options this device was opened with.
    pub fn config(&self) -> &CudaConfig {
        &self.config
    }

    /// The path the driver library was opened from.
    pub fn library(&self) -> &str {
        self.lib.path
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn call_name(op: Op) -> &'static str {
        match op {
            Op::Alloc => "cuMemAlloc_v2",
            Op::Free => "cuMemFree_v2",
            Op::H2d => "cuMemcpyHtoD_v2",
            Op::D2h => "cuMemcpyDtoH_v2",
            Op::Map => "cuda_map_host",
            Op::Unmap => "cuda_unmap_host",
            Op::Memset => "cuMemsetD8_v2",
        }
    }

    fn err(op: Op, code: i64, detail: impl Into<String>) -> DeviceError {
        DeviceError::new(op, Self::call_name(op), code, cuda_code_name(code), detail)
    }

    /// Makes the primary context current on the calling thread.
    fn make_current(&self, st: &State, op: Op) -> Result<(), DeviceError> {
        if st.ctx.is_null() {
            return Err(DeviceError::new(
                op,
                "cuCtxSetCurrent",
                201,
                cuda_code_name(201),
                "the primary context was released (device dropped)",
            ));
        }
        // SAFETY: `CUresult cuCtxSetCurrent(CUcontext)` with the context retained in `open`
        // and not yet released.
        let code = i64::from(unsafe { (self.f.ctx_set_current)(st.ctx) });
        if code != 0 {
            return Err(DeviceError::new(
                op,
                "cuCtxSetCurrent",
                code,
                cuda_code_name(code),
                "making the primary context current",
            ));
        }
        Ok(())
    }

    /// The error of an injected fault: it fails the call before the vendor function.
    fn injected(op: Op) -> impl FnOnce(i64) -> DeviceError {
        move |code| Self::err(op, code, "injected fault")
    }

    /// A copy's CUresult as a result.
    fn copy_result(op: Op, code: i64, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        if code == 0 {
            return Ok(());
        }
        let what = match op {
            Op::H2d => "host-to-device copy",
            Op::Memset => "device memset",
            _ => "device-to-host copy",
        };
        Err(Self::err(op, code, what).at(addr).sized(bytes))
    }

    fn containing(st: &State, op: Op, addr: u64, bytes: u64) -> Result<(u64, u64), DeviceError> {
        st.ledger
            .containing(addr, bytes)
            .map(|(b, s)| (b.0, s))
            .ok_or_else(|| {
                Self::err(
                    op,
                    CUDA_ERROR_INVALID_VALUE,
                    "no live allocation contains this range (unknown address, freed, or the \
                     range runs past its allocation); no vendor call made",
                )
                .at(addr)
                .sized(bytes)
            })
    }

    fn do_alloc(&self, st: &mut State, bytes: u64) -> Result<DevPtr, DeviceError> {
        if bytes == 0 {
            return Err(Self::err(
                Op::Alloc,
                CUDA_ERROR_INVALID_VALUE,
                "zero-byte allocation; no vendor call made",
            )
            .sized(0));
        }
        let size = usize::try_from(bytes).map_err(|_| {
            Self::err(Op::Alloc, CUDA_ERROR_INVALID_VALUE, "size exceeds size_t").sized(bytes)
        })?;
        self.make_current(st, Op::Alloc)?;
        let mut p: CuDevicePtr = 0;
        // SAFETY: `&mut p` is valid for the CUdeviceptr the call writes.
        let code = i64::from(unsafe { (self.f.mem_alloc)(&mut p, size) });
        if code != 0 {
            return Err(Self::err(Op::Alloc, code, "device allocation").sized(bytes));
        }
        if p == 0 {
            return Err(Self::err(Op::Alloc, code, "success with a null pointer").sized(bytes));
        }
        st.ledger.on_alloc(DevPtr(p), bytes);
        Ok(DevPtr(p))
    }

    fn do_free(&self, st: &mut State, ptr: DevPtr) -> Result<(), DeviceError> {
        let Some(size) = st.ledger.live_size(ptr) else {
            return Err(Self::err(
                Op::Free,
                CUDA_ERROR_INVALID_VALUE,
                "not a live allocation (unknown address or already freed); no vendor call made",
            )
            .at(ptr.0));
        };
        self.make_current(st, Op::Free)?;
        // SAFETY: `ptr` is a live cuMemAlloc allocation (ledger); the host never dereferences it.
        let code = i64::from(unsafe { (self.f.mem_free)(ptr.0) });
        if code != 0 {
            return Err(Self::err(Op::Free, code, "allocation left live")
                .at(ptr.0)
                .sized(size));
        }
        st.ledger.on_free(ptr);
        Ok(())
    }
}

impl Device for CudaDevice {
    fn platform(&self) -> &'static str {
        "cuda"
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        traced(&mut *self.lock(), op, 0, bytes, Self::injected(op), |st| {
            self.do_alloc(st, bytes)
        })
    }

    fn free(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let mut st = self.lock();
        let size = st.ledger.live_size(ptr).unwrap_or(0);
        let op = Op::Free;
        traced(&mut *st, op, ptr.0, size, Self::injected(op), |st| {
            self.do_free(st, ptr)
        })
    }

    fn copy_h2d(&self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::H2d, src.len() as u64);
        traced(
            &mut *self.lock(),
            op,
            dst.0,
            bytes,
            Self::injected(op),
            |st| {
                Self::containing(st, op, dst.0, bytes)?;
                if src.is_empty() {
                    return Ok(());
                }
                self.make_current(st, op)?;
                // SAFETY: `src` is valid for `src.len()` reads; `[dst, dst + len)` lies inside a live
                // allocation (checked above).
                let code = i64::from(unsafe {
                    (self.f.memcpy_htod)(dst.0, src.as_ptr().cast(), src.len())
                });
                Self::copy_result(op, code, dst.0, bytes)
            },
        )
    }

    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::D2h, dst.len() as u64);
        traced(
            &mut *self.lock(),
            op,
            src.0,
            bytes,
            Self::injected(op),
            |st| {
                Self::containing(st, op, src.0, bytes)?;
                if dst.is_empty() {
                    return Ok(());
                }
                self.make_current(st, op)?;
                // SAFETY: `dst` is valid for `dst.len()` writes; `[src, src + len)` lies inside a
                // live allocation (checked above).
                let code = i64::from(unsafe {
                    (self.f.memcpy_dtoh)(dst.as_mut_ptr().cast(), src.0, dst.len())
                });
                Self::copy_result(op, code, src.0, bytes)
            },
        )
    }

    fn fill(&self, dst: DevPtr, bytes: u64, value: u8) -> Result<(), DeviceError> {
        let op = Op::Memset;
        traced(
            &mut *self.lock(),
            op,
            dst.0,
            bytes,
            Self::injected(op),
            |st| {
                Self::containing(st, op, dst.0, bytes)?;
                if bytes == 0 {
                    return Ok(());
                }
                let n = usize::try_from(bytes)
                    .map_err(|_| Self::err(op, 1, "size does not fit size_t").at(dst.0))?;
                self.make_current(st, op)?;
                // SAFETY: `[dst, dst + bytes)` lies inside a live allocation (checked above);
                // `cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t)` touches only those bytes.
                let code = i64::from(unsafe { (self.f.memset_d8)(dst.0, value, n) });
                Self::copy_result(op, code, dst.0, bytes)
            },
        )
    }

    fn map_host(&self, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError> {
        let op = Op::Map;
        traced(
            &mut *self.lock(),
            op,
            ptr.0,
            bytes,
            Self::injected(op),
            |st| {
                Self::containing(st, op, ptr.0, bytes.max(1))?;
                st.ledger.on_map(false);
                Ok(MapGrant::Refused {
                    code: CUDA_ERROR_NOT_SUPPORTED,
                    reason:
                        "cuMemAlloc memory has no host mapping on CUDA; every host view is a mirror"
                            .to_string(),
                })
            },
        )
    }

    fn unmap_host(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Unmap;
        traced(&mut *self.lock(), op, ptr.0, 0, Self::injected(op), |_| {
            Err(Self::err(
                op,
                CUDA_ERROR_INVALID_VALUE,
                "no host mapping starts at this address (CUDA never maps device memory)",
            )
            .at(ptr.0))
        })
    }

    fn stats(&self) -> Stats {
        self.lock().ledger.stats()
    }

    fn call_log(&self) -> Vec<CallRecord> {
        self.lock().ledger.log()
    }

    fn set_phase(&self, phase: &'static str) {
        self.lock().ledger.set_phase(phase);
    }

    fn inject_fault(&self, op: Op, nth: u64, code: Option<i64>) -> Result<(), DeviceError> {
        // Default: CUDA_ERROR_ILLEGAL_ADDRESS, a sticky error on real hardware.
        self.lock().ledger.inject(op, nth, code.unwrap_or(700))
    }

    fn clear_faults(&self) {
        self.lock().ledger.clear_faults();
    }

    fn close(&self) -> CloseReport {
        let mut st = self.lock();
        st.ledger.clear_faults();
        let mut report = CloseReport::default();
        for (ptr, size) in st.ledger.live_allocations() {
            report.leaked_allocations += 1;
            report.leaked_bytes += size;
            let r = self.do_free(&mut st, ptr);
            if let Err(e) = st.ledger.logged(Op::Free, ptr.0, size, r) {
                report.errors.push(e);
            }
        }
        if report.leaked_allocations > 0 {
            log::warn!(
                "cuda device {} closed with {} live allocation(s) ({} bytes); freed them",
                self.config.device_id,
                report.leaked_allocations,
                report.leaked_bytes
            );
        }
        report
    }
}

impl Drop for CudaDevice {
    /// Frees what is still live and releases the primary context. Never panics.
    fn drop(&mut self) {
        let report = self.close();
        for e in &report.errors {
            log::warn!("cuda device {} drop: {e}", self.config.device_id);
        }
        let mut st = self.lock();
        if !st.ctx.is_null() {
            // SAFETY: `CUresult cuDevicePrimaryCtxRelease_v2(CUdevice)`, balancing the retain
            // in `open`; the context is not used afterwards (nulled below).
            let code = i64::from(unsafe { (self.f.primary_ctx_release)(self.dev) });
            if code != 0 {
                log::warn!(
                    "cuDevicePrimaryCtxRelease_v2 failed with code {code} ({})",
                    cuda_code_name(code)
                );
            }
            st.ctx = std::ptr::null_mut();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_code_names() {
        assert_eq!(cuda_code_name(0), "CUDA_SUCCESS");
        assert_eq!(cuda_code_name(34), "CUDA_ERROR_STUB_LIBRARY");
        assert_eq!(cuda_code_name(801), "CUDA_ERROR_NOT_SUPPORTED");
        assert_eq!(cuda_code_name(9999), "UNKNOWN");
    }

    #[test]
    fn a_missing_library_is_an_error_naming_the_path() {
        let e = CudaDevice::open(CudaConfig {
            device_id: 0,
            lib_path: Some(PathBuf::from("/nonexistent/libcuda.so.1")),
        })
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent/libcuda.so.1"), "{msg}");
        assert!(matches!(e, LoadError::Library { .. }), "{e:?}");
    }
}
