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
    let image = "FAKECUDA-MODULE 1\narch sm_90\nentry scale 3\n";
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
            Ok("Fake CUDA Device")
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
