//! Finding and loading the CANN libraries, and the function tables the driver calls through
//! (the calls themselves are `calls`).
//!
//! Order and reuse: the HAL is loaded before the runtime (the runtime resolves the HAL it was
//! built against by name, so it must find ours already loaded, not a second copy), and a library
//! the process already loaded (a framework such as torch_npu got there first) is reused rather
//! than loaded again from another path (`loader::open_first`). The runtime is the `acl*` family
//! of `libascendcl.so`, falling back to the older `rt*` family of `libruntime.so`.

use std::ffi::{c_int, OsString};
use std::path::PathBuf;

use super::sys::*;
use crate::loader::{self, vendor_fns, LoadError, VendorLib};

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
