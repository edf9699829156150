//! The fake vendor libraries (`crates/fake-ascend`, `crates/fake-cuda`), for the driver tests.
//!
//! [`fake_library`] finds the fake's `.so`: next to the test executable (`target/<profile>/`,
//! where `cargo build --workspace` puts it) when it is there and newer than the fake's sources,
//! else it builds it, with `cargo build -p <fake>` into a target directory of its own (so it never
//! waits on the build lock of the `cargo test` that runs us). Plain `cargo test` on a fresh clone
//! therefore works; concurrent test processes share that build through cargo's own lock.
//!
//! [`Fake`] gives each test a private copy of the library in a directory of its own, with
//! vendor-named symlinks to it: the dynamic loader identifies a library by its file, so every
//! test gets fresh fake state (call log, counts, injections), and the names one test links
//! share it.

#![allow(dead_code)] // each test binary uses part of this

use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use simpler_driver::ascend::{AscendConfig, VisibleDevices};
use simpler_driver::Device;

/// The newest modification time of the files under `dir`.
fn newest(dir: &Path) -> SystemTime {
    let mut t = SystemTime::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let m = if p.is_dir() {
            newest(&p)
        } else {
            e.metadata().and_then(|m| m.modified()).unwrap_or(t)
        };
        t = t.max(m);
    }
    t
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The `.so` of fake crate `krate` (`"fake-ascend"`, `"fake-cuda"`), built if needed.
pub fn fake_library(krate: &str) -> PathBuf {
    let file = format!("lib{}.so", krate.replace('-', "_"));
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let sources = newest(&crates.join(krate)).max(newest(&crates.join("fake-vendor")));
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-exe> -> target/<profile>
    if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
        let so = profile_dir.join(&file);
        if modified(&so).is_some_and(|t| t >= sources) {
            return so;
        }
    }
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fakes");
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let status = std::process::Command::new(cargo)
        .args(["build", "-q", "-p", krate, "--target-dir"])
        .arg(&target)
        .current_dir(crates)
        .status()
        .unwrap_or_else(|e| panic!("running `{cargo} build -p {krate}`: {e}"));
    assert!(status.success(), "`cargo build -p {krate}` failed");
    let so = target.join("debug").join(&file);
    assert!(so.is_file(), "{} missing after the build", so.display());
    so
}

/// The fake runtime's load-time dependency (`libc_sec.so`, built by `crates/fake-ascend/build.rs`
/// beside the fake, under `<profile>/build/fake-ascend-*/out/`): the newest one.
pub fn fake_dependency(fake_so: &Path) -> PathBuf {
    let build = fake_so.parent().unwrap().join("build");
    std::fs::read_dir(&build)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fake-ascend-"))
        .map(|e| e.path().join("out").join("libc_sec.so"))
        .filter(|p| p.is_file())
        .max_by_key(|p| modified(p))
        .unwrap_or_else(|| panic!("no libc_sec.so under {}", build.display()))
}

/// Gives the copy at `so` a soname of its own (the fake's is the runtime's, `libascendcl.so`):
/// a library already loaded is found by soname, and each test must get its own copy.
fn own_soname(so: &Path, n: usize) {
    let mut bytes = std::fs::read(so).unwrap();
    let from = b"\0libascendcl.so\0";
    let to = format!("\0libasc{:05}.so\0", n % 100_000);
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the fake's soname");
    bytes[at..at + from.len()].copy_from_slice(to.as_bytes());
    std::fs::write(so, bytes).unwrap();
}

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// One test's private copy of a fake library, with vendor-named symlinks to it.
pub struct Fake {
    pub dir: PathBuf,
    pub control: libloading::Library,
    prefix: &'static str,
}

impl Fake {
    /// A copy of fake crate `krate` whose controls are named `<prefix>_*`, linked as `names`.
    pub fn new(krate: &str, prefix: &'static str, names: &[&str]) -> Fake {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("simpler-{krate}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = format!("lib{}.so", krate.replace('-', "_"));
        let copy = dir.join(&file);
        let so = fake_library(krate);
        std::fs::copy(&so, &copy).unwrap();
        if krate == "fake-ascend" {
            own_soname(&copy, n);
            // The runtime's dependency lies beside it, and this process loads it first (the
            // control handle below needs it), so no test here goes through the loader's
            // preload; tests/test_vendor_platforms.py does, in fresh processes.
            std::fs::copy(fake_dependency(&so), dir.join("libc_sec.so")).unwrap();
            // SAFETY: a C library of one function, without initializers.
            let dep = unsafe { libloading::Library::new(dir.join("libc_sec.so")) }.unwrap();
            std::mem::forget(dep);
        }
        for name in names {
            std::os::unix::fs::symlink(&file, dir.join(name)).unwrap();
        }
        // SAFETY: the fake's initializers are Rust statics only (no constructors with effects).
        let control = unsafe { libloading::Library::new(&copy) }.unwrap();
        Fake {
            dir,
            control,
            prefix,
        }
    }

    /// Links `name` in the fake's directory to `target`.
    pub fn link(&self, name: &str, target: &Path) {
        std::os::unix::fs::symlink(target, self.dir.join(name)).unwrap();
    }

    /// A symbol of the fake, by its full name.
    ///
    /// # Safety
    /// `T` must be the symbol's exact type.
    pub unsafe fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: per this function's contract.
        unsafe { *self.control.get::<T>(name.as_bytes()).unwrap() }
    }

    /// A control `uint64_t <prefix>_<name>(void)`.
    pub fn count(&self, name: &str) -> u64 {
        // SAFETY: the fakes' counters are `uint64_t name(void)`.
        unsafe { self.sym::<extern "C" fn() -> u64>(&format!("{}_{name}", self.prefix))() }
    }

    /// A control `<ret> <prefix>_<name>(<arg>)` with one integer argument.
    pub fn query<A, R>(&self, name: &str, arg: A) -> R {
        // SAFETY: the caller names a control with exactly this integer signature.
        unsafe { self.sym::<extern "C" fn(A) -> R>(&format!("{}_{name}", self.prefix))(arg) }
    }

    /// A control `int <prefix>_<name>(const char *)`; returns its code. Only for controls of
    /// exactly that signature (calling a `void` one through it is undefined behaviour).
    pub fn set(&self, name: &str, spec: Option<&str>) -> c_int {
        let s = spec.map(|s| CString::new(s).unwrap());
        let p = s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        // SAFETY: `int name(const char *)`; `p` is NUL-terminated or null.
        unsafe {
            self.sym::<unsafe extern "C" fn(*const c_char) -> c_int>(&format!(
                "{}_{name}",
                self.prefix
            ))(p)
        }
    }

    /// Makes the `nth` next call of vendor function `name` return `code`.
    pub fn inject(&self, name: &str, nth: u32, code: i32) {
        let s = CString::new(name).unwrap();
        // SAFETY: `int <prefix>_inject(const char *, uint32_t, int32_t)`.
        let rc = unsafe {
            self.sym::<unsafe extern "C" fn(*const c_char, u32, i32) -> c_int>(&format!(
                "{}_inject",
                self.prefix
            ))(s.as_ptr(), nth, code)
        };
        assert_eq!(rc, 0);
    }

    /// The fake's call log, one line per vendor call.
    pub fn log(&self) -> Vec<String> {
        // SAFETY: `size_t <prefix>_call_log(char *buf, size_t cap)`; `buf` holds `cap` bytes.
        let text = unsafe {
            let f = self.sym::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(&format!(
                "{}_call_log",
                self.prefix
            ));
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = f(buf.as_mut_ptr().cast(), buf.len());
                if n <= buf.len() {
                    buf.truncate(n);
                    break;
                }
                buf.resize(n, 0);
            }
            String::from_utf8(buf).unwrap()
        };
        text.lines().map(str::to_string).collect()
    }

    /// Log lines of calls to `name`.
    pub fn calls(&self, name: &str) -> Vec<String> {
        let prefix = format!("{name} ");
        self.log()
            .into_iter()
            .filter(|l| l.starts_with(&prefix))
            .collect()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        // The library stays mapped (never closed); removing its file is fine on Linux.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The path of the C library this process runs with (a real library lacking every vendor symbol).
pub fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            let name = Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            name.starts_with("libc.so") || name.starts_with("libc-")
        })
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps")
}

/// The vendor names the fake Ascend library stands in for: the `acl*` runtime, the `rt*`
/// runtime and the HAL.
pub const ASCEND_NAMES: [&str; 3] = ["libascendcl.so", "libruntime.so", "libascend_hal.so"];

/// A private copy of the fake Ascend library, linked as `names`.
pub fn ascend_with_links(names: &[&str]) -> Fake {
    Fake::new("fake-ascend", "fake_ascend", names)
}

/// A private copy of the fake Ascend library, linked under every name in [`ASCEND_NAMES`].
pub fn ascend_standard() -> Fake {
    ascend_with_links(&ASCEND_NAMES)
}

/// The config opening user device 0 from `fake` alone, with `ASCEND_RT_VISIBLE_DEVICES` unset
/// whatever the test process's environment says.
pub fn ascend_config(fake: &Fake) -> AscendConfig {
    AscendConfig {
        lib_dir: Some(fake.dir.clone()),
        visible_devices: VisibleDevices::Unset,
        ..AscendConfig::default()
    }
}

/// `threads` threads, each running `rounds` rounds over every device in `devs` (alternating
/// between them): alloc `len` bytes, copy a pattern of the thread and round in, copy it back,
/// check it, free.
pub fn round_trips_on_threads<D: Device + Send + Sync + 'static>(
    devs: &[Arc<D>],
    threads: u8,
    rounds: u8,
    len: usize,
) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let devs = devs.to_vec();
            std::thread::spawn(move || {
                for i in 0..rounds {
                    for d in &devs {
                        let p = d.alloc(len as u64).unwrap();
                        d.copy_h2d(p, &vec![t ^ i; len]).unwrap();
                        let mut out = vec![0u8; len];
                        d.copy_d2h(&mut out, p).unwrap();
                        assert_eq!(out, vec![t ^ i; len]);
                        d.free(p).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in handles {
        t.join().unwrap();
    }
}
