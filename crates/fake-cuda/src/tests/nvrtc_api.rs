//! The fake NVRTC, and the device attributes a driver compiles for.

use std::ffi::{c_char, c_int, CStr};
use std::ptr;

use super::*;
use crate::nvrtc::*;

fn program(src: &CStr) -> nvrtcProgram {
    let mut p: nvrtcProgram = ptr::null_mut();
    // SAFETY: valid out pointer and NUL-terminated strings; no headers.
    let rc = unsafe {
        nvrtcCreateProgram(
            &mut p,
            src.as_ptr(),
            ptr::null(),
            0,
            ptr::null(),
            ptr::null(),
        )
    };
    assert_eq!(rc, NVRTC_SUCCESS);
    p
}

fn compile_with(p: nvrtcProgram, opts: &[&CStr]) -> nvrtcResult {
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `ptrs` holds `ptrs.len()` NUL-terminated options.
    unsafe { nvrtcCompileProgram(p, ptrs.len() as c_int, ptrs.as_ptr()) }
}

/// Output `which` ("ptx", "cubin", "log") of `p`: its text (without the NUL), or the code.
fn output(p: nvrtcProgram, which: &str) -> Result<String, nvrtcResult> {
    type SizeFn = unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult;
    type GetFn = unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult;
    let (size, get): (SizeFn, GetFn) = match which {
        "ptx" => (nvrtcGetPTXSize, nvrtcGetPTX),
        "cubin" => (nvrtcGetCUBINSize, nvrtcGetCUBIN),
        _ => (nvrtcGetProgramLogSize, nvrtcGetProgramLog),
    };
    let mut n = 0usize;
    // SAFETY: `n` is a valid out pointer; `buf` holds the size the first call gave.
    unsafe {
        match size(p, &mut n) {
            NVRTC_SUCCESS => {}
            code => return Err(code),
        }
        let mut buf = vec![0u8; n];
        assert_eq!(get(p, buf.as_mut_ptr().cast()), NVRTC_SUCCESS);
        assert_eq!(buf.pop(), Some(0), "NUL-terminated");
        Ok(String::from_utf8(buf).unwrap())
    }
}

#[test]
fn nvrtc_compiles_entries_logs_errors_and_has_cubins_only_for_real_targets() {
    let _serial = serial();
    fake_cuda_reset();
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out pointers; null ones are refused.
    unsafe {
        assert_eq!(nvrtcVersion(&mut major, &mut minor), NVRTC_SUCCESS);
        assert_eq!(
            nvrtcVersion(ptr::null_mut(), &mut minor),
            NVRTC_ERROR_INVALID_INPUT
        );
    }
    assert_eq!((major, minor), (13, 0));
    for (code, s) in [
        (0, "NVRTC_SUCCESS"),
        (6, "NVRTC_ERROR_COMPILATION"),
        (77, "NVRTC_ERROR unknown"),
    ] {
        // SAFETY: a static NUL-terminated string.
        let got = unsafe { CStr::from_ptr(nvrtcGetErrorString(code)) };
        assert_eq!(got.to_str(), Ok(s));
    }

    let src =
        c"extern \"C\" __global__ void\n  scale(float *x, float a, unsigned long long n) {}\n";
    let p = program(src);
    assert_eq!(
        output(p, "ptx"),
        Err(NVRTC_ERROR_INVALID_PROGRAM),
        "not compiled yet"
    );
    assert_eq!(output(p, "log").as_deref(), Ok(""));
    assert_eq!(
        compile_with(p, &[c"-arch=sm_90", c"--use_fast_math"]),
        NVRTC_SUCCESS
    );
    let image = "FAKECUDA-MODULE 1\narch sm_90\ncuda 13.0\nentry scale 3\n";
    assert_eq!(output(p, "ptx").as_deref(), Ok(image));
    assert_eq!(output(p, "cubin").as_deref(), Ok(image));
    assert_eq!(compile_with(p, &[c"-arch", c"compute_90"]), NVRTC_SUCCESS);
    assert_eq!(
        output(p, "cubin"),
        Err(NVRTC_ERROR_INVALID_INPUT),
        "a virtual target has no cubin"
    );
    assert!(output(p, "ptx").unwrap().contains("arch compute_90\n"));
    assert_eq!(compile_with(p, &[]), NVRTC_SUCCESS);
    assert_eq!(output(p, "cubin"), Err(NVRTC_ERROR_INVALID_INPUT));
    assert!(output(p, "ptx").unwrap().contains("arch none\n"));
    assert_eq!(compile_with(p, &[c"O3"]), NVRTC_ERROR_INVALID_OPTION);
    assert!(output(p, "log")
        .unwrap()
        .contains("unrecognized option 'O3'"));
    assert_eq!(
        output(p, "ptx"),
        Err(NVRTC_ERROR_INVALID_PROGRAM),
        "the last compile failed"
    );
    assert_eq!(
        compile_with(p, &[c"--gpu-architecture=sm_12"]),
        NVRTC_ERROR_INVALID_OPTION,
        "no such architecture"
    );
    assert_eq!(
        output(p, "log").as_deref(),
        Ok("nvrtc error: invalid value for --gpu-architecture (-arch)\n")
    );
    assert_eq!(
        compile_with(p, &[c"--gpu-architecture=sm_120"]),
        NVRTC_SUCCESS
    );
    // SAFETY: a null options array with a count is refused; a null out pointer too.
    unsafe {
        assert_eq!(
            nvrtcCompileProgram(p, 1, ptr::null()),
            NVRTC_ERROR_INVALID_INPUT
        );
        assert_eq!(
            nvrtcGetPTXSize(p, ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
    }
    assert_eq!(fake_nvrtc_compile_count(), 4);

    let bad = program(c"#if __CUDA_ARCH__ < 800\n#error needs sm_80\n#endif\n");
    assert_eq!(compile_with(bad, &[]), NVRTC_ERROR_COMPILATION);
    let log = output(bad, "log").unwrap();
    assert!(
        log.starts_with("default_program(2): catastrophic error: #error directive: needs sm_80\n"),
        "{log}"
    );
    let none =
        program(c"__device__ int f(int x) { return x; } /* extern \"C\" __global__ void k() */");
    assert_eq!(compile_with(none, &[]), NVRTC_ERROR_COMPILATION);
    assert!(output(none, "log")
        .unwrap()
        .contains("no extern \"C\" __global__ function"));
    assert_eq!(fake_nvrtc_compile_count(), 4);
    assert_eq!(fake_nvrtc_live_programs(), 3);

    // Create/destroy checks.
    let mut q: nvrtcProgram = ptr::null_mut();
    let headers = [ptr::null::<c_char>()];
    // SAFETY: valid or null pointers, checked by the fake.
    unsafe {
        let rc = nvrtcCreateProgram(
            &mut q,
            ptr::null(),
            ptr::null(),
            0,
            ptr::null(),
            ptr::null(),
        );
        assert_eq!(rc, NVRTC_ERROR_INVALID_INPUT);
        let rc = nvrtcCreateProgram(
            &mut q,
            src.as_ptr(),
            ptr::null(),
            1,
            headers.as_ptr(),
            headers.as_ptr(),
        );
        assert_eq!(rc, NVRTC_ERROR_INVALID_INPUT);
        let mut dead = 0x1234usize as nvrtcProgram;
        assert_eq!(nvrtcDestroyProgram(&mut dead), NVRTC_ERROR_INVALID_PROGRAM);
        assert_eq!(
            nvrtcDestroyProgram(ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
        for mut prog in [p, bad, none] {
            assert_eq!(nvrtcDestroyProgram(&mut prog), NVRTC_SUCCESS);
            assert!(prog.is_null());
        }
    }
    assert_eq!(compile_with(p, &[]), NVRTC_ERROR_INVALID_PROGRAM);
    assert_eq!(output(p, "log"), Err(NVRTC_ERROR_INVALID_PROGRAM));
    assert_eq!(fake_nvrtc_live_programs(), 0);

    // Injection, and the call log.
    // SAFETY: a NUL-terminated name.
    unsafe {
        fake_cuda_inject(
            c"nvrtcCompileProgram".as_ptr(),
            1,
            NVRTC_ERROR_OUT_OF_MEMORY,
        )
    };
    let q = program(src);
    assert_eq!(compile_with(q, &[]), NVRTC_ERROR_OUT_OF_MEMORY);
    assert_eq!(compile_with(q, &[]), NVRTC_SUCCESS);
    let mut q = q;
    // SAFETY: a live program.
    assert_eq!(unsafe { nvrtcDestroyProgram(&mut q) }, NVRTC_SUCCESS);
    let log = call_log();
    assert!(log.contains("nvrtcCompileProgram "), "{log}");
    assert!(log.contains(" [] -> 1 (injected)\n"), "{log}");
    assert!(
        log.contains(" [-arch=sm_90 --use_fast_math] -> 0\n"),
        "{log}"
    );
}

#[test]
fn devices_report_a_name_and_the_compute_capability() {
    let dev = Dev::new();
    let attr = |a: c_int, d: CUdevice| {
        let mut v = -1;
        // SAFETY: `v` is a valid out pointer.
        match unsafe { cuDeviceGetAttribute(&mut v, a, d) } {
            CUDA_SUCCESS => Ok(v),
            code => Err(code),
        }
    };
    assert_eq!(attr(75, 0), Ok(9));
    assert_eq!(attr(76, 1), Ok(0));
    assert_eq!(attr(16, 0), Ok(132));
    assert_eq!(attr(1, 0), Ok(1024));
    assert_eq!(attr(9999, 0), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(attr(75, 2), Err(CUDA_ERROR_INVALID_DEVICE));
    with_state(|st| st.cc = (8, 6));
    assert_eq!((attr(75, 0), attr(76, 0)), (Ok(8), Ok(6)));
    // Code for 9.0 does not load on 8.6; 8.0 code does.
    assert_eq!(
        load(&compile(KERNELS, &["-arch=compute_90"]).unwrap()),
        Err(CUDA_ERROR_NO_BINARY_FOR_GPU)
    );
    let m = load(&compile(KERNELS, &["-arch=sm_80"]).unwrap()).unwrap();
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    fake_cuda_reset();
    assert_eq!(
        attr(75, 0),
        Ok(9),
        "reset re-reads FAKE_CUDA_CC (unset: 9.0)"
    );

    let mut name = [0x7fu8 as c_char; 32];
    // SAFETY: `name` holds the given number of bytes.
    unsafe {
        assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 32, 0), CUDA_SUCCESS);
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str(),
            Ok("Fake CUDA device (H200-like)")
        );
        assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 5, 0), CUDA_SUCCESS);
        assert_eq!(CStr::from_ptr(name.as_ptr()).to_str(), Ok("Fake"));
        assert_eq!(
            cuDeviceGetName(name.as_mut_ptr(), 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuDeviceGetName(name.as_mut_ptr(), 32, 9),
            CUDA_ERROR_INVALID_DEVICE
        );
    }
    dev.finish();
}

/// `nvrtcVersion` of this process's NVRTC.
fn nvrtc_version() -> (c_int, c_int) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out pointers.
    let rc = unsafe { nvrtcVersion(&mut major, &mut minor) };
    assert_eq!(rc, NVRTC_SUCCESS);
    (major, minor)
}

/// The architectures NVRTC answers through `nvrtcGetNumSupportedArchs` and
/// `nvrtcGetSupportedArchs` (any copy's: the functions are passed in).
fn archs_of(
    num: unsafe extern "C" fn(*mut c_int) -> nvrtcResult,
    get: unsafe extern "C" fn(*mut c_int) -> nvrtcResult,
) -> Vec<c_int> {
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer; `v` holds the count the first call gave.
    unsafe {
        assert_eq!(num(&mut n), NVRTC_SUCCESS);
        let mut v = vec![0; n as usize];
        assert_eq!(get(v.as_mut_ptr()), NVRTC_SUCCESS);
        v
    }
}

const V12_0: [c_int; 14] = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
const V13_0: [c_int; 12] = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

#[test]
fn the_nvrtc_version_decides_the_architectures() {
    let _serial = serial();
    fake_cuda_reset();
    // This test binary is no `libnvrtc.so.*`: the environment decides, else 13.0.
    std::env::remove_var("FAKE_NVRTC_VERSION");
    assert_eq!(nvrtc_version(), (13, 0));
    assert_eq!(
        archs_of(nvrtcGetNumSupportedArchs, nvrtcGetSupportedArchs),
        V13_0
    );
    let p = program(c"extern \"C\" __global__ void k(int *x) {}");
    assert_eq!(
        compile_with(p, &[c"-arch=sm_52"]),
        NVRTC_ERROR_INVALID_OPTION
    );
    assert_eq!(
        output(p, "log").as_deref(),
        Ok("nvrtc error: invalid value for --gpu-architecture (-arch)\n")
    );
    assert_eq!(compile_with(p, &[c"-arch=sm_110"]), NVRTC_SUCCESS);
    assert_eq!(compile_with(p, &[c"-arch", c"compute_100f"]), NVRTC_SUCCESS);
    std::env::set_var("FAKE_NVRTC_VERSION", "12.4");
    assert_eq!(nvrtc_version(), (12, 4));
    assert_eq!(
        archs_of(nvrtcGetNumSupportedArchs, nvrtcGetSupportedArchs),
        V12_0
    );
    assert_eq!(compile_with(p, &[c"-arch=sm_52"]), NVRTC_SUCCESS);
    assert!(output(p, "ptx")
        .unwrap()
        .contains("arch sm_52\ncuda 12.4\n"));
    assert_eq!(
        compile_with(p, &[c"-arch=sm_100"]),
        NVRTC_ERROR_INVALID_OPTION
    );
    assert_eq!(compile_with(p, &[c"-arch=sm_90a"]), NVRTC_SUCCESS);
    std::env::set_var("FAKE_NVRTC_VERSION", "12.8");
    let v12_8 = archs_of(nvrtcGetNumSupportedArchs, nvrtcGetSupportedArchs);
    assert_eq!(v12_8, [&V12_0[..], &[100, 101, 120]].concat());
    assert_eq!(compile_with(p, &[c"-arch=sm_120"]), NVRTC_SUCCESS);
    std::env::set_var("FAKE_NVRTC_VERSION", "12");
    assert_eq!(nvrtc_version(), (12, 0));
    std::env::set_var("FAKE_NVRTC_VERSION", "twelve");
    assert_eq!(nvrtc_version(), (13, 0), "an invalid value is ignored");
    assert!(call_log().contains("fake_cuda config error: FAKE_NVRTC_VERSION=\"twelve\"\n"));
    std::env::remove_var("FAKE_NVRTC_VERSION");
    // SAFETY: null out pointers are refused.
    unsafe {
        assert_eq!(
            nvrtcGetNumSupportedArchs(ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
        assert_eq!(
            nvrtcGetSupportedArchs(ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
    }
    let mut p = p;
    // SAFETY: a live program.
    assert_eq!(unsafe { nvrtcDestroyProgram(&mut p) }, NVRTC_SUCCESS);
    assert_eq!(
        crate::nvrtc::version_of_file("/x/libnvrtc.so.12.8.93"),
        Some((12, 8))
    );
    assert_eq!(
        crate::nvrtc::version_of_file("libnvrtc.so.13"),
        Some((13, 0))
    );
    assert_eq!(crate::nvrtc::version_of_file("/x/libnvrtc.so"), None);
    assert_eq!(crate::nvrtc::version_of_file("/x/libnvrtc.so.13.x"), None);
    assert_eq!(crate::nvrtc::version_of_file("/x/libcuda.so.1"), None);
}

/// One loaded copy of this library under an NVRTC file name.
struct Copy {
    lib: libloading::Library,
    dir: PathBuf,
}

impl Copy {
    /// Copies the library into a folder of its own as `name` and loads it.
    fn load(name: &str) -> Copy {
        let dir =
            std::env::temp_dir().join(format!("fake-cuda-nvrtc-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(library(), dir.join(name)).unwrap();
        // SAFETY: the fake's initializers are Rust statics only; each copy is a separate object
        // with state of its own.
        let lib = unsafe { libloading::Library::new(dir.join(name)) }.unwrap();
        Copy { lib, dir }
    }

    /// A symbol of this copy.
    ///
    /// # Safety
    /// `T` must be the symbol's exact type.
    unsafe fn sym<T: std::marker::Copy>(&self, name: &str) -> T {
        // SAFETY: per this function's contract.
        unsafe { *self.lib.get::<T>(name.as_bytes()).unwrap() }
    }

    fn version(&self) -> (c_int, c_int) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `nvrtcResult nvrtcVersion(int *, int *)`; valid out pointers.
        let rc = unsafe {
            self.sym::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> nvrtcResult>("nvrtcVersion")(
                &mut major, &mut minor,
            )
        };
        assert_eq!(rc, NVRTC_SUCCESS);
        (major, minor)
    }

    fn archs(&self) -> Vec<c_int> {
        type Archs = unsafe extern "C" fn(*mut c_int) -> nvrtcResult;
        // SAFETY: both are `nvrtcResult name(int *)`.
        unsafe {
            archs_of(
                self.sym::<Archs>("nvrtcGetNumSupportedArchs"),
                self.sym::<Archs>("nvrtcGetSupportedArchs"),
            )
        }
    }

    /// Compiles `src` for `arch` with this copy: its PTX text, or the code.
    fn compile(&self, src: &CStr, arch: &CStr) -> Result<String, nvrtcResult> {
        type Create = unsafe extern "C" fn(
            *mut nvrtcProgram,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> nvrtcResult;
        type Compile =
            unsafe extern "C" fn(nvrtcProgram, c_int, *const *const c_char) -> nvrtcResult;
        type Size = unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult;
        type Get = unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult;
        type Destroy = unsafe extern "C" fn(*mut nvrtcProgram) -> nvrtcResult;
        let mut p: nvrtcProgram = ptr::null_mut();
        let opts = [arch.as_ptr()];
        // SAFETY: each type is the `nvrtc.h` signature of its symbol; valid pointers, and a
        // buffer of the size the size call gave.
        unsafe {
            let rc = self.sym::<Create>("nvrtcCreateProgram")(
                &mut p,
                src.as_ptr(),
                ptr::null(),
                0,
                ptr::null(),
                ptr::null(),
            );
            assert_eq!(rc, NVRTC_SUCCESS);
            let rc = self.sym::<Compile>("nvrtcCompileProgram")(p, 1, opts.as_ptr());
            let out = if rc == NVRTC_SUCCESS {
                let mut n = 0usize;
                assert_eq!(
                    self.sym::<Size>("nvrtcGetPTXSize")(p, &mut n),
                    NVRTC_SUCCESS
                );
                let mut buf = vec![0u8; n];
                let rc = self.sym::<Get>("nvrtcGetPTX")(p, buf.as_mut_ptr().cast());
                assert_eq!(rc, NVRTC_SUCCESS);
                buf.pop();
                Ok(String::from_utf8(buf).unwrap())
            } else {
                Err(rc)
            };
            assert_eq!(
                self.sym::<Destroy>("nvrtcDestroyProgram")(&mut p),
                NVRTC_SUCCESS
            );
            out
        }
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        // The copy stays mapped (a library is never closed); removing its file is fine.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn two_copies_named_for_two_versions_are_two_nvrtcs() {
    let _serial = serial();
    let old = Copy::load("libnvrtc.so.12");
    let new = Copy::load("libnvrtc.so.13");
    let mid = Copy::load("libnvrtc.so.12.8");
    assert_eq!(old.version(), (12, 0));
    assert_eq!(new.version(), (13, 0));
    assert_eq!(mid.version(), (12, 8));
    assert_eq!(old.archs(), V12_0);
    assert_eq!(new.archs(), V13_0);
    assert!(mid.archs().ends_with(&[90, 100, 101, 120]));
    let src = c"extern \"C\" __global__ void k(float *x) {}";
    let ptx = old.compile(src, c"--gpu-architecture=compute_52").unwrap();
    assert_eq!(
        ptx,
        "FAKECUDA-MODULE 1\narch compute_52\ncuda 12.0\nentry k 1\n"
    );
    assert_eq!(
        new.compile(src, c"--gpu-architecture=compute_52"),
        Err(NVRTC_ERROR_INVALID_OPTION)
    );
    assert_eq!(
        old.compile(src, c"-arch=sm_120"),
        Err(NVRTC_ERROR_INVALID_OPTION)
    );
    assert!(mid
        .compile(src, c"-arch=sm_120")
        .unwrap()
        .contains("cuda 12.8\n"));
    assert!(new
        .compile(src, c"-arch=sm_121")
        .unwrap()
        .contains("cuda 13.0\n"));
    // The copies have states of their own: this process's NVRTC counted none of that.
    assert_eq!(nvrtc_version(), (13, 0));
}

#[test]
fn devices_report_h200_like_facts() {
    let dev = Dev::new();
    let attr = |a: c_int| {
        let mut v = -1;
        // SAFETY: `v` is a valid out pointer.
        match unsafe { cuDeviceGetAttribute(&mut v, a, 0) } {
            CUDA_SUCCESS => Ok(v),
            code => Err(code),
        }
    };
    let total = || {
        let mut n = 0usize;
        // SAFETY: `n` is a valid out pointer.
        match unsafe { cuDeviceTotalMem_v2(&mut n, 0) } {
            CUDA_SUCCESS => Ok(n),
            code => Err(code),
        }
    };
    for (a, v) in [
        (1, 1024),
        (8, 49152),
        (97, 232448),
        (16, 132),
        (13, 1_980_000),
        (36, 2_619_000),
        (37, 6144),
    ] {
        assert_eq!(attr(a), Ok(v), "attribute {a}");
    }
    assert_eq!(attr(98), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(total(), Ok(150_754_820_096));
    // SAFETY: a null out pointer is refused; device 2 does not exist.
    unsafe {
        assert_eq!(
            cuDeviceTotalMem_v2(ptr::null_mut(), 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut n = 0usize;
        assert_eq!(cuDeviceTotalMem_v2(&mut n, 2), CUDA_ERROR_INVALID_DEVICE);
    }
    // The environment, read on first use and by reset.
    std::env::set_var("FAKE_CUDA_SM_COUNT", "66");
    std::env::set_var("FAKE_CUDA_SHARED_OPTIN", "101376");
    std::env::set_var("FAKE_CUDA_TOTAL_MEM", "65536");
    fake_cuda_reset();
    std::env::remove_var("FAKE_CUDA_SM_COUNT");
    std::env::remove_var("FAKE_CUDA_SHARED_OPTIN");
    std::env::remove_var("FAKE_CUDA_TOTAL_MEM");
    assert_eq!(
        (attr(16), attr(97), total()),
        (Ok(66), Ok(101376), Ok(65536))
    );
    // No more memory is handed out than the device has.
    let a = alloc(40_000).unwrap();
    assert_eq!(alloc(30_000), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let b = alloc(25_536).unwrap();
    assert_eq!(alloc(1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
    let c = alloc(1).unwrap();
    for p in [b, c] {
        assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
    }
    fake_cuda_reset();
    assert_eq!((attr(16), total()), (Ok(132), Ok(150_754_820_096)));
    dev.finish();
}
