//! What the driver tests share: the fake vendor libraries (`crates/fake-ascend`,
//! `crates/fake-cuda`), and [`conformance`], the checks every backend must pass alike.
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
use simpler_driver::{CloseReport, DevPtr, Device, DeviceError, HostMem, Op, Stats};

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
pub fn round_trips_on_threads(devs: &[&dyn Device], threads: u8, rounds: u8, len: usize) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..rounds {
                    for d in devs {
                        let p = d.alloc(len as u64).unwrap();
                        d.copy_h2d(p, &vec![t ^ i; len]).unwrap();
                        let mut out = vec![0u8; len];
                        d.copy_d2h(&mut out, p).unwrap();
                        assert_eq!(out, vec![t ^ i; len]);
                        d.free(p).unwrap();
                    }
                }
            });
        }
    });
}

/// The size of the allocation [`conformance`] works on.
pub const CONFORMANCE_BYTES: u64 = 1 << 16;

/// What [`conformance`] leaves for the backend's own assertions.
#[derive(Debug)]
pub struct Conformed {
    /// Its allocation of [`CONFORMANCE_BYTES`] (freed since).
    pub ptr: DevPtr,
    /// The refusal of its copy past the end of that allocation.
    pub refused: DeviceError,
    /// The counters just before the close.
    pub stats: Stats,
    /// What the close reported.
    pub close: CloseReport,
}

/// `[(op, addr, bytes, refused)]` of the call-log records after the first `from`.
fn calls_since(dev: &dyn Device, from: usize) -> Vec<(Op, u64, u64, bool)> {
    dev.call_log()[from..]
        .iter()
        .map(|c| (c.op, c.addr, c.bytes, c.code != 0))
        .collect()
}

/// What every backend must do identically, checked over `&dyn Device` (`what` names the backend
/// in failures); the device may hold allocations already, and is closed at the end:
/// * an allocation of [`CONFORMANCE_BYTES`]; `copy_h2d` then `copy_d2h` gives the bytes back
///   exactly, whole or from an offset; `fill` sets exactly the bytes asked for;
/// * a copy (either way) or fill past the end of an allocation, a free of an address that is no
///   allocation's start and a second free are refused with a `DeviceError` naming the address
///   (and size), logged as a failed call and never counted; nothing crashes;
/// * `copy_h2d_async` from a mirror or from ordinary host memory delivers the bytes by
///   `synchronize()`; a range past the host block is refused before any call;
/// * threads doing round trips concurrently;
/// * every counter moves by exactly what the calls above did, in the call log's order;
/// * `close` frees what is still live and leaves nothing live.
pub fn conformance(dev: &dyn Device, what: &str) -> Conformed {
    const N: u64 = CONFORMANCE_BYTES;
    let n = N as usize;
    let s0 = dev.stats();
    let log0 = dev.call_log().len();

    let p = dev.alloc(N).unwrap();
    let s = dev.stats();
    assert_eq!(
        (s.allocs, s.live_allocations, s.live_bytes, s.peak_bytes),
        (
            s0.allocs + 1,
            s0.live_allocations + 1,
            s0.live_bytes + N,
            s0.peak_bytes.max(s0.live_bytes + N)
        ),
        "{what}: alloc counters"
    );

    // The round trip: whole, and from an offset.
    let data: Vec<u8> = (0..N as u32).map(|i| (i * 7) as u8).collect();
    dev.copy_h2d(p, &data).unwrap();
    let mut out = vec![0u8; n];
    dev.copy_d2h(&mut out, p).unwrap();
    assert!(
        out == data,
        "{what}: copy_d2h gives back what copy_h2d wrote"
    );
    let mut part = vec![0u8; 4096];
    dev.copy_d2h(&mut part, DevPtr(p.0 + 1000)).unwrap();
    assert_eq!(
        part[..],
        data[1000..1000 + 4096],
        "{what}: copy from an offset"
    );

    // fill sets exactly its bytes.
    dev.fill(DevPtr(p.0 + 8), 16, 0xA5).unwrap();
    dev.copy_d2h(&mut out, p).unwrap();
    assert_eq!(out[..8], data[..8], "{what}: fill left the bytes before it");
    assert_eq!(out[8..24], [0xA5; 16], "{what}: fill");
    assert!(
        out[24..] == data[24..],
        "{what}: fill left the bytes after it"
    );

    // Past the end: refused, named, logged, not counted.
    let before = dev.stats();
    let end = DevPtr(p.0 + N - 1);
    let refused = dev.copy_h2d(end, &[0, 0]).unwrap_err();
    assert_eq!(
        (refused.op, refused.addr, refused.bytes),
        (Op::H2d, Some(end.0), Some(2)),
        "{what}: {refused}"
    );
    let msg = refused.to_string();
    assert!(
        msg.contains(&format!("{end}")) && msg.contains("2 bytes"),
        "{what}: {msg}"
    );
    assert!(msg.contains("runs past its allocation"), "{what}: {msg}");
    let e = dev.copy_d2h(&mut [0u8; 4], DevPtr(p.0 + N)).unwrap_err();
    assert_eq!(
        (e.op, e.addr, e.bytes),
        (Op::D2h, Some(p.0 + N), Some(4)),
        "{what}: {e}"
    );
    let e = dev.fill(DevPtr(p.0 + N - 4), 8, 0).unwrap_err();
    assert_eq!(
        (e.op, e.addr, e.bytes),
        (Op::Memset, Some(p.0 + N - 4), Some(8)),
        "{what}: {e}"
    );
    let e = dev.free(DevPtr(p.0 + 1)).unwrap_err();
    assert_eq!((e.op, e.addr), (Op::Free, Some(p.0 + 1)), "{what}: {e}");
    assert_eq!(dev.stats(), before, "{what}: refused calls are not counted");
    assert_eq!(
        calls_since(dev, log0),
        [
            (Op::Alloc, p.0, N, false),
            (Op::H2d, p.0, N, false),
            (Op::D2h, p.0, N, false),
            (Op::D2h, p.0 + 1000, 4096, false),
            (Op::Memset, p.0 + 8, 16, false),
            (Op::D2h, p.0, N, false),
            (Op::H2d, end.0, 2, true),
            (Op::D2h, p.0 + N, 4, true),
            (Op::Memset, p.0 + N - 4, 8, true),
            (Op::Free, p.0 + 1, 0, true),
        ],
        "{what}: the call log"
    );

    // Asynchronous uploads: from a mirror, from ordinary host memory, and refused past the
    // host block.
    let mirror = dev.alloc_mirror(n).unwrap();
    mirror.write(0, &[0x11; 4096]).unwrap();
    dev.copy_h2d_async(p, &mirror, 0, 4096).unwrap();
    let host = Arc::new(HostMem::new(n, 0x33).unwrap());
    dev.copy_h2d_async(DevPtr(p.0 + 4096), &host, 16, n - 4096)
        .unwrap();
    dev.synchronize().unwrap();
    dev.free_mirror(&mirror).unwrap();
    dev.copy_d2h(&mut out, p).unwrap();
    assert!(
        out[..4096].iter().all(|&b| b == 0x11) && out[4096..].iter().all(|&b| b == 0x33),
        "{what}: copy_h2d_async delivers by synchronize"
    );
    let small = dev.alloc_mirror(64).unwrap();
    let counted = dev.stats().h2d_calls;
    let e = dev.copy_h2d_async(p, &small, 32, 64).unwrap_err();
    assert!(
        !e.called && e.addr == Some(p.0) && e.bytes == Some(64),
        "{what}: {e}"
    );
    assert!(
        e.to_string().contains("runs past a block of"),
        "{what}: {e}"
    );
    assert_eq!(
        dev.stats().h2d_calls,
        counted,
        "{what}: a refused copy is not counted"
    );
    dev.free_mirror(&small).unwrap();

    // Free; a second free and a copy into freed memory are refused.
    dev.free(p).unwrap();
    let last = dev
        .call_log()
        .pop()
        .map(|c| (c.op, c.addr, c.bytes, c.code));
    assert_eq!(last, Some((Op::Free, p.0, N, 0)), "{what}: the free logged");
    let e = dev.free(p).unwrap_err();
    assert_eq!((e.op, e.addr), (Op::Free, Some(p.0)), "{what}: {e}");
    assert!(e.to_string().contains("already freed"), "{what}: {e}");
    assert!(
        dev.copy_h2d(p, &[1]).is_err(),
        "{what}: copy into freed memory"
    );

    // Threads.
    let (threads, rounds, len) = (4u64, 4u64, 256u64);
    round_trips_on_threads(&[dev], threads as u8, rounds as u8, len as usize);
    let trips = threads * rounds;

    let s = dev.stats();
    let moved = (
        s.allocs - s0.allocs,
        s.frees - s0.frees,
        s.h2d_calls - s0.h2d_calls,
        s.h2d_bytes - s0.h2d_bytes,
        s.d2h_calls - s0.d2h_calls,
        s.d2h_bytes - s0.d2h_bytes,
        s.memset_calls - s0.memset_calls,
        s.memset_bytes - s0.memset_bytes,
    );
    assert_eq!(
        moved,
        (
            1 + trips,
            1 + trips,
            3 + trips,
            2 * N + trips * len,
            4 + trips,
            3 * N + 4096 + trips * len,
            1,
            16
        ),
        "{what}: (allocs, frees, h2d calls, bytes, d2h calls, bytes, memset calls, bytes) moved"
    );
    assert_eq!(
        (s.live_allocations, s.live_bytes),
        (s0.live_allocations, s0.live_bytes),
        "{what}: nothing left live"
    );
    assert_eq!(
        (s.maps, s.map_refusals, s.unmaps, s.live_mappings),
        (s0.maps, s0.map_refusals, s0.unmaps, s0.live_mappings),
        "{what}: no mapping calls"
    );

    // Close frees what is still live.
    let q = dev.alloc(64).unwrap();
    let stats = dev.stats();
    let close = dev.close();
    assert!(close.errors.is_empty(), "{what}: {:?}", close.errors);
    assert_eq!(
        (
            close.leaked_allocations,
            close.leaked_bytes,
            close.leaked_mappings
        ),
        (
            stats.live_allocations,
            stats.live_bytes,
            stats.live_mappings
        ),
        "{what}: close reports what was live ({q} among it)"
    );
    let s = dev.stats();
    assert_eq!(
        (s.live_allocations, s.live_bytes, s.live_mappings),
        (0, 0, 0),
        "{what}: close leaves nothing live"
    );
    Conformed {
        ptr: p,
        refused,
        stats,
        close,
    }
}
