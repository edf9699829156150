//! Opening vendor libraries at run time.
//!
//! Vendor libraries are never linked: `import simpler` and the sim platform must work on machines
//! without any vendor software. A backend names a library and a list of candidate paths (the
//! environment override first, then the vendor's install locations, then the bare name so the
//! dynamic loader's own search applies); [`open_first`] tries them in order and, when none opens,
//! returns a [`LoadError`] listing every path tried and why each failed. A missing symbol is a
//! [`LoadError`] as well, naming the library, the path it was opened from and the symbol. Nothing
//! here panics: a panic would cross into Python as `PanicException`.
//!
//! A library the process has already loaded (a framework such as torch_npu loaded the vendor
//! runtime before us) is reused, never loaded a second time from another path: [`open_first`]
//! first asks the loader for a library of that name that is already resident (`RTLD_NOLOAD`),
//! which matches by the soname real vendor libraries carry.
//!
//! Vendor libraries built without an RPATH (CANN's) name their dependencies by soname only
//! (`libc_sec.so`, `libmmpa.so`, ...), which the dynamic loader looks for on `LD_LIBRARY_PATH`,
//! read once at process start. When opening a library fails on a missing dependency,
//! [`open_first_with`] looks for that dependency in the folders the backend names (the
//! library's own folder first, then the vendor's install folders), loads it by absolute path
//! (a dependency already loaded satisfies the library's by soname) and tries again; when the
//! dependency is nowhere to be found, the error names it and the fix.
//!
//! Function tables are declared with [`vendor_fns!`]: one list of symbol names generates the
//! struct of function pointers, its loader and the table of call names used in errors, so the
//! three cannot drift apart.
//!
//! Lifetime: an opened library is leaked into a `&'static Library` (`Box::leak`) and never closed.
//! Function pointers copied out of it are therefore valid for the rest of the process, so backends
//! can store plain `extern "C" fn` pointers without tying them to a borrow. Vendor runtimes keep
//! process-wide state (threads, device contexts) that does not survive `dlclose` cleanly anyway;
//! each path is opened once per process and remembered (a table of what was opened, by path), so
//! opening a device many times reuses the first handle instead of leaking one per open, and the
//! handles stay reachable from that table (memcheck reports none of them lost).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::Library;

/// One attempt to open a library: the path (or bare name) given to the loader, and its error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAttempt {
    pub path: String,
    pub error: String,
}

fn list_attempts(tried: &[LoadAttempt]) -> String {
    if tried.is_empty() {
        return "no candidate paths".to_string();
    }
    tried
        .iter()
        .map(|a| format!("{} ({})", a.path, a.error))
        .collect::<Vec<_>>()
        .join("; ")
}

fn list_errors(errors: &[LoadError]) -> String {
    errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A vendor library that could not be opened or initialized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate path of `library` could be opened. `hint` names the settings that change
    /// where it is searched for.
    #[error("cannot open vendor library {library}: tried {}; {hint}", list_attempts(.tried))]
    Library {
        library: String,
        tried: Vec<LoadAttempt>,
        hint: String,
    },
    /// `library` opened, but lacks `symbol`.
    #[error("vendor library {library} (opened from {path}) has no symbol `{symbol}`: {reason}")]
    Symbol {
        library: String,
        path: String,
        symbol: String,
        reason: String,
    },
    /// The library loaded, but an initialization call failed.
    #[error("{call} failed with code {code} ({code_name}) while opening {library}: {detail}")]
    Init {
        library: String,
        call: String,
        code: i64,
        code_name: String,
        detail: String,
    },
    /// A configuration value (argument or environment variable) is invalid.
    #[error("invalid {what}: {detail}")]
    Config { what: String, detail: String },
    /// None of several alternatives (e.g. the `acl*` and the `rt*` runtime) is usable.
    #[error("no usable {what}: {}", list_errors(.errors))]
    NoAlternative {
        what: String,
        errors: Vec<LoadError>,
    },
}

/// An opened vendor library, kept loaded for the life of the process (see the module docs).
#[derive(Clone, Copy)]
pub(crate) struct VendorLib {
    /// The library's usual file name (e.g. `libascendcl.so`), for messages.
    pub(crate) name: &'static str,
    /// The path or name it was opened from.
    pub(crate) path: &'static str,
    lib: &'static Library,
}

impl fmt::Debug for VendorLib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VendorLib")
            .field("name", &self.name)
            .field("path", &self.path)
            .finish()
    }
}

/// Candidate paths for `file` in `dirs` (in order), followed by the bare `file` when `bare`.
pub(crate) fn candidates(file: &str, dirs: &[PathBuf], bare: bool) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    let all = dirs
        .iter()
        .map(|d| d.join(file))
        .chain(bare.then(|| PathBuf::from(file)));
    for p in all {
        if !v.contains(&p) {
            v.push(p);
        }
    }
    v
}

/// Every library opened so far: (path given to the loader, handle, that path as text).
type Opened = Vec<(PathBuf, &'static Library, &'static str)>;
static OPENED: Mutex<Opened> = Mutex::new(Vec::new());

/// `RTLD_NOLOAD` (glibc and musl `<dlfcn.h>` on Linux): succeed only for a library that is
/// already loaded. libloading exports the portable flags only.
const RTLD_NOLOAD: std::ffi::c_int = 0x4;

/// A library named `name` (a file name, matched by soname) that the process has already loaded.
fn already_loaded(name: &str) -> Option<&'static Library> {
    let flags = RTLD_NOLOAD | libloading::os::unix::RTLD_LAZY;
    // SAFETY: with RTLD_NOLOAD the loader opens nothing new: it returns a handle to a library
    // that is already loaded (whose initializers have already run) or fails.
    let lib = unsafe { libloading::os::unix::Library::open(Some(name), flags) }.ok()?;
    Some(Box::leak(Box::new(Library::from(lib))))
}

/// Opens `name`: a copy the process already loaded when there is one (so a process that loaded
/// the vendor runtime before us never gets a second copy), else the first candidate path the
/// dynamic loader accepts (or that was opened before). `hint` goes into the error when nothing
/// opens: the settings that change the search.
pub(crate) fn open_first(
    name: &'static str,
    paths: &[PathBuf],
    hint: &str,
) -> Result<VendorLib, LoadError> {
    open_first_with(name, paths, hint, &[])
}

/// [`open_first`], preloading a missing dependency of a candidate from the candidate's own
/// folder or from `dep_dirs` (see the module docs).
pub(crate) fn open_first_with(
    name: &'static str,
    paths: &[PathBuf],
    hint: &str,
    dep_dirs: &[PathBuf],
) -> Result<VendorLib, LoadError> {
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    let resident = PathBuf::from(format!("{name} (already loaded in this process)"));
    let mut tried = Vec::new();
    if let Some(&(_, lib, text)) = opened.iter().find(|o| o.0 == resident) {
        return Ok(VendorLib {
            name,
            path: text,
            lib,
        });
    }
    // A library we opened ourselves by one of these paths is ours, not someone else's.
    let ours = paths.iter().find_map(|p| opened.iter().find(|o| &o.0 == p));
    if ours.is_none() {
        if let Some(lib) = already_loaded(name) {
            let text: &'static str = Box::leak(resident.display().to_string().into_boxed_str());
            opened.push((resident, lib, text));
            return Ok(VendorLib {
                name,
                path: text,
                lib,
            });
        }
    }
    for path in paths {
        if let Some(&(_, lib, text)) = opened.iter().find(|o| &o.0 == path) {
            return Ok(VendorLib {
                name,
                path: text,
                lib,
            });
        }
        match open_with_deps(path, dep_dirs, &mut opened) {
            Ok(lib) => {
                let text: &'static str = Box::leak(path.display().to_string().into_boxed_str());
                opened.push((path.clone(), lib, text));
                return Ok(VendorLib {
                    name,
                    path: text,
                    lib,
                });
            }
            Err(error) => tried.push(LoadAttempt {
                path: path.display().to_string(),
                error,
            }),
        }
    }
    Err(LoadError::Library {
        library: name.to_string(),
        tried,
        hint: hint.to_string(),
    })
}

/// Opens exactly `path` (or takes the copy this process opened by that path before), without
/// the already-loaded shortcut of [`open_first`]: for a search that wants every candidate, not
/// the first. The error is the loader's, for that path.
pub(crate) fn open_path(name: &'static str, path: &Path) -> Result<VendorLib, String> {
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, lib, text)) = opened.iter().find(|o| o.0 == path) {
        return Ok(VendorLib {
            name,
            path: text,
            lib,
        });
    }
    let lib = open_with_deps(path, &[], &mut opened)?;
    let text: &'static str = Box::leak(path.display().to_string().into_boxed_str());
    opened.push((path.to_path_buf(), lib, text));
    Ok(VendorLib {
        name,
        path: text,
        lib,
    })
}

/// The copy of `name` (a file name, matched by soname) this process has already loaded, if
/// any, recorded as `"<name> (already loaded in this process)"`.
pub(crate) fn resident(name: &'static str) -> Option<VendorLib> {
    open_first(name, &[], "").ok()
}

/// The file the loaded object containing `addr` (a function of a loaded library) was loaded
/// from, as the dynamic loader recorded it (`dladdr`); `None` when the loader does not know.
pub(crate) fn file_of(addr: *const std::ffi::c_void) -> Option<String> {
    // SAFETY: `Dl_info` is plain old data (pointers and integers), valid zeroed.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only reads the loader's tables for `addr` (any value is allowed) and
    // writes `info`, which lives across the call.
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a non-null `dli_fname` is a NUL-terminated string owned by the loader, valid
    // while the object stays loaded (libraries here are never closed); copied out at once.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

/// The dependency a loader error says is missing (`"libx.so: cannot open shared object file:
/// ..."`, a bare soname), if that is the error.
fn missing_dependency(error: &str) -> Option<&str> {
    let (head, _) = error.split_once(": cannot open shared object file")?;
    let name = head.rsplit(' ').next()?;
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

/// How many dependencies one library may pull in by preloading (a chain, not a cycle, is
/// what a vendor installation has).
const MAX_PRELOADS: usize = 32;

/// Opens `path`; while that fails on a missing dependency found in the library's folder or in
/// `dep_dirs`, loads the dependency by absolute path (recorded in `opened`) and tries again.
/// A dependency found nowhere is an error naming it, the folders searched and the fix.
fn open_with_deps(
    path: &Path,
    dep_dirs: &[PathBuf],
    opened: &mut Opened,
) -> Result<&'static Library, String> {
    open_preloading(path, dep_dirs, opened, &mut Vec::new())
}

/// [`open_with_deps`]; `chain` holds the dependencies being preloaded, across the recursion
/// (a dependency of a dependency is preloaded the same way), so that a cycle or a dependency
/// that still does not satisfy its name ends in an error, never in a loop.
fn open_preloading(
    path: &Path,
    dep_dirs: &[PathBuf],
    opened: &mut Opened,
    chain: &mut Vec<String>,
) -> Result<&'static Library, String> {
    let mut dirs: Vec<PathBuf> = path.parent().map(Path::to_path_buf).into_iter().collect();
    dirs.extend(dep_dirs.iter().cloned());
    dirs.retain(|d| !d.as_os_str().is_empty());
    let own_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    loop {
        let error = match open_one(path) {
            Ok(lib) => return Ok(lib),
            Err(e) => e,
        };
        // A bare name that is itself missing is not a dependency.
        let dep = match missing_dependency(&error) {
            Some(dep) if Some(dep) != own_name.as_deref() => dep.to_string(),
            _ => return Err(error),
        };
        let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        let Some(file) = dirs.iter().map(|d| d.join(&dep)).find(|p| p.exists()) else {
            return Err(format!(
                "{error}; {dep} is not in {} either. The vendor's libraries carry no RPATH: \
                 source the toolkit's set_env.sh before starting Python, or start it with \
                 LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH (the loader reads LD_LIBRARY_PATH once, at \
                 process start)",
                searched.join(", "),
                searched.join(":")
            ));
        };
        if chain.contains(&dep) || chain.len() >= MAX_PRELOADS {
            return Err(format!(
                "{error}; preloading {} did not satisfy it (its soname is not {dep}?), or the \
                 dependencies form a cycle ({})",
                file.display(),
                chain.join(" -> ")
            ));
        }
        chain.push(dep);
        let lib = open_preloading(&file, dep_dirs, opened, chain)
            .map_err(|e| format!("{error}; preloading {} failed: {e}", file.display()))?;
        log::debug!("preloaded {} for {}", file.display(), path.display());
        let text: &'static str = Box::leak(file.display().to_string().into_boxed_str());
        opened.push((file, lib, text));
    }
}

fn open_one(path: &Path) -> Result<&'static Library, String> {
    // A bare file name (no separator) goes to the loader's search path as is; a path that does
    // not exist gets a short message instead of the loader's longer one.
    if path.components().count() > 1 && !path.exists() {
        return Err("no such file".to_string());
    }
    // SAFETY: opening a library runs its initializers. We only open the vendor libraries the
    // user's installation (or the explicit override) names; their initializers are the vendor's
    // documented load-time behaviour, and we call nothing until the open has succeeded.
    let lib = unsafe { Library::new(path.as_os_str()) }.map_err(|e| e.to_string())?;
    Ok(Box::leak(Box::new(lib)))
}

impl VendorLib {
    /// Looks up `symbol` as a value of type `T` (a function pointer type).
    ///
    /// # Safety
    /// `T` must be the exact type of the symbol as the vendor defines it (an `extern "C" fn`
    /// pointer with the C signature's argument and return widths). The returned pointer stays
    /// valid for the life of the process: the library is never closed.
    pub(crate) unsafe fn sym<T: Copy>(&self, symbol: &str) -> Result<T, LoadError> {
        // SAFETY: the caller guarantees that `T` is the symbol's type; the library is leaked, so
        // the value copied out of the `Symbol` outlives nothing it depends on.
        let r = unsafe { self.lib.get::<T>(symbol.as_bytes()) };
        match r {
            Ok(s) => Ok(*s),
            Err(e) => Err(LoadError::Symbol {
                library: self.name.to_string(),
                path: self.path.to_string(),
                symbol: symbol.to_string(),
                reason: e.to_string(),
            }),
        }
    }
}

/// Declares a vendor function table: a struct of `extern "C"` function pointers, loaded from a
/// [`VendorLib`] by the listed symbol names, with a companion struct of those names
/// (`Table::NAMES.field`), used wherever a call is named in an error.
///
/// ```text
/// vendor_fns! {
///     /// The runtime's functions.
///     pub(crate) struct AclFns, names AclNames {
///         init: "aclInit" => AclInitFn,
///     }
///     optional {
///         finalize_reference: "aclFinalizeReference" => AclFinalizeReferenceFn,
///     }
/// }
/// ```
///
/// Required symbols are fields of their function type; optional ones are `Option`s (`None`
/// when the library does not export them). Loading is `unsafe`: each type must be the exact C
/// signature of its symbol.
macro_rules! vendor_fns {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, names $names:ident {
            $( $field:ident : $sym:literal => $ty:ty ),* $(,)?
        }
        $( optional {
            $( $ofield:ident : $osym:literal => $oty:ty ),* $(,)?
        } )?
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        $vis struct $name {
            $( pub $field: $ty, )*
            $($( pub $ofield: Option<$oty>, )*)?
        }

        /// The vendor name of each function of the table.
        #[derive(Debug, Clone, Copy)]
        #[allow(dead_code)]
        $vis struct $names {
            $( pub $field: &'static str, )*
            $($( pub $ofield: &'static str, )*)?
        }

        #[allow(dead_code)]
        impl $name {
            /// The symbol names, field by field.
            pub const NAMES: $names = $names {
                $( $field: $sym, )*
                $($( $ofield: $osym, )*)?
            };

            /// Every symbol the table loads (required, then optional).
            pub const SYMBOLS: &'static [&'static str] = &[$($sym,)* $($($osym,)*)?];

            /// Loads the table; a missing required symbol is a [`LoadError::Symbol`].
            ///
            /// # Safety
            /// Each declared type must be the exact C signature of its symbol.
            pub unsafe fn load(lib: &$crate::loader::VendorLib) -> Result<Self, $crate::loader::LoadError> {
                Ok($name {
                    // SAFETY: per this function's contract.
                    $( $field: unsafe { lib.sym::<$ty>($sym)? }, )*
                    // SAFETY: per this function's contract.
                    $($( $ofield: unsafe { lib.sym::<$oty>($osym).ok() }, )*)?
                })
            }
        }
    };
}
pub(crate) use vendor_fns;

/// Splits a `PATH`-like list (`a:b:c`) into directories, skipping empty entries.
pub(crate) fn split_dirs(list: &str) -> Vec<PathBuf> {
    list.split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_lists_every_path_tried() {
        let paths = candidates(
            "libdoes_not_exist_simpler.so",
            &[
                PathBuf::from("/nonexistent/a"),
                PathBuf::from("/nonexistent/b"),
            ],
            true,
        );
        let e = open_first("libdoes_not_exist_simpler.so", &paths, "set X").unwrap_err();
        let LoadError::Library { library, tried, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(library, "libdoes_not_exist_simpler.so");
        let tried: Vec<&str> = tried.iter().map(|a| a.path.as_str()).collect();
        assert_eq!(
            tried,
            [
                "/nonexistent/a/libdoes_not_exist_simpler.so",
                "/nonexistent/b/libdoes_not_exist_simpler.so",
                "libdoes_not_exist_simpler.so"
            ]
        );
        let msg = e.to_string();
        assert!(
            msg.contains("/nonexistent/b/libdoes_not_exist_simpler.so"),
            "{msg}"
        );
        assert!(msg.ends_with("; set X"), "{msg}");
    }

    #[test]
    fn missing_symbol_names_library_path_and_symbol() {
        // libc is always loaded (bare name: the loader returns the existing handle).
        let lib = open_first("libc.so.6", &[PathBuf::from("/nonexistent/libc.so.6")], "").unwrap();
        assert_eq!(lib.path, "libc.so.6 (already loaded in this process)");
        type F = extern "C" fn() -> i32;
        // SAFETY: the symbol does not exist, so no pointer of the wrong type is produced.
        let e = unsafe { lib.sym::<F>("simpler_no_such_symbol") }.unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("libc.so.6"), "{msg}");
        assert!(msg.contains("simpler_no_such_symbol"), "{msg}");
        // SAFETY: `getpid` is `pid_t getpid(void)`, pid_t = int on Linux.
        let getpid = unsafe { lib.sym::<F>("getpid") }.unwrap();
        assert_eq!(getpid() as u32, std::process::id());
    }

    vendor_fns! {
        /// libc, as a table.
        struct LibcFns, names LibcNames {
            getpid: "getpid" => extern "C" fn() -> i32,
        }
        optional {
            missing: "simpler_no_such_symbol" => extern "C" fn() -> i32,
        }
    }

    #[test]
    fn a_table_loads_required_and_optional_symbols_and_names_them() {
        let lib = open_first("libc.so.6", &[], "").unwrap();
        // SAFETY: `pid_t getpid(void)`, pid_t = int on Linux; the optional one does not exist.
        let f = unsafe { LibcFns::load(&lib) }.unwrap();
        assert_eq!((f.getpid)() as u32, std::process::id());
        assert!(f.missing.is_none());
        assert_eq!(LibcFns::NAMES.getpid, "getpid");
        assert_eq!(LibcFns::SYMBOLS, ["getpid", "simpler_no_such_symbol"]);
    }

    #[test]
    fn a_missing_dependency_is_read_from_the_loaders_error() {
        let e = "/opt/x/libascendcl.so: libc_sec.so: cannot open shared object file: No such file";
        assert_eq!(missing_dependency(e), Some("libc_sec.so"));
        let e = "libmmpa.so: cannot open shared object file: No such file or directory";
        assert_eq!(missing_dependency(e), Some("libmmpa.so"));
        // The library itself missing (a path) is not a dependency.
        let e = "/opt/x/libascendcl.so: cannot open shared object file: No such file";
        assert_eq!(missing_dependency(e), None);
        assert_eq!(missing_dependency("undefined symbol: foo"), None);
    }

    #[test]
    fn dir_lists_split_and_candidates_dedup() {
        assert_eq!(
            split_dirs("/a::/b:"),
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
        let c = candidates("x.so", &[PathBuf::from("/a"), PathBuf::from("/a")], false);
        assert_eq!(c, [PathBuf::from("/a/x.so")]);
    }
}
