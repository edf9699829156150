//! The `ascend` backend: the CANN runtime (`libascendcl.so`, or `libruntime.so` where the `acl*`
//! symbols are absent) for memory and copies, and the driver's HAL (`libascend_hal.so`) for host
//! mappings, all opened at run time (`loader`). Constants and traps: the CANN headers (`acl/acl_base.h`, `acl/acl_rt.h`,
//! `runtime/rt.h`) and the driver's `ascend_hal.h`; `docs/platforms.md` for users.
//!
//! Invariants this file keeps:
//! * **Unregister before free.** `free` refuses an allocation that still has a host mapping
//!   (BUSY, like sim; the runtime unmaps first), and `close` unmaps every mapping before it frees
//!   anything. A mapping whose unregister fails stays recorded, so its allocation is never freed.
//! * **Revoke before unregister.** Each granted mapping is a foreign [`HostMem`] shared with the
//!   caller; `unmap_host` revokes it (waiting for accesses in flight) before `halHostUnregister`,
//!   so nothing can touch the host pointer after the HAL tears it down.
//! * **A refusal is per call, not per platform.** Any non-zero `halHostRegister` code, and a
//!   "success" that leaves the out-pointer null (the toolkit's stub HAL), is `MapGrant::Refused`.
//! * **The HAL gets the physical device id**, the runtime the logical one
//!   (`ASCEND_RT_VISIBLE_DEVICES`, see [`physical_device_id`]).
//! * Every call is validated against the ledger first (zero-byte allocations, copies past their
//!   allocation, unknown addresses fail before any vendor call), counted and logged like sim, and
//!   an injected fault fails the call before the vendor function runs.
//!
//! Threads: the runtime binds a device to the calling thread (`aclrtSetDevice`). The device may
//! be used from several threads, so before a runtime call each thread binds this device once (a
//! thread-local record of the last device bound, re-checked after `close` resets the device).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, OsString};
use std::fmt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::{CallRecord, CloseReport, DevPtr, Device, MapGrant, Stats};
use crate::error::codes;
use crate::loader::{self, LoadError, VendorLib};
use crate::{traced, DeviceError, HostMem, Ledger, Ledgered, Op};

/// Environment override: a directory (or `:`-separated list) holding `libascendcl.so` /
/// `libruntime.so` and `libascend_hal.so`. When set, only these directories are searched.
pub const ENV_LIB_DIR: &str = "SIMPLER_ASCEND_LIB_DIR";
/// The CANN toolkit root (its `lib64` holds the runtime).
pub const ENV_ASCEND_HOME: &str = "ASCEND_HOME_PATH";
/// Comma list renumbering the devices the runtime sees (logical id i = the i-th entry).
pub const ENV_VISIBLE_DEVICES: &str = "ASCEND_RT_VISIBLE_DEVICES";
/// Toolkit roots tried after `ASCEND_HOME_PATH`.
pub const DEFAULT_TOOLKIT_HOMES: [&str; 2] = [
    "/usr/local/Ascend/ascend-toolkit/latest",
    "/usr/local/Ascend/cann",
];
/// Where the driver package installs the real HAL (preferred over any toolkit stub).
pub const DRIVER_LIB_DIRS: [&str; 2] = [
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/lib64",
];

/// `halHostRegister` flag: map device memory for the host (map type 2, process type 0).
const DEV_SVM_MAP_HOST: c_uint = 2;
const MEMCPY_HOST_TO_DEVICE: c_int = 1;
const MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `rtMalloc` memory type: HBM.
const RT_MEMORY_HBM: u32 = 0x2;
const ACL_ERROR_INVALID_PARAM: i64 = 100_000;
const ACL_ERROR_REPEAT_INITIALIZE: i64 = 100_002;
const ACL_ERROR_RT_INTERNAL_ERROR: i64 = 507_000;

/// The symbolic name of an ACL / runtime status code (`acl/acl_base.h`), or `"UNKNOWN"`.
pub fn acl_code_name(code: i64) -> &'static str {
    match code {
        0 => "ACL_SUCCESS",
        100_000 => "ACL_ERROR_INVALID_PARAM",
        100_001 => "ACL_ERROR_UNINITIALIZE",
        100_002 => "ACL_ERROR_REPEAT_INITIALIZE",
        100_037 => "ACL_ERROR_REPEAT_FINALIZE",
        107_000 => "ACL_ERROR_RT_PARAM_INVALID",
        107_001 => "ACL_ERROR_RT_INVALID_DEVICEID",
        107_002 => "ACL_ERROR_RT_CONTEXT_NULL",
        200_000 => "ACL_ERROR_BAD_ALLOC",
        200_001 => "ACL_ERROR_API_NOT_SUPPORT",
        200_002 => "ACL_ERROR_INVALID_DEVICE",
        207_001 => "ACL_ERROR_RT_MEMORY_ALLOCATION",
        207_018 => "ACL_ERROR_RT_DEVICE_OOM",
        500_000 => "ACL_ERROR_INTERNAL_ERROR",
        500_003 => "ACL_ERROR_RT_FAILURE",
        500_004 => "ACL_ERROR_DRV_FAILURE",
        507_000 => "ACL_ERROR_RT_INTERNAL_ERROR",
        _ => "UNKNOWN",
    }
}

/// The symbolic name of a HAL `drvError_t` (`ascend_hal.h`), or `"UNKNOWN"`.
pub fn drv_code_name(code: i64) -> &'static str {
    codes::name(code)
}

/// Translates the runtime's logical device id into the driver's physical id, which the HAL wants.
/// `visible` is the value of `ASCEND_RT_VISIBLE_DEVICES`: when set (non-empty), logical id `i`
/// is its `i`-th entry; otherwise the ids are equal.
pub fn physical_device_id(logical: u32, visible: Option<&str>) -> Result<u32, String> {
    let Some(list) = visible.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(logical);
    };
    let mut ids: Vec<u32> = Vec::new();
    for item in list.split(',') {
        let id = item.trim().parse::<u32>().map_err(|_| {
            format!(
                "{ENV_VISIBLE_DEVICES}={list:?}: {:?} is not a device id",
                item.trim()
            )
        })?;
        if ids.contains(&id) {
            return Err(format!(
                "{ENV_VISIBLE_DEVICES}={list:?} lists device {id} twice"
            ));
        }
        ids.push(id);
    }
    usize::try_from(logical)
        .ok()
        .and_then(|i| ids.get(i).copied())
        .ok_or_else(|| {
            format!(
                "logical device {logical} is not visible: {ENV_VISIBLE_DEVICES}={list:?} lists {} device(s)",
                ids.len()
            )
        })
}

/// Page policy of device allocations. Huge pages (2 MiB) stay host-mappable on hosts whose
/// page size differs from the device's, ordinary pages do not (the open CANN driver sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MallocPolicy {
    /// Huge pages for allocations over 1 MiB, ordinary pages below (the runtime's default).
    #[default]
    HugeFirst,
    /// Huge pages only (small allocations become mappable; costs device memory).
    HugeOnly,
    /// Ordinary pages only.
    NormalOnly,
}

impl MallocPolicy {
    /// Parses `"huge_first"`, `"huge_only"` or `"normal_only"`.
    pub fn parse(s: &str) -> Option<MallocPolicy> {
        match s {
            "huge_first" => Some(MallocPolicy::HugeFirst),
            "huge_only" => Some(MallocPolicy::HugeOnly),
            "normal_only" => Some(MallocPolicy::NormalOnly),
            _ => None,
        }
    }

    /// `aclrtMemMallocPolicy`: HUGE_FIRST=0, HUGE_ONLY=1, NORMAL_ONLY=2.
    fn acl(self) -> c_int {
        match self {
            MallocPolicy::HugeFirst => 0,
            MallocPolicy::HugeOnly => 1,
            MallocPolicy::NormalOnly => 2,
        }
    }

    /// `rtMalloc` memory type: RT_MEMORY_HBM | page policy.
    fn rt_mem_type(self) -> u32 {
        RT_MEMORY_HBM
            | match self {
                MallocPolicy::HugeFirst => 0x400,
                MallocPolicy::HugeOnly => 0x800,
                MallocPolicy::NormalOnly => 0x1000,
            }
    }
}

/// Options of an Ascend device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AscendConfig {
    /// The logical device id (as the runtime numbers devices).
    pub device_id: u32,
    /// Page policy of allocations.
    pub malloc_policy: MallocPolicy,
    /// Directory holding the libraries; when set, the only place searched (overrides
    /// `SIMPLER_ASCEND_LIB_DIR` and the install locations).
    pub lib_dir: Option<PathBuf>,
    /// The `ASCEND_RT_VISIBLE_DEVICES` value to translate device ids with; `None` reads the
    /// environment, `Some("")` means no renumbering.
    pub visible_devices: Option<String>,
}

/// Which runtime API family the device uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeApi {
    /// `aclInit` / `aclrtSetDevice` / `aclrtMalloc` / `aclrtFree` / `aclrtMemcpy` (libascendcl.so).
    Acl,
    /// `rtSetDevice` / `rtMalloc` / `rtFree` / `rtMemcpy` (libruntime.so), the fallback.
    Rt,
}

// Raw vendor signatures (the CANN headers), widths exact: int32_t = i32, int = c_int, size_t = usize,
// uint64_t / UINT64 = u64 / c_ulonglong, uint32_t / UINT32 = c_uint, uint16_t = u16.
type AclInitFn = unsafe extern "C" fn(config_path: *const c_char) -> c_int;
type AclFinalizeFn = unsafe extern "C" fn() -> c_int;
type SetDeviceFn = unsafe extern "C" fn(device_id: i32) -> c_int;
type AclMallocFn =
    unsafe extern "C" fn(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> c_int;
type FreeFn = unsafe extern "C" fn(dev_ptr: *mut c_void) -> c_int;
type AclMemcpyFn = unsafe extern "C" fn(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> c_int;
type AclMemsetFn =
    unsafe extern "C" fn(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize) -> c_int;
type RtMemsetFn =
    unsafe extern "C" fn(dev_ptr: *mut c_void, dest_max: u64, value: u32, count: u64) -> i32;
type RtMallocFn = unsafe extern "C" fn(
    dev_ptr: *mut *mut c_void,
    size: u64,
    mem_type: u32,
    module_id: u16,
) -> i32;
type RtMemcpyFn = unsafe extern "C" fn(
    dst: *mut c_void,
    dest_max: u64,
    src: *const c_void,
    cnt: u64,
    kind: c_int,
) -> i32;
type HalHostRegisterFn = unsafe extern "C" fn(
    src_ptr: *mut c_void,
    size: c_ulonglong,
    flag: c_uint,
    devid: c_uint,
    dst_ptr: *mut *mut c_void,
) -> c_int;
type HalHostUnregisterFn = unsafe extern "C" fn(src_ptr: *mut c_void, devid: c_uint) -> c_int;

#[derive(Clone, Copy)]
struct AclFns {
    init: AclInitFn,
    finalize: AclFinalizeFn,
    set_device: SetDeviceFn,
    reset_device: SetDeviceFn,
    malloc: AclMallocFn,
    free: FreeFn,
    memcpy: AclMemcpyFn,
    memset: AclMemsetFn,
}

#[derive(Clone, Copy)]
struct RtFns {
    set_device: SetDeviceFn,
    /// `rtDeviceReset`; optional (only used on close).
    reset_device: Option<SetDeviceFn>,
    malloc: RtMallocFn,
    free: FreeFn,
    memcpy: RtMemcpyFn,
    memset: RtMemsetFn,
}

#[derive(Clone, Copy)]
enum Runtime {
    Acl(VendorLib, AclFns),
    Rt(VendorLib, RtFns),
}

#[derive(Clone, Copy)]
struct Hal {
    lib: VendorLib,
    register: HalHostRegisterFn,
    unregister: HalHostUnregisterFn,
}

impl Runtime {
    fn api(&self) -> RuntimeApi {
        match self {
            Runtime::Acl(..) => RuntimeApi::Acl,
            Runtime::Rt(..) => RuntimeApi::Rt,
        }
    }

    fn lib(&self) -> VendorLib {
        match self {
            Runtime::Acl(l, _) | Runtime::Rt(l, _) => *l,
        }
    }

    fn call(&self, op: Op) -> &'static str {
        let acl = matches!(self, Runtime::Acl(..));
        match (op, acl) {
            (Op::Alloc, true) => "aclrtMalloc",
            (Op::Alloc, false) => "rtMalloc",
            (Op::Free, true) => "aclrtFree",
            (Op::Free, false) => "rtFree",
            (Op::H2d | Op::D2h, true) => "aclrtMemcpy",
            (Op::H2d | Op::D2h, false) => "rtMemcpy",
            (Op::Map, _) => "halHostRegister",
            (Op::Unmap, _) => "halHostUnregister",
            (Op::Memset, true) => "aclrtMemset",
            (Op::Memset, false) => "rtMemset",
        }
    }

    fn set_device_name(&self) -> &'static str {
        match self {
            Runtime::Acl(..) => "aclrtSetDevice",
            Runtime::Rt(..) => "rtSetDevice",
        }
    }

    fn reset_device_name(&self) -> &'static str {
        match self {
            Runtime::Acl(..) => "aclrtResetDevice",
            Runtime::Rt(..) => "rtDeviceReset",
        }
    }

    fn set_device(&self, id: i32) -> i64 {
        let f = match self {
            Runtime::Acl(_, f) => f.set_device,
            Runtime::Rt(_, f) => f.set_device,
        };
        // SAFETY: `int32_t (a)rtSetDevice(int32_t)`; takes no pointers.
        i64::from(unsafe { f(id) })
    }

    fn reset_device(&self, id: i32) -> i64 {
        let f = match self {
            Runtime::Acl(_, f) => Some(f.reset_device),
            Runtime::Rt(_, f) => f.reset_device,
        };
        // SAFETY: `int32_t aclrtResetDevice(int32_t)` / `rtDeviceReset(int32_t)`; no pointers.
        f.map_or(0, |f| i64::from(unsafe { f(id) }))
    }

    /// Allocates `bytes` (> 0, fits `usize`); returns the code and the pointer written.
    fn malloc(&self, bytes: u64, policy: MallocPolicy) -> (i64, *mut c_void) {
        let mut p: *mut c_void = std::ptr::null_mut();
        let code = match self {
            Runtime::Acl(_, f) => {
                let size = usize::try_from(bytes).unwrap_or(usize::MAX);
                // SAFETY: `&mut p` is valid for the pointer-sized write the call makes; the
                // size and policy are plain values.
                unsafe { (f.malloc)(&mut p, size, policy.acl()) }
            }
            // SAFETY: as above; module id 0 (the application).
            Runtime::Rt(_, f) => unsafe { (f.malloc)(&mut p, bytes, policy.rt_mem_type(), 0) },
        };
        (i64::from(code), p)
    }

    fn free(&self, ptr: u64) -> i64 {
        let f = match self {
            Runtime::Acl(_, f) => f.free,
            Runtime::Rt(_, f) => f.free,
        };
        // SAFETY: `ptr` is a live allocation of this runtime (checked against the ledger by the
        // caller) with no host mapping left; the runtime does not dereference it on the host.
        i64::from(unsafe { f(ptr as *mut c_void) })
    }

    /// # Safety
    /// The host side of the copy (`dst` for D2H, `src` for H2D) must be valid for `count` bytes,
    /// and the device side must lie inside a live allocation with `dest_max` bytes from `dst`
    /// (for H2D).
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        dest_max: u64,
        src: *const c_void,
        count: u64,
        kind: c_int,
    ) -> i64 {
        match self {
            Runtime::Acl(_, f) => {
                let (Ok(max), Ok(n)) = (usize::try_from(dest_max), usize::try_from(count)) else {
                    return ACL_ERROR_INVALID_PARAM;
                };
                // SAFETY: per this function's contract.
                i64::from(unsafe { (f.memcpy)(dst, max, src, n, kind) })
            }
            // SAFETY: per this function's contract.
            Runtime::Rt(_, f) => i64::from(unsafe { (f.memcpy)(dst, dest_max, src, count, kind) }),
        }
    }
}

impl Runtime {
    /// `aclrtMemset` / `rtMemset` of `count` bytes at `dst` to `value`.
    ///
    /// # Safety
    /// `[dst, dst + count)` must lie inside a live allocation with `dest_max` bytes from `dst`.
    unsafe fn memset(&self, dst: *mut c_void, dest_max: u64, value: u8, count: u64) -> i64 {
        match self {
            Runtime::Acl(_, f) => {
                let (Ok(max), Ok(n)) = (usize::try_from(dest_max), usize::try_from(count)) else {
                    return ACL_ERROR_INVALID_PARAM;
                };
                // SAFETY: per this function's contract.
                i64::from(unsafe { (f.memset)(dst, max, i32::from(value), n) })
            }
            Runtime::Rt(_, f) => {
                // SAFETY: per this function's contract.
                i64::from(unsafe { (f.memset)(dst, dest_max, u32::from(value), count) })
            }
        }
    }
}

/// Process-wide `aclInit` bookkeeping, per runtime library path: how many open devices use it,
/// and whether our `aclInit` did the initialization (someone else in the process may have, in
/// which case it answered REPEAT_INITIALIZE and the finalization is not ours to do).
static ACL_USERS: Mutex<Option<HashMap<&'static str, (usize, bool)>>> = Mutex::new(None);

fn acl_users() -> MutexGuard<'static, Option<HashMap<&'static str, (usize, bool)>>> {
    ACL_USERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unique id of each device instance (for the per-thread binding record).
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (device instance, binding generation) last bound on this thread by `aclrtSetDevice`.
    static BOUND: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

#[derive(Debug)]
struct MapEntry {
    bytes: u64,
    mem: Arc<HostMem>,
}

impl Ledgered for State {
    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

#[derive(Debug)]
struct State {
    ledger: Ledger,
    /// Live host mappings by device start address.
    mappings: BTreeMap<u64, MapEntry>,
    /// Whether the device is set (bound) and needs a reset on close.
    device_set: bool,
    /// Bumped by each reset, so every thread binds again afterwards.
    generation: u64,
}

/// An Ascend NPU through the CANN runtime and HAL. See the module docs.
pub struct AscendDevice {
    config: AscendConfig,
    logical: i32,
    hal_id: u32,
    runtime: Runtime,
    hal: Hal,
    instance: u64,
    state: Mutex<State>,
}

impl fmt::Debug for AscendDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AscendDevice")
            .field("device_id", &self.logical)
            .field("hal_device_id", &self.hal_id)
            .field("runtime", &self.runtime.api())
            .field("runtime_library", &self.runtime.lib().path)
            .field("hal_library", &self.hal.lib.path)
            .finish_non_exhaustive()
    }
}

/// Directories to search: runtime dirs, HAL dirs, and whether to fall back to the bare name.
fn search_dirs(config: &AscendConfig) -> (Vec<PathBuf>, Vec<PathBuf>, bool) {
    search_dirs_from(
        config,
        std::env::var_os(ENV_LIB_DIR),
        std::env::var_os(ENV_ASCEND_HOME),
    )
}

/// [`search_dirs`] with the environment passed in (`SIMPLER_ASCEND_LIB_DIR`, `ASCEND_HOME_PATH`).
fn search_dirs_from(
    config: &AscendConfig,
    lib_dir_env: Option<OsString>,
    home_env: Option<OsString>,
) -> (Vec<PathBuf>, Vec<PathBuf>, bool) {
    if let Some(d) = &config.lib_dir {
        return (vec![d.clone()], vec![d.clone()], false);
    }
    if let Some(v) = lib_dir_env.filter(|v| !v.is_empty()) {
        let dirs = loader::split_dirs(&v.to_string_lossy());
        return (dirs.clone(), dirs, false);
    }
    let mut homes: Vec<PathBuf> = Vec::new();
    if let Some(h) = home_env.filter(|v| !v.is_empty()) {
        homes.push(PathBuf::from(h));
    }
    homes.extend(DEFAULT_TOOLKIT_HOMES.iter().map(PathBuf::from));
    let runtime: Vec<PathBuf> = homes.iter().map(|h| h.join("lib64")).collect();
    // The driver's HAL only, then the bare name (LD_LIBRARY_PATH), where a toolkit stub may be
    // found — its null "success" is then treated as a refusal. The toolkit's stub directory is
    // never searched on purpose.
    let hal = DRIVER_LIB_DIRS.iter().map(PathBuf::from).collect();
    (runtime, hal, true)
}

fn load_acl(dirs: &[PathBuf], bare: bool) -> Result<Runtime, LoadError> {
    let lib = loader::open_first(
        "libascendcl.so",
        &loader::candidates("libascendcl.so", dirs, bare),
    )?;
    // SAFETY: each type below is the exact C signature of the named ACL function (`acl/acl_rt.h`).
    let f = unsafe {
        AclFns {
            init: lib.sym::<AclInitFn>("aclInit")?,
            finalize: lib.sym::<AclFinalizeFn>("aclFinalize")?,
            set_device: lib.sym::<SetDeviceFn>("aclrtSetDevice")?,
            reset_device: lib.sym::<SetDeviceFn>("aclrtResetDevice")?,
            malloc: lib.sym::<AclMallocFn>("aclrtMalloc")?,
            free: lib.sym::<FreeFn>("aclrtFree")?,
            memcpy: lib.sym::<AclMemcpyFn>("aclrtMemcpy")?,
            memset: lib.sym::<AclMemsetFn>("aclrtMemset")?,
        }
    };
    Ok(Runtime::Acl(lib, f))
}

fn load_rt(dirs: &[PathBuf], bare: bool) -> Result<Runtime, LoadError> {
    let lib = loader::open_first(
        "libruntime.so",
        &loader::candidates("libruntime.so", dirs, bare),
    )?;
    // SAFETY: each type below is the exact C signature of the named runtime function (`runtime/rt.h`;
    // `rtDeviceReset` is `rtError_t rtDeviceReset(int32_t devId)`).
    let f = unsafe {
        RtFns {
            set_device: lib.sym::<SetDeviceFn>("rtSetDevice")?,
            reset_device: lib.sym::<SetDeviceFn>("rtDeviceReset").ok(),
            malloc: lib.sym::<RtMallocFn>("rtMalloc")?,
            free: lib.sym::<FreeFn>("rtFree")?,
            memcpy: lib.sym::<RtMemcpyFn>("rtMemcpy")?,
            memset: lib.sym::<RtMemsetFn>("rtMemset")?,
        }
    };
    Ok(Runtime::Rt(lib, f))
}

fn load_hal(dirs: &[PathBuf], bare: bool) -> Result<Hal, LoadError> {
    let lib = loader::open_first(
        "libascend_hal.so",
        &loader::candidates("libascend_hal.so", dirs, bare),
    )?;
    // SAFETY: the types are the exact C signatures of the HAL functions (`ascend_hal.h`).
    unsafe {
        Ok(Hal {
            lib,
            register: lib.sym::<HalHostRegisterFn>("halHostRegister")?,
            unregister: lib.sym::<HalHostUnregisterFn>("halHostUnregister")?,
        })
    }
}

/// Initializes ACL for one more device (first user calls `aclInit`).
fn acl_acquire(lib: VendorLib, f: &AclFns) -> Result<(), LoadError> {
    let mut users = acl_users();
    let entry = users
        .get_or_insert_with(HashMap::new)
        .entry(lib.path)
        .or_insert((0, false));
    if entry.0 == 0 {
        // SAFETY: `aclInit(const char *configPath)` accepts NULL (no config file).
        let code = i64::from(unsafe { (f.init)(std::ptr::null()) });
        match code {
            0 => entry.1 = true,
            ACL_ERROR_REPEAT_INITIALIZE => entry.1 = false,
            _ => {
                return Err(LoadError::Init {
                    library: lib.name.to_string(),
                    call: "aclInit".to_string(),
                    code,
                    code_name: acl_code_name(code).to_string(),
                    detail: format!("opened from {}", lib.path),
                })
            }
        }
    }
    entry.0 += 1;
    Ok(())
}

/// Releases one device's use of ACL; the last user finalizes, if our `aclInit` initialized.
fn acl_release(lib: VendorLib, f: &AclFns) {
    let mut users = acl_users();
    let Some(entry) = users.as_mut().and_then(|m| m.get_mut(lib.path)) else {
        return;
    };
    entry.0 = entry.0.saturating_sub(1);
    if entry.0 == 0 && entry.1 {
        entry.1 = false;
        // SAFETY: `aclError aclFinalize(void)`; no device of this library is open any more.
        let code = i64::from(unsafe { (f.finalize)() });
        if code != 0 {
            log::warn!(
                "aclFinalize failed with code {code} ({})",
                acl_code_name(code)
            );
        }
    }
}

impl AscendDevice {
    /// Opens logical device `config.device_id`: loads the libraries (see [`AscendConfig`] and
    /// the module docs for the search order), initializes the runtime and sets the device.
    pub fn open(config: AscendConfig) -> Result<AscendDevice, LoadError> {
        let logical = i32::try_from(config.device_id).map_err(|_| LoadError::Config {
            what: "device_id".to_string(),
            detail: format!("{} does not fit int32_t", config.device_id),
        })?;
        let visible = match &config.visible_devices {
            Some(v) => Some(v.clone()),
            None => std::env::var(ENV_VISIBLE_DEVICES).ok(),
        };
        let hal_id =
            physical_device_id(config.device_id, visible.as_deref()).map_err(|detail| {
                LoadError::Config {
                    what: "device id".to_string(),
                    detail,
                }
            })?;
        let (rt_dirs, hal_dirs, bare) = search_dirs(&config);
        let runtime = match load_acl(&rt_dirs, bare) {
            Ok(r) => r,
            Err(acl_err) => load_rt(&rt_dirs, bare).map_err(|rt_err| LoadError::NoAlternative {
                what: "Ascend runtime (aclrt* in libascendcl.so, or rt* in libruntime.so)"
                    .to_string(),
                errors: vec![acl_err, rt_err],
            })?,
        };
        let hal = load_hal(&hal_dirs, bare)?;
        if let Runtime::Acl(lib, f) = &runtime {
            acl_acquire(*lib, f)?;
        }
        let dev = AscendDevice {
            config,
            logical,
            hal_id,
            runtime,
            hal,
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State {
                ledger: Ledger::new(),
                mappings: BTreeMap::new(),
                device_set: false,
                generation: 1,
            }),
        };
        // On failure `dev` drops here, which releases the ACL initialization.
        let mut st = dev.lock();
        dev.bind(&mut st, Op::Alloc).map_err(|e| LoadError::Init {
            library: dev.runtime.lib().name.to_string(),
            call: e.call.clone(),
            code: e.code,
            code_name: e.code_name.clone(),
            detail: format!("device {logical} (physical {hal_id})"),
        })?;
        drop(st);
        Ok(dev)
    }

    /// The options this device was opened with.
    pub fn config(&self) -> &AscendConfig {
        &self.config
    }

    /// The logical device id (the runtime's numbering).
    pub fn device_id(&self) -> u32 {
        self.config.device_id
    }

    /// The physical device id passed to the HAL.
    pub fn hal_device_id(&self) -> u32 {
        self.hal_id
    }

    /// The runtime API family in use.
    pub fn runtime_api(&self) -> RuntimeApi {
        self.runtime.api()
    }

    /// The path the runtime library was opened from.
    pub fn runtime_library(&self) -> &str {
        self.runtime.lib().path
    }

    /// The path the HAL was opened from.
    pub fn hal_library(&self) -> &str {
        self.hal.lib.path
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rt_err(&self, op: Op, code: i64, detail: impl Into<String>) -> DeviceError {
        DeviceError::new(op, self.runtime.call(op), code, acl_code_name(code), detail)
    }

    fn drv_err(&self, op: Op, code: i64, detail: impl Into<String>) -> DeviceError {
        DeviceError::new(op, self.runtime.call(op), code, drv_code_name(code), detail)
    }

    /// An error from the driver's own checks, made before any vendor call.
    fn check_err(&self, op: Op, code: i64, detail: impl Into<String>) -> DeviceError {
        match op {
            Op::Map | Op::Unmap => self.drv_err(op, code, detail),
            _ => self.rt_err(op, code, detail),
        }
    }

    /// Binds this device to the calling thread if it is not already (runtime calls need it).
    fn bind(&self, st: &mut State, op: Op) -> Result<(), DeviceError> {
        let me = (self.instance, st.generation);
        if st.device_set && BOUND.with(Cell::get) == me {
            return Ok(());
        }
        let code = self.runtime.set_device(self.logical);
        if code != 0 {
            return Err(DeviceError::new(
                op,
                self.runtime.set_device_name(),
                code,
                acl_code_name(code),
                format!("binding logical device {} to this thread", self.logical),
            ));
        }
        st.device_set = true;
        BOUND.with(|b| b.set(me));
        Ok(())
    }

    /// A runtime copy's status as a result.
    fn copy_result(&self, op: Op, code: i64, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        if code == 0 {
            return Ok(());
        }
        let what = match op {
            Op::H2d => "host-to-device copy",
            Op::Memset => "device memset",
            _ => "device-to-host copy",
        };
        Err(self.rt_err(op, code, what).at(addr).sized(bytes))
    }

    /// The error of an injected fault: it fails the call before the vendor function.
    fn injected(&self, op: Op) -> impl FnOnce(i64) -> DeviceError + '_ {
        move |code| self.check_err(op, code, "injected fault")
    }

    /// The live allocation `(base, size)` containing `[addr, addr + bytes)`, else an error.
    fn containing(
        &self,
        st: &State,
        op: Op,
        addr: u64,
        bytes: u64,
    ) -> Result<(u64, u64), DeviceError> {
        st.ledger
            .containing(addr, bytes)
            .map(|(b, s)| (b.0, s))
            .ok_or_else(|| {
                let code = match op {
                    Op::Map | Op::Unmap => codes::BAD_ADDRESS,
                    _ => ACL_ERROR_INVALID_PARAM,
                };
                self.check_err(
                    op,
                    code,
                    "no live allocation contains this range (unknown address, freed, or the \
                     range runs past its allocation); no vendor call made",
                )
                .at(addr)
                .sized(bytes)
            })
    }

    fn mappings_in(st: &State, base: u64, size: u64) -> usize {
        st.mappings.range(base..base.saturating_add(size)).count()
    }

    fn do_alloc(&self, st: &mut State, bytes: u64) -> Result<DevPtr, DeviceError> {
        if bytes == 0 {
            return Err(self
                .rt_err(
                    Op::Alloc,
                    ACL_ERROR_INVALID_PARAM,
                    "zero-byte allocation (the runtime rejects it); no vendor call made",
                )
                .sized(0));
        }
        if usize::try_from(bytes).is_err() {
            return Err(self
                .rt_err(Op::Alloc, ACL_ERROR_INVALID_PARAM, "size exceeds size_t")
                .sized(bytes));
        }
        self.bind(st, Op::Alloc)?;
        let (code, p) = self.runtime.malloc(bytes, self.config.malloc_policy);
        if code != 0 {
            return Err(self
                .rt_err(
                    Op::Alloc,
                    code,
                    format!("policy {:?}", self.config.malloc_policy),
                )
                .sized(bytes));
        }
        if p.is_null() {
            return Err(self
                .rt_err(
                    Op::Alloc,
                    code,
                    "reported success but returned a null pointer",
                )
                .sized(bytes));
        }
        let ptr = DevPtr(p as u64);
        st.ledger.on_alloc(ptr, bytes);
        Ok(ptr)
    }

    fn do_free(&self, st: &mut State, ptr: DevPtr) -> Result<(), DeviceError> {
        let Some(size) = st.ledger.live_size(ptr) else {
            return Err(self
                .rt_err(
                    Op::Free,
                    ACL_ERROR_INVALID_PARAM,
                    "not a live allocation (unknown address or already freed); no vendor call made",
                )
                .at(ptr.0));
        };
        let mapped = Self::mappings_in(st, ptr.0, size);
        if mapped > 0 {
            return Err(self
                .drv_err(
                    Op::Free,
                    codes::BUSY,
                    format!(
                        "allocation still has {mapped} host mapping(s); unmap first \
                         (unregister must precede free); no vendor call made"
                    ),
                )
                .at(ptr.0)
                .sized(size));
        }
        self.bind(st, Op::Free)?;
        let code = self.runtime.free(ptr.0);
        if code != 0 {
            return Err(self
                .rt_err(Op::Free, code, "allocation left live")
                .at(ptr.0)
                .sized(size));
        }
        st.ledger.on_free(ptr);
        Ok(())
    }

    fn do_map(&self, st: &mut State, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError> {
        if bytes == 0 {
            return Err(self
                .drv_err(Op::Map, codes::INVALID_VALUE, "zero-byte mapping")
                .at(ptr.0));
        }
        self.containing(st, Op::Map, ptr.0, bytes)?;
        let end = ptr.0 + bytes;
        let overlaps = st
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.bytes > ptr.0);
        if overlaps {
            return Err(self
                .drv_err(
                    Op::Map,
                    codes::PARA_ERROR,
                    "range is already mapped (a mapping leaked?); no vendor call made",
                )
                .at(ptr.0)
                .sized(bytes));
        }
        let len = usize::try_from(bytes).map_err(|_| {
            self.drv_err(
                Op::Map,
                codes::INVALID_VALUE,
                "size exceeds the address space",
            )
            .at(ptr.0)
            .sized(bytes)
        })?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `halHostRegister(void *srcPtr, UINT64 size, UINT32 flag, UINT32 devid,
        // void **dstPtr)`: `ptr` is a device address inside a live allocation (checked above),
        // which the HAL does not dereference on the host; `&mut host` is valid for the
        // pointer-sized write of the out-parameter.
        let code = i64::from(unsafe {
            (self.hal.register)(
                ptr.0 as *mut c_void,
                bytes,
                DEV_SVM_MAP_HOST,
                self.hal_id,
                &mut host,
            )
        });
        if code != 0 {
            st.ledger.on_map(false);
            return Ok(MapGrant::Refused {
                code,
                reason: format!(
                    "halHostRegister returned {code} ({}) for {bytes} bytes at {ptr} on device {}",
                    drv_code_name(code),
                    self.hal_id
                ),
            });
        }
        let Some(host) = NonNull::new(host.cast::<u8>()) else {
            st.ledger.on_map(false);
            return Ok(MapGrant::Refused {
                code: 0,
                reason: format!(
                    "halHostRegister reported success but returned no host pointer (a stub HAL? \
                     loaded from {}); treated as a refusal",
                    self.hal.lib.path
                ),
            });
        };
        // SAFETY: the HAL keeps the mapping valid for `len` bytes until `halHostUnregister`,
        // and this driver revokes the `HostMem` (in `unmap_host` / `close`) before that call.
        let mem = Arc::new(unsafe { HostMem::foreign(host, len) });
        st.mappings.insert(
            ptr.0,
            MapEntry {
                bytes,
                mem: mem.clone(),
            },
        );
        st.ledger.on_map(true);
        Ok(MapGrant::Mapped { mem, offset: 0 })
    }

    /// Revokes and unregisters the mapping at `start`; on success forgets it.
    fn do_unmap(&self, st: &mut State, start: u64) -> Result<u64, DeviceError> {
        let Some(entry) = st.mappings.get(&start) else {
            return Err(self
                .drv_err(
                    Op::Unmap,
                    codes::NOT_EXIST,
                    "no host mapping starts at this address; no vendor call made",
                )
                .at(start));
        };
        let bytes = entry.bytes;
        // Accesses are blocked while the HAL tears the mapping down; the host side is revoked
        // only when it did. A refused unregister leaves a mapping the HAL still holds: it stays
        // usable, and its allocation stays live until a retry unregisters it.
        let hal = (self.hal.unregister, self.hal_id);
        let r = entry.mem.revoke_with(|| {
            // SAFETY: `halHostUnregister(void *srcPtr, UINT32 devid)` with the device address a
            // successful `halHostRegister` was given; no access runs while it does.
            let code = i64::from(unsafe { (hal.0)(start as *mut c_void, hal.1) });
            if code == 0 {
                Ok(())
            } else {
                Err(code)
            }
        });
        if let Err(code) = r {
            return Err(self
                .drv_err(
                    Op::Unmap,
                    code,
                    "mapping kept (still usable); its allocation stays live until it is unregistered",
                )
                .at(start)
                .sized(bytes));
        }
        st.mappings.remove(&start);
        st.ledger.on_unmap();
        Ok(bytes)
    }
}

impl Device for AscendDevice {
    fn platform(&self) -> &'static str {
        "ascend"
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        traced(&mut *self.lock(), op, 0, bytes, self.injected(op), |st| {
            self.do_alloc(st, bytes)
        })
    }

    fn free(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let mut st = self.lock();
        let size = st.ledger.live_size(ptr).unwrap_or(0);
        let op = Op::Free;
        traced(&mut *st, op, ptr.0, size, self.injected(op), |st| {
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
            self.injected(op),
            |st| {
                let (base, size) = self.containing(st, op, dst.0, bytes)?;
                if bytes == 0 {
                    return Ok(());
                }
                self.bind(st, op)?;
                let dest_max = base + size - dst.0;
                // SAFETY: `src` is valid for `bytes` reads; `[dst, dst + bytes)` lies inside a live
                // allocation with `dest_max` bytes from `dst` (checked above).
                let code = unsafe {
                    self.runtime.memcpy(
                        dst.0 as *mut c_void,
                        dest_max,
                        src.as_ptr().cast(),
                        bytes,
                        MEMCPY_HOST_TO_DEVICE,
                    )
                };
                self.copy_result(op, code, dst.0, bytes)
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
            self.injected(op),
            |st| {
                self.containing(st, op, src.0, bytes)?;
                if bytes == 0 {
                    return Ok(());
                }
                self.bind(st, op)?;
                // SAFETY: `dst` is valid for `bytes` writes (and is its whole capacity);
                // `[src, src + bytes)` lies inside a live allocation (checked above).
                let code = unsafe {
                    self.runtime.memcpy(
                        dst.as_mut_ptr().cast(),
                        bytes,
                        src.0 as *const c_void,
                        bytes,
                        MEMCPY_DEVICE_TO_HOST,
                    )
                };
                self.copy_result(op, code, src.0, bytes)
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
            self.injected(op),
            |st| {
                let (base, size) = self.containing(st, op, dst.0, bytes)?;
                if bytes == 0 {
                    return Ok(());
                }
                self.bind(st, op)?;
                let dest_max = base + size - dst.0;
                // SAFETY: `[dst, dst + bytes)` lies inside a live allocation with `dest_max` bytes
                // from `dst` (checked above).
                let code = unsafe {
                    self.runtime
                        .memset(dst.0 as *mut c_void, dest_max, value, bytes)
                };
                self.copy_result(op, code, dst.0, bytes)
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
            self.injected(op),
            |st| self.do_map(st, ptr, bytes),
        )
    }

    fn unmap_host(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let mut st = self.lock();
        let bytes = st.mappings.get(&ptr.0).map_or(0, |m| m.bytes);
        let op = Op::Unmap;
        traced(&mut *st, op, ptr.0, bytes, self.injected(op), |st| {
            self.do_unmap(st, ptr.0).map(|_| ())
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
        let default = match op {
            Op::Map | Op::Unmap => codes::INNER_ERR,
            _ => ACL_ERROR_RT_INTERNAL_ERROR,
        };
        self.lock().ledger.inject(op, nth, code.unwrap_or(default))
    }

    fn clear_faults(&self) {
        self.lock().ledger.clear_faults();
    }

    fn close(&self) -> CloseReport {
        let mut st = self.lock();
        st.ledger.clear_faults();
        let mut report = CloseReport::default();
        // 1. Every mapping goes first: unregister before free, always.
        let starts: Vec<u64> = st.mappings.keys().copied().collect();
        for start in starts {
            report.leaked_mappings += 1;
            let r = self.do_unmap(&mut st, start);
            let bytes = r.as_ref().copied().unwrap_or(0);
            if let Err(e) = st.ledger.logged(Op::Unmap, start, bytes, r) {
                report.errors.push(e);
            }
        }
        // 2. Then every allocation whose mappings are gone.
        for (ptr, size) in st.ledger.live_allocations() {
            report.leaked_allocations += 1;
            report.leaked_bytes += size;
            let r = self.do_free(&mut st, ptr);
            if let Err(e) = st.ledger.logged(Op::Free, ptr.0, size, r) {
                report.errors.push(e);
            }
        }
        // 3. Release the device; the next call (if any) binds it again.
        if st.device_set {
            let code = self.runtime.reset_device(self.logical);
            if code != 0 {
                report.errors.push(DeviceError::new(
                    Op::Free,
                    self.runtime.reset_device_name(),
                    code,
                    acl_code_name(code),
                    format!("resetting logical device {} on close", self.logical),
                ));
            }
            st.device_set = false;
            st.generation += 1;
        }
        if report.leaked_allocations > 0 || report.leaked_mappings > 0 {
            log::warn!(
                "ascend device {} closed with {} live allocation(s) ({} bytes) and {} mapping(s); \
                 released them ({} error(s))",
                self.logical,
                report.leaked_allocations,
                report.leaked_bytes,
                report.leaked_mappings,
                report.errors.len()
            );
        }
        report
    }
}

impl Drop for AscendDevice {
    /// Releases whatever is still live (mappings before allocations), resets the device and,
    /// for the last device on this runtime, finalizes ACL. Never panics: errors are logged.
    fn drop(&mut self) {
        let report = self.close();
        for e in &report.errors {
            log::warn!("ascend device {} drop: {e}", self.logical);
        }
        if let Runtime::Acl(lib, f) = &self.runtime {
            acl_release(*lib, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_translate_through_visible_devices() {
        assert_eq!(physical_device_id(3, None), Ok(3));
        assert_eq!(physical_device_id(3, Some("")), Ok(3));
        assert_eq!(physical_device_id(3, Some("  ")), Ok(3));
        assert_eq!(physical_device_id(0, Some("4,5,6")), Ok(4));
        assert_eq!(physical_device_id(2, Some(" 4, 5 ,6 ")), Ok(6));
        let e = physical_device_id(3, Some("4,5,6")).unwrap_err();
        assert!(e.contains("lists 3 device(s)"), "{e}");
        let e = physical_device_id(0, Some("4,x")).unwrap_err();
        assert!(e.contains("\"x\" is not a device id"), "{e}");
        let e = physical_device_id(0, Some("4,4")).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn code_names_follow_the_vendor_tables() {
        assert_eq!(acl_code_name(507_000), "ACL_ERROR_RT_INTERNAL_ERROR");
        assert_eq!(acl_code_name(207_018), "ACL_ERROR_RT_DEVICE_OOM");
        assert_eq!(acl_code_name(100_000), "ACL_ERROR_INVALID_PARAM");
        assert_eq!(acl_code_name(1), "UNKNOWN");
        assert_eq!(drv_code_name(0xfffe), "DRV_ERROR_NOT_SUPPORT");
        assert_eq!(drv_code_name(8), "DRV_ERROR_PARA_ERROR");
    }

    #[test]
    fn malloc_policies_encode_for_both_runtimes() {
        assert_eq!(MallocPolicy::default(), MallocPolicy::HugeFirst);
        assert_eq!(
            [
                MallocPolicy::HugeFirst.acl(),
                MallocPolicy::HugeOnly.acl(),
                MallocPolicy::NormalOnly.acl()
            ],
            [0, 1, 2]
        );
        assert_eq!(MallocPolicy::HugeOnly.rt_mem_type(), 0x802);
        assert_eq!(
            MallocPolicy::parse("normal_only"),
            Some(MallocPolicy::NormalOnly)
        );
        assert_eq!(MallocPolicy::parse("x"), None);
    }

    #[test]
    fn search_order_prefers_overrides_then_toolkit_and_driver_dirs() {
        let cfg = AscendConfig::default();
        let (rt, hal, bare) = search_dirs_from(
            &AscendConfig {
                lib_dir: Some(PathBuf::from("/cfg")),
                ..AscendConfig::default()
            },
            Some("/env".into()),
            None,
        );
        assert_eq!(
            (rt, hal, bare),
            (
                vec![PathBuf::from("/cfg")],
                vec![PathBuf::from("/cfg")],
                false
            )
        );
        let (rt, hal, bare) = search_dirs_from(&cfg, Some("/a:/b".into()), Some("/home".into()));
        assert_eq!(rt, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!((hal.len(), bare), (2, false));
        let (rt, hal, bare) = search_dirs_from(&cfg, Some("".into()), Some("/opt/cann".into()));
        assert_eq!(
            rt,
            [
                PathBuf::from("/opt/cann/lib64"),
                PathBuf::from("/usr/local/Ascend/ascend-toolkit/latest/lib64"),
                PathBuf::from("/usr/local/Ascend/cann/lib64"),
            ]
        );
        assert_eq!(
            hal[0],
            PathBuf::from("/usr/local/Ascend/driver/lib64/driver")
        );
        assert!(bare);
        let (rt, _, _) = search_dirs_from(&cfg, None, None);
        assert_eq!(rt.len(), 2);
    }

    #[test]
    fn a_missing_lib_dir_names_every_library_and_path() {
        let dir = PathBuf::from("/nonexistent/simpler-ascend");
        let e = AscendDevice::open(AscendConfig {
            lib_dir: Some(dir),
            visible_devices: Some(String::new()),
            ..AscendConfig::default()
        })
        .unwrap_err();
        let msg = e.to_string();
        for needle in [
            "libascendcl.so",
            "libruntime.so",
            "/nonexistent/simpler-ascend/libascendcl.so",
            "/nonexistent/simpler-ascend/libruntime.so",
        ] {
            assert!(msg.contains(needle), "{needle} missing from: {msg}");
        }
    }
}
