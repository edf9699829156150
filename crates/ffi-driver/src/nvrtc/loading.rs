//! Finding `libnvrtc` and loading its function table.
//!
//! Every NVRTC on the machine is a candidate, found in this order (the order only breaks ties:
//! [`super::choice`] keeps the newest one the driver can use):
//! 1. the copies of `libnvrtc.so.13`, `libnvrtc.so.12` or `libnvrtc.so` the process has already
//!    loaded (a framework got there first; matched by soname);
//! 2. the folders the caller passes (the Python layer passes the `nvidia-cuda-nvrtc` wheel
//!    folders it finds under site-packages, [`WHEEL_LIB_SUBDIRS`]);
//! 3. `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`, then [`DEFAULT_TOOLKIT_LIB_DIR`];
//! 4. the bare names, for the dynamic loader's own search (`LD_LIBRARY_PATH`, `ldconfig`).
//!
//! In every folder the names are tried newest first: [`NVRTC_LIB_NAMES`]. `SIMPLER_NVRTC_LIB`
//! (a path, or a name for the loader's search path) replaces the whole search: when it is set,
//! it is the only candidate, so a wrong override is reported, never silently replaced by
//! another copy. Two candidates that are the same file (a symlink, or a copy already loaded)
//! count once.

use std::ffi::OsString;
use std::path::PathBuf;

use super::sys::*;
use crate::loader::{self, vendor_fns, LoadAttempt, LoadError, VendorLib};

/// Environment override: the path (or name) of the NVRTC library.
pub const ENV_NVRTC_LIB: &str = "SIMPLER_NVRTC_LIB";
/// The file names tried in every folder, and bare at the end, in this order.
pub const NVRTC_LIB_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
/// Where the `nvidia-cuda-nvrtc` wheels put the library, relative to site-packages: CUDA 13
/// (`nvidia-cuda-nvrtc` 13.x) and CUDA 12 (`nvidia-cuda-nvrtc-cu12`).
pub const WHEEL_LIB_SUBDIRS: [&str; 2] = ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"];
/// CUDA toolkit roots named by the environment, in this order (their `lib64` is searched).
pub const TOOLKIT_ENVS: [&str; 2] = ["CUDA_HOME", "CUDA_PATH"];
/// The toolkit's usual library folder, searched after the environment's.
pub const DEFAULT_TOOLKIT_LIB_DIR: &str = "/usr/local/cuda/lib64";

/// How the library is named in "cannot open" errors.
pub(crate) const LIBRARY: &str = "NVRTC (libnvrtc.so.13, libnvrtc.so.12 or libnvrtc.so)";
/// The name the final search registers under (the common unversioned name).
const SEARCH_NAME: &str = "libnvrtc.so";

vendor_fns! {
    /// The NVRTC functions the compiler calls.
    pub(crate) struct NvrtcFns, names NvrtcNames {
        version: "nvrtcVersion" => NvrtcVersionFn,
        get_error_string: "nvrtcGetErrorString" => NvrtcGetErrorStringFn,
        create_program: "nvrtcCreateProgram" => NvrtcCreateProgramFn,
        destroy_program: "nvrtcDestroyProgram" => NvrtcDestroyProgramFn,
        compile_program: "nvrtcCompileProgram" => NvrtcCompileProgramFn,
        get_ptx_size: "nvrtcGetPTXSize" => NvrtcGetSizeFn,
        get_ptx: "nvrtcGetPTX" => NvrtcGetBytesFn,
        get_program_log_size: "nvrtcGetProgramLogSize" => NvrtcGetSizeFn,
        get_program_log: "nvrtcGetProgramLog" => NvrtcGetBytesFn,
    }
    optional {
        get_cubin_size: "nvrtcGetCUBINSize" => NvrtcGetSizeFn,
        get_cubin: "nvrtcGetCUBIN" => NvrtcGetBytesFn,
        get_num_supported_archs: "nvrtcGetNumSupportedArchs" => NvrtcGetNumSupportedArchsFn,
        get_supported_archs: "nvrtcGetSupportedArchs" => NvrtcGetSupportedArchsFn,
    }
}

/// The environment settings the search reads, taken once (tests build their own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct SearchEnv {
    /// `SIMPLER_NVRTC_LIB`.
    pub lib: Option<OsString>,
    /// `CUDA_HOME`, `CUDA_PATH` (in [`TOOLKIT_ENVS`] order).
    pub toolkits: [Option<OsString>; 2],
}

impl SearchEnv {
    /// The process environment; empty values count as unset.
    pub(crate) fn from_process() -> SearchEnv {
        let get = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        SearchEnv {
            lib: get(ENV_NVRTC_LIB),
            toolkits: TOOLKIT_ENVS.map(get),
        }
    }
}

/// The candidate paths, in order, and what the error suggests when none opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Search {
    pub paths: Vec<PathBuf>,
    pub hint: String,
    /// `SIMPLER_NVRTC_LIB`, when it replaced the search.
    pub overridden: Option<PathBuf>,
}

/// Builds the search for `env` and the caller's `extra_dirs` (see the module docs).
pub(crate) fn search(env: &SearchEnv, extra_dirs: &[PathBuf]) -> Search {
    if let Some(lib) = &env.lib {
        return Search {
            paths: vec![PathBuf::from(lib)],
            overridden: Some(PathBuf::from(lib)),
            hint: format!(
                "{ENV_NVRTC_LIB} is set, so only it was tried: point it at libnvrtc.so.13 or \
                 libnvrtc.so.12 (a path, or a name on the loader's search path), or unset it to \
                 search the nvidia-cuda-nvrtc wheel folders, $CUDA_HOME/lib64, $CUDA_PATH/lib64, \
                 {DEFAULT_TOOLKIT_LIB_DIR} and the loader's search path"
            ),
        };
    }
    let mut dirs: Vec<PathBuf> = extra_dirs.to_vec();
    let mut unset = Vec::new();
    for (name, value) in TOOLKIT_ENVS.iter().zip(&env.toolkits) {
        match value {
            Some(root) => dirs.push(PathBuf::from(root).join("lib64")),
            None => unset.push(*name),
        }
    }
    dirs.push(PathBuf::from(DEFAULT_TOOLKIT_LIB_DIR));
    let mut paths: Vec<PathBuf> = Vec::new();
    let all = dirs
        .iter()
        .flat_map(|d| NVRTC_LIB_NAMES.iter().map(move |n| d.join(n)))
        .chain(NVRTC_LIB_NAMES.iter().map(PathBuf::from));
    for p in all {
        if !paths.contains(&p) {
            paths.push(p);
        }
    }
    let mut notes = Vec::new();
    if extra_dirs.is_empty() {
        notes.push("no wheel folders were given".to_string());
    }
    if !unset.is_empty() {
        notes.push(format!("{} not set", unset.join(" and ")));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    Search {
        paths,
        overridden: None,
        hint: format!(
            "install NVRTC with `pip install nvidia-cuda-nvrtc` (CUDA 13; \
             `nvidia-cuda-nvrtc-cu12` for CUDA 12) or a CUDA toolkit, then set {ENV_NVRTC_LIB} \
             to the library's path, or CUDA_HOME to the toolkit root, or add the library's \
             folder to LD_LIBRARY_PATH{notes}"
        ),
    }
}

/// One NVRTC library that opened and has the function table.
#[derive(Clone, Copy)]
pub(crate) struct Found {
    pub lib: VendorLib,
    pub f: NvrtcFns,
    /// The path it was opened by, or for a copy already loaded, the file the loader recorded.
    pub file: &'static str,
}

/// Opens every candidate of `search` (the already-loaded copies first, when `reuse_resident`;
/// tests turn that off, so a library another test loaded cannot answer): the libraries that
/// opened with their function tables, each file once, and every attempt that failed.
pub(crate) fn find_all(search: &Search, reuse_resident: bool) -> (Vec<Found>, Vec<LoadAttempt>) {
    let mut found: Vec<Found> = Vec::new();
    let mut files: Vec<String> = Vec::new();
    let mut failed: Vec<LoadAttempt> = Vec::new();
    let mut keep = |lib: VendorLib, failed: &mut Vec<LoadAttempt>| {
        // SAFETY: each type in the table is the exact `nvrtc.h` signature of its symbol
        // (`nvrtcResult` is a C enum, an `int`; `size_t` is `usize`).
        match unsafe { NvrtcFns::load(&lib) } {
            Ok(f) => {
                // Where the loader got it from: the path it was opened by, or for a copy someone
                // else loaded, the path the loader recorded. The same file (a symlink, a copy
                // already loaded) counts once.
                let loaded = loader::file_of(f.version as *const std::ffi::c_void);
                let shown = match &loaded {
                    Some(p) if lib.path.contains(" (already loaded") => p.clone(),
                    _ => lib.path.to_string(),
                };
                let same = std::fs::canonicalize(loaded.as_deref().unwrap_or(lib.path))
                    .map_or_else(|_| shown.clone(), |p| p.display().to_string());
                if !files.contains(&same) {
                    files.push(same);
                    let text: &'static str = Box::leak(shown.into_boxed_str());
                    found.push(Found { lib, f, file: text });
                }
            }
            Err(e) => failed.push(LoadAttempt {
                path: lib.path.to_string(),
                error: e.to_string(),
            }),
        }
    };
    if reuse_resident && search.overridden.is_none() {
        for name in NVRTC_LIB_NAMES {
            if let Some(lib) = loader::resident(name) {
                keep(lib, &mut failed);
            }
        }
    }
    for path in &search.paths {
        match loader::open_path(SEARCH_NAME, path) {
            Ok(lib) => keep(lib, &mut failed),
            Err(error) => failed.push(LoadAttempt {
                path: path.display().to_string(),
                error,
            }),
        }
    }
    (found, failed)
}

/// The error when no candidate opened: every path tried, and how to change the search.
pub(crate) fn none_opened(search: &Search, tried: Vec<LoadAttempt>) -> LoadError {
    LoadError::Library {
        library: LIBRARY.to_string(),
        tried,
        hint: search.hint.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(paths: &[PathBuf]) -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    }

    #[test]
    fn search_order_is_wheels_then_toolkits_then_bare_names() {
        let env = SearchEnv {
            lib: None,
            toolkits: [Some("/opt/cuda-home".into()), Some("/opt/cuda-path".into())],
        };
        let s = search(
            &env,
            &[
                PathBuf::from("/sp/nvidia/cu13/lib"),
                PathBuf::from("/sp/nvidia/cuda_nvrtc/lib"),
            ],
        );
        let mut want = Vec::new();
        for d in [
            "/sp/nvidia/cu13/lib",
            "/sp/nvidia/cuda_nvrtc/lib",
            "/opt/cuda-home/lib64",
            "/opt/cuda-path/lib64",
            "/usr/local/cuda/lib64",
        ] {
            for n in NVRTC_LIB_NAMES {
                want.push(format!("{d}/{n}"));
            }
        }
        want.extend(NVRTC_LIB_NAMES.map(String::from));
        assert_eq!(texts(&s.paths), want);
        assert!(!s.hint.contains("not set"), "{}", s.hint);
    }

    #[test]
    fn duplicates_are_tried_once_and_unset_toolkits_are_named() {
        let s = search(
            &SearchEnv::default(),
            &[PathBuf::from("/usr/local/cuda/lib64")],
        );
        let mut want: Vec<String> = NVRTC_LIB_NAMES
            .iter()
            .map(|n| format!("/usr/local/cuda/lib64/{n}"))
            .collect();
        want.extend(NVRTC_LIB_NAMES.map(String::from));
        assert_eq!(texts(&s.paths), want);
        assert!(
            s.hint.contains("CUDA_HOME and CUDA_PATH not set"),
            "{}",
            s.hint
        );
        let s = search(&SearchEnv::default(), &[]);
        assert!(s.hint.contains("no wheel folders were given"), "{}", s.hint);
    }

    #[test]
    fn the_override_is_the_only_candidate() {
        let env = SearchEnv {
            lib: Some("/nonexistent/simpler/libnvrtc.so.13".into()),
            toolkits: [Some("/opt/cuda".into()), None],
        };
        let s = search(&env, &[PathBuf::from("/sp/nvidia/cu13/lib")]);
        assert_eq!(texts(&s.paths), ["/nonexistent/simpler/libnvrtc.so.13"]);
        let Err(e) = super::super::choice::decide(&s, None, None, false) else {
            panic!("opened")
        };
        let msg = e.to_string();
        assert!(
            msg.contains("/nonexistent/simpler/libnvrtc.so.13 (no such file)"),
            "{msg}"
        );
        assert!(msg.contains("SIMPLER_NVRTC_LIB is set"), "{msg}");
    }

    #[test]
    fn missing_library_error_lists_every_place_looked_and_how_to_fix_it() {
        let env = SearchEnv {
            lib: None,
            toolkits: [Some("/nonexistent/simpler-cuda-home".into()), None],
        };
        let mut s = search(
            &env,
            &[PathBuf::from("/nonexistent/simpler-sp/nvidia/cu13/lib")],
        );
        // Leave out the bare names and the real toolkit folder: on a machine with NVRTC (or in
        // a test process where another test loaded it) they would open.
        s.paths.retain(|p| p.starts_with("/nonexistent"));
        let Err(e) = super::super::choice::decide(&s, None, None, false) else {
            panic!("opened")
        };
        let LoadError::Library { library, tried, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(library, LIBRARY);
        assert_eq!(tried.len(), 6);
        let msg = e.to_string();
        for p in &s.paths {
            assert!(
                msg.contains(&format!("{} (no such file)", p.display())),
                "{msg}"
            );
        }
        assert!(
            msg.starts_with("cannot open vendor library NVRTC (libnvrtc.so.13"),
            "{msg}"
        );
        assert!(msg.contains("pip install nvidia-cuda-nvrtc"), "{msg}");
        assert!(msg.contains("CUDA_PATH not set"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }
}
