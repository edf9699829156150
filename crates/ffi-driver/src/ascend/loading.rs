//! Finding and loading the CANN libraries, and the function tables the driver calls through.
//!
//! Order and reuse: the HAL is loaded before the runtime (the runtime resolves the HAL it was
//! built against by name, so it must find ours already loaded, not a second copy), and a library
//! the process already loaded (a framework such as torch_npu got there first) is reused rather
//! than loaded again from another path (`loader::open_first`). The runtime is the `acl*` family
//! of `libascendcl.so`, falling back to the older `rt*` family of `libruntime.so`.

use std::ffi::{c_int, c_void, OsString};
use std::path::PathBuf;

use super::sys::*;
use crate::loader::{self, vendor_fns, LoadError, VendorLib};
use crate::Status;

/// Environment override: a directory (or `:`-separated list) holding `libascendcl.so` /
/// `libruntime.so` and `libascend_hal.so`. When set, only these directories are searched.
pub const ENV_LIB_DIR: &str = "SIMPLER_ASCEND_LIB_DIR";
/// The CANN toolkit root (its `lib64` holds the runtime).
pub const ENV_ASCEND_HOME: &str = "ASCEND_HOME_PATH";
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

/// What a missing-library error suggests.
const SEARCH_HINT: &str = "set SIMPLER_ASCEND_LIB_DIR to the directory holding the libraries, or \
     ASCEND_HOME_PATH to the CANN toolkit root (sourcing the toolkit's set_env.sh does that); \
     bare names are searched on LD_LIBRARY_PATH";

/// The driver's folder of common libraries (the HAL's dependencies), which `set_env.sh` puts on
/// `LD_LIBRARY_PATH` with the toolkit's and the HAL's folders.
const DRIVER_COMMON_DIR: &str = "/usr/local/Ascend/driver/lib64/common";

vendor_fns! {
    /// The `acl*` runtime (`libascendcl.so`, `acl/acl_rt.h`).
    pub(crate) struct AclFns, names AclNames {
        init: "aclInit" => AclInitFn,
        set_device: "aclrtSetDevice" => DeviceFn,
        reset_device: "aclrtResetDevice" => DeviceFn,
        get_context: "aclrtGetCurrentContext" => GetContextFn,
        set_context: "aclrtSetCurrentContext" => SetContextFn,
        malloc: "aclrtMalloc" => AclMallocFn,
        free: "aclrtFree" => FreeFn,
        memcpy: "aclrtMemcpy" => AclMemcpyFn,
        memset: "aclrtMemset" => AclMemsetFn,
    }
    optional {
        finalize_reference: "aclFinalizeReference" => AclFinalizeReferenceFn,
        logic_id: "aclrtGetLogicDevIdByUserDevId" => LogicIdFn,
    }
}

vendor_fns! {
    /// The older `rt*` runtime (`libruntime.so`, `runtime/rt.h`).
    pub(crate) struct RtFns, names RtNames {
        set_device: "rtSetDevice" => DeviceFn,
        reset_device: "rtDeviceReset" => DeviceFn,
        get_context: "rtCtxGetCurrent" => GetContextFn,
        set_context: "rtCtxSetCurrent" => SetContextFn,
        malloc: "rtMalloc" => RtMallocFn,
        free: "rtFree" => FreeFn,
        memcpy: "rtMemcpy" => RtMemcpyFn,
        memset: "rtMemset" => RtMemsetFn,
    }
    optional {
        logic_id: "rtGetLogicDevIdByUserDevId" => LogicIdFn,
    }
}

vendor_fns! {
    /// The driver's HAL (`libascend_hal.so`, `ascend_hal.h`).
    pub(crate) struct HalFns, names HalNames {
        register: "halHostRegister" => HalHostRegisterFn,
        unregister: "halHostUnregister" => HalHostUnregisterFn,
    }
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
    pub(crate) fn acl(self) -> c_int {
        match self {
            MallocPolicy::HugeFirst => 0,
            MallocPolicy::HugeOnly => 1,
            MallocPolicy::NormalOnly => 2,
        }
    }

    /// `rtMalloc` memory type: RT_MEMORY_HBM | page policy.
    pub(crate) fn rt_mem_type(self) -> u32 {
        RT_MEMORY_HBM
            | match self {
                MallocPolicy::HugeFirst => 0x400,
                MallocPolicy::HugeOnly => 0x800,
                MallocPolicy::NormalOnly => 0x1000,
            }
    }
}

/// Which runtime API family the device uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeApi {
    /// `aclInit` / `aclrtSetDevice` / `aclrtMalloc` / ... (libascendcl.so).
    Acl,
    /// `rtSetDevice` / `rtMalloc` / ... (libruntime.so), the fallback.
    Rt,
}

/// The vendor names of the runtime calls the driver makes, for the family in use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Calls {
    pub set_device: &'static str,
    pub reset_device: &'static str,
    pub get_context: &'static str,
    pub set_context: &'static str,
    pub logic_id: &'static str,
    pub malloc: &'static str,
    pub free: &'static str,
    pub memcpy: &'static str,
    pub memset: &'static str,
}

/// The loaded runtime: its library and function table.
#[derive(Clone, Copy)]
pub(crate) enum Runtime {
    Acl(VendorLib, AclFns),
    Rt(VendorLib, RtFns),
}

/// The loaded HAL.
#[derive(Clone, Copy)]
pub(crate) struct Hal {
    pub lib: VendorLib,
    pub f: HalFns,
}

impl Runtime {
    pub fn api(&self) -> RuntimeApi {
        match self {
            Runtime::Acl(..) => RuntimeApi::Acl,
            Runtime::Rt(..) => RuntimeApi::Rt,
        }
    }

    pub fn lib(&self) -> VendorLib {
        match self {
            Runtime::Acl(l, _) | Runtime::Rt(l, _) => *l,
        }
    }

    pub fn calls(&self) -> Calls {
        match self {
            Runtime::Acl(..) => {
                let n = AclFns::NAMES;
                Calls {
                    set_device: n.set_device,
                    reset_device: n.reset_device,
                    get_context: n.get_context,
                    set_context: n.set_context,
                    logic_id: n.logic_id,
                    malloc: n.malloc,
                    free: n.free,
                    memcpy: n.memcpy,
                    memset: n.memset,
                }
            }
            Runtime::Rt(..) => {
                let n = RtFns::NAMES;
                Calls {
                    set_device: n.set_device,
                    reset_device: n.reset_device,
                    get_context: n.get_context,
                    set_context: n.set_context,
                    logic_id: n.logic_id,
                    malloc: n.malloc,
                    free: n.free,
                    memcpy: n.memcpy,
                    memset: n.memset,
                }
            }
        }
    }

    /// `aclrtSetDevice` / `rtSetDevice`: one more reference to the device's default context,
    /// which becomes the calling thread's current context.
    pub fn set_device(&self, id: i32) -> AclStatus {
        let f = match self {
            Runtime::Acl(_, f) => f.set_device,
            Runtime::Rt(_, f) => f.set_device,
        };
        // SAFETY: `int32_t (acl)rtSetDevice(int32_t)`; takes no pointers.
        AclStatus(unsafe { f(id) })
    }

    /// `aclrtResetDevice` / `rtDeviceReset`: drops one reference.
    pub fn reset_device(&self, id: i32) -> AclStatus {
        let f = match self {
            Runtime::Acl(_, f) => f.reset_device,
            Runtime::Rt(_, f) => f.reset_device,
        };
        // SAFETY: `int32_t aclrtResetDevice(int32_t)` / `rtDeviceReset(int32_t)`; no pointers.
        AclStatus(unsafe { f(id) })
    }

    /// The calling thread's current context; `None` when it has none (CONTEXT_NULL, or a null
    /// handle).
    pub fn current_context(&self) -> Result<Option<Context>, Status> {
        let f = match self {
            Runtime::Acl(_, f) => f.get_context,
            Runtime::Rt(_, f) => f.get_context,
        };
        let mut ctx: Context = std::ptr::null_mut();
        // SAFETY: `&mut ctx` is valid for the pointer-sized write of the out-parameter.
        match AclStatus(unsafe { f(&mut ctx) }).result() {
            Ok(()) => Ok((!ctx.is_null()).then_some(ctx)),
            Err(s) if s.code == ACL_ERROR_RT_CONTEXT_NULL => Ok(None),
            Err(s) => Err(s),
        }
    }

    /// Makes `ctx` the calling thread's current context (not reference-counted).
    pub fn set_context(&self, ctx: Context) -> AclStatus {
        let f = match self {
            Runtime::Acl(_, f) => f.set_context,
            Runtime::Rt(_, f) => f.set_context,
        };
        // SAFETY: `ctx` is a context handle the runtime gave us (the device's default context,
        // alive while we hold its device reference, or the caller's own current context).
        AclStatus(unsafe { f(ctx) })
    }

    /// The runtime's logical id of user device `user`, where it exports the translation:
    /// `None` when it does not (or answers that it is not supported).
    pub fn logic_id(&self, user: i32) -> Option<Result<i32, Status>> {
        let f = match self {
            Runtime::Acl(_, f) => f.logic_id,
            Runtime::Rt(_, f) => f.logic_id,
        }?;
        let mut logic: i32 = -1;
        // SAFETY: `&mut logic` is valid for the `int32_t` the call writes.
        match AclStatus(unsafe { f(user, &mut logic) }).result() {
            Ok(()) => Some(Ok(logic)),
            Err(s)
                if s.code == ACL_ERROR_API_NOT_SUPPORT
                    || s.code == ACL_ERROR_RT_FEATURE_NOT_SUPPORT =>
            {
                None
            }
            Err(s) => Some(Err(s)),
        }
    }

    /// Allocates `bytes` (> 0, fits `usize`); the status and the pointer written.
    pub fn malloc(&self, bytes: u64, policy: MallocPolicy) -> (AclStatus, *mut c_void) {
        let mut p: *mut c_void = std::ptr::null_mut();
        let status = match self {
            Runtime::Acl(_, f) => {
                let size = usize::try_from(bytes).unwrap_or(usize::MAX);
                // SAFETY: `&mut p` is valid for the pointer-sized write the call makes; the
                // size and policy are plain values.
                AclStatus(unsafe { (f.malloc)(&mut p, size, policy.acl()) })
            }
            Runtime::Rt(_, f) => {
                // SAFETY: as above; module id 0 (the application).
                AclStatus(unsafe { (f.malloc)(&mut p, bytes, policy.rt_mem_type(), 0) })
            }
        };
        (status, p)
    }

    /// Frees the allocation at `ptr`.
    pub fn free(&self, ptr: u64) -> AclStatus {
        let f = match self {
            Runtime::Acl(_, f) => f.free,
            Runtime::Rt(_, f) => f.free,
        };
        // SAFETY: `ptr` is a live allocation of this runtime (checked against the ledger by the
        // caller) with no host mapping left; the runtime does not dereference it on the host.
        AclStatus(unsafe { f(ptr as *mut c_void) })
    }

    /// `aclrtMemcpy` / `rtMemcpy`.
    ///
    /// # Safety
    /// The host side of the copy (`dst` for D2H, `src` for H2D) must be valid for `count` bytes,
    /// and the device side must lie inside a live allocation with `dest_max` bytes from `dst`
    /// (for H2D).
    pub unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        dest_max: u64,
        src: *const c_void,
        count: u64,
        kind: c_int,
    ) -> AclStatus {
        match self {
            Runtime::Acl(_, f) => {
                let (Ok(max), Ok(n)) = (usize::try_from(dest_max), usize::try_from(count)) else {
                    return AclStatus(ACL_ERROR_INVALID_PARAM as c_int);
                };
                // SAFETY: per this function's contract.
                AclStatus(unsafe { (f.memcpy)(dst, max, src, n, kind) })
            }
            // SAFETY: per this function's contract.
            Runtime::Rt(_, f) => AclStatus(unsafe { (f.memcpy)(dst, dest_max, src, count, kind) }),
        }
    }

    /// `aclrtMemset` / `rtMemset` of `count` bytes at `dst` to `value`.
    ///
    /// # Safety
    /// `[dst, dst + count)` must lie inside a live allocation with `dest_max` bytes from `dst`.
    pub unsafe fn memset(
        &self,
        dst: *mut c_void,
        dest_max: u64,
        value: u8,
        count: u64,
    ) -> AclStatus {
        match self {
            Runtime::Acl(_, f) => {
                let (Ok(max), Ok(n)) = (usize::try_from(dest_max), usize::try_from(count)) else {
                    return AclStatus(ACL_ERROR_INVALID_PARAM as c_int);
                };
                // SAFETY: per this function's contract.
                AclStatus(unsafe { (f.memset)(dst, max, i32::from(value), n) })
            }
            Runtime::Rt(_, f) => {
                // SAFETY: per this function's contract.
                AclStatus(unsafe { (f.memset)(dst, dest_max, u32::from(value), count) })
            }
        }
    }
}

/// Where to look: runtime directories, HAL directories, and whether to fall back to the bare
/// name (the loader's own search, `LD_LIBRARY_PATH`).
pub(crate) struct SearchDirs {
    pub runtime: Vec<PathBuf>,
    pub hal: Vec<PathBuf>,
    pub bare: bool,
}

/// The search directories: `lib_dir` (from the config) alone when given, else
/// `SIMPLER_ASCEND_LIB_DIR` alone when set, else the toolkit roots and the driver's directories.
pub(crate) fn search_dirs(lib_dir: Option<&PathBuf>) -> SearchDirs {
    search_dirs_from(
        lib_dir,
        std::env::var_os(ENV_LIB_DIR),
        std::env::var_os(ENV_ASCEND_HOME),
    )
}

/// [`search_dirs`] with the environment passed in (`SIMPLER_ASCEND_LIB_DIR`, `ASCEND_HOME_PATH`).
pub(crate) fn search_dirs_from(
    lib_dir: Option<&PathBuf>,
    lib_dir_env: Option<OsString>,
    home_env: Option<OsString>,
) -> SearchDirs {
    if let Some(d) = lib_dir {
        return SearchDirs {
            runtime: vec![d.clone()],
            hal: vec![d.clone()],
            bare: false,
        };
    }
    if let Some(v) = lib_dir_env.filter(|v| !v.is_empty()) {
        let dirs = loader::split_dirs(&v.to_string_lossy());
        return SearchDirs {
            runtime: dirs.clone(),
            hal: dirs,
            bare: false,
        };
    }
    let mut homes: Vec<PathBuf> = Vec::new();
    if let Some(h) = home_env.filter(|v| !v.is_empty()) {
        homes.push(PathBuf::from(h));
    }
    homes.extend(DEFAULT_TOOLKIT_HOMES.iter().map(PathBuf::from));
    // The driver's HAL only, then the bare name, where a toolkit stub may be found — its null
    // "success" is then treated as a refusal. The toolkit's stub directory is never searched
    // on purpose.
    SearchDirs {
        runtime: homes.iter().map(|h| h.join("lib64")).collect(),
        hal: DRIVER_LIB_DIRS.iter().map(PathBuf::from).collect(),
        bare: true,
    }
}

/// Opens `file` from `dirs`; a missing dependency is preloaded from the folders `set_env.sh`
/// would have put on `LD_LIBRARY_PATH` (`deps`).
fn open(
    file: &'static str,
    dirs: &[PathBuf],
    bare: bool,
    deps: &[PathBuf],
) -> Result<VendorLib, LoadError> {
    let paths = loader::candidates(file, dirs, bare);
    loader::open_first_with(file, &paths, SEARCH_HINT, deps)
}

/// Loads the HAL, then the runtime (`acl*`, else `rt*`).
pub(crate) fn load(dirs: &SearchDirs) -> Result<(Hal, Runtime), LoadError> {
    let mut deps: Vec<PathBuf> = dirs.runtime.iter().chain(&dirs.hal).cloned().collect();
    // Pinned folders (the config's or SIMPLER_ASCEND_LIB_DIR) are the only ones searched.
    if dirs.bare {
        deps.push(PathBuf::from(DRIVER_COMMON_DIR));
    }
    let open = |file, dirs: &[PathBuf], bare| open(file, dirs, bare, &deps);
    let lib = open("libascend_hal.so", &dirs.hal, dirs.bare)?;
    // SAFETY: the table's types are the exact `ascend_hal.h` signatures.
    let f = unsafe { HalFns::load(&lib) }?;
    let hal = Hal { lib, f };
    let acl = open("libascendcl.so", &dirs.runtime, dirs.bare).and_then(|lib| {
        // SAFETY: the table's types are the exact `acl/acl_rt.h` signatures.
        Ok(Runtime::Acl(lib, unsafe { AclFns::load(&lib) }?))
    });
    let runtime = match acl {
        Ok(r) => r,
        Err(acl_err) => open("libruntime.so", &dirs.runtime, dirs.bare)
            .and_then(|lib| {
                // SAFETY: the table's types are the exact `runtime/rt.h` signatures.
                Ok(Runtime::Rt(lib, unsafe { RtFns::load(&lib) }?))
            })
            .map_err(|rt_err| LoadError::NoAlternative {
                what: "Ascend runtime (aclrt* in libascendcl.so, or rt* in libruntime.so)"
                    .to_string(),
                errors: vec![acl_err, rt_err],
            })?,
    };
    Ok((hal, runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let cfg = PathBuf::from("/cfg");
        let d = search_dirs_from(Some(&cfg), Some("/env".into()), None);
        assert_eq!(
            (d.runtime, d.hal, d.bare),
            (vec![cfg.clone()], vec![cfg], false)
        );
        let d = search_dirs_from(None, Some("/a:/b".into()), Some("/home".into()));
        assert_eq!(d.runtime, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!((d.hal.len(), d.bare), (2, false));
        let d = search_dirs_from(None, Some("".into()), Some("/opt/cann".into()));
        assert_eq!(
            d.runtime,
            [
                PathBuf::from("/opt/cann/lib64"),
                PathBuf::from("/usr/local/Ascend/ascend-toolkit/latest/lib64"),
                PathBuf::from("/usr/local/Ascend/cann/lib64"),
            ]
        );
        assert_eq!(
            d.hal[0],
            PathBuf::from("/usr/local/Ascend/driver/lib64/driver")
        );
        assert!(d.bare);
        assert_eq!(search_dirs_from(None, None, None).runtime.len(), 2);
    }

    #[test]
    fn the_tables_name_every_symbol_once() {
        assert!(AclFns::SYMBOLS.contains(&"aclFinalizeReference"));
        assert_eq!(AclFns::NAMES.malloc, "aclrtMalloc");
        assert_eq!(RtFns::NAMES.reset_device, "rtDeviceReset");
        assert_eq!(HalFns::SYMBOLS, ["halHostRegister", "halHostUnregister"]);
    }
}
