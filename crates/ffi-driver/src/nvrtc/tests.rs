//! Tests that need no library, then one that needs a real NVRTC (ignored by default; it works
//! without a GPU). Run it with
//! `SIMPLER_NVRTC_TEST_LIB=<site-packages>/nvidia/cu13/lib cargo test -p simpler-driver nvrtc -- --include-ignored`
//! (`SIMPLER_NVRTC_TEST_LIB`: the library's folder or file; unset: the normal search).

use std::path::{Path, PathBuf};

use super::loading::SearchEnv;
use super::*;

#[test]
fn nvrtc_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Nvrtc>();
    check::<Arc<Nvrtc>>();
}

#[test]
fn targets_name_their_architecture() {
    let t = Target::Cubin { major: 9, minor: 0 };
    assert_eq!(t.arch_option(), "--gpu-architecture=sm_90");
    let t = Target::Ptx {
        major: 10,
        minor: 0,
    };
    assert_eq!(t.arch_option(), "--gpu-architecture=compute_100");
    assert_eq!(t.capability(), (10, 0));
}

fn input_error(source: &str, name: &str, options: &[&str], target: Target) -> String {
    let options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    match prepare(source, name, &options, target) {
        Err(e @ CompileError::Input { .. }) => e.to_string(),
        Err(e) => panic!("not an input error: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let sm90 = Target::Cubin { major: 9, minor: 0 };
    let msg = input_error("int x;\0int y;", "k.cu", &[], sm90);
    assert!(msg.contains("program `k.cu`"), "{msg}");
    assert!(
        msg.contains("invalid source: it contains a NUL byte at offset 6"),
        "{msg}"
    );
    let msg = input_error("int x;", "k\0.cu", &[], sm90);
    assert!(msg.contains("invalid program name"), "{msg}");
    let msg = input_error("int x;", "k.cu", &["-default-device", "-D\0X"], sm90);
    assert!(
        msg.contains("invalid option: it contains a NUL byte"),
        "{msg}"
    );
    let msg = input_error("int x;", "k.cu", &["-arch=sm_80"], sm90);
    assert!(msg.contains("`-arch=sm_80`: the target"), "{msg}");
    let msg = input_error("int x;", "k.cu", &["--gpu-architecture=sm_80"], sm90);
    assert!(msg.contains("sets the architecture"), "{msg}");
    let bad = Target::Ptx {
        major: 9,
        minor: 10,
    };
    let msg = input_error("int x;", "k.cu", &[], bad);
    assert!(msg.contains("compute capability 9.10"), "{msg}");
    assert!(prepare("int x;", "", &["-default-device".into()], sm90).is_ok());
}

#[test]
fn ptxas_resources_are_read_from_a_verbose_log() {
    // As NVRTC 13.5 writes it with --ptxas-options=-v.
    let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'pa_zero' for 'sm_90'
ptxas info    : Function properties for pa_zero
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers
ptxas info    : Compile time = 3.255 ms
ptxas info    : Compiling entry function 'pa_online_update' for 'sm_80'
ptxas info    : Function properties for pa_online_update
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 376 bytes cmem[0]
";
    let r = resources(log);
    assert_eq!(r.len(), 2);
    assert_eq!(
        r[0],
        Resources {
            entry: "pa_zero".into(),
            arch: "sm_90".into(),
            registers: 12,
            ..Resources::default()
        }
    );
    assert!(!r[0].spills());
    assert_eq!(
        (r[1].arch.as_str(), r[1].registers, r[1].barriers),
        ("sm_80", 255, 1)
    );
    assert_eq!(
        (
            r[1].stack_bytes,
            r[1].spill_store_bytes,
            r[1].spill_load_bytes
        ),
        (24, 8, 16)
    );
    assert!(r[1].spills());
    assert!(resources("nothing of ptxas here").is_empty());
    // A device function's properties are not its caller's.
    let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for helper
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 20 registers, used 0 barriers
";
    let r = resources(log);
    assert_eq!((r[0].registers, r[0].spill_store_bytes), (20, 0));
}

#[test]
fn compile_errors_show_the_log() {
    let e = CompileError::Nvrtc {
        call: "nvrtcCompileProgram",
        code: 6,
        code_name: "NVRTC_ERROR_COMPILATION".into(),
        program: "k.cu".into(),
        log: "k.cu(1): error: expected an expression\n".into(),
    };
    assert_eq!(
        e.to_string(),
        "nvrtcCompileProgram failed with code 6 (NVRTC_ERROR_COMPILATION) for NVRTC program \
         `k.cu`; compiler log:\nk.cu(1): error: expected an expression"
    );
    assert_eq!(e.log(), "k.cu(1): error: expected an expression\n");
}

/// NVRTC as the ignored test finds it: `SIMPLER_NVRTC_TEST_LIB` (a folder: searched first, or
/// the library file: the override), else the normal search.
fn real_nvrtc() -> Arc<Nvrtc> {
    let mut env = SearchEnv::from_process();
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("SIMPLER_NVRTC_TEST_LIB").filter(|v| !v.is_empty()) {
        if Path::new(&p).is_dir() {
            env.lib = None;
            dirs.push(PathBuf::from(p));
        } else {
            env.lib = Some(p);
        }
    }
    let search = loading::search(&env, &dirs);
    match choice::decide(&search, None, None, true) {
        Ok(c) => c.nvrtc,
        Err(e) => panic!("{e}"),
    }
}

const ADD_ONE: &str = r#"
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"#;

#[test]
#[ignore = "needs a real NVRTC: set SIMPLER_NVRTC_TEST_LIB to its folder or file"]
fn real_nvrtc_compiles_cubin_and_ptx_and_reports_errors() {
    let n = real_nvrtc();
    let (major, minor) = n.version();
    eprintln!(
        "NVRTC {major}.{minor} from {} (CUBIN calls: {})",
        n.library(),
        n.has_cubin()
    );
    assert!(major >= 12, "{major}.{minor}");

    let sm90 = Target::Cubin { major: 9, minor: 0 };
    let opts = vec!["--std=c++17".to_string(), "-default-device".to_string()];
    let cubin = n.compile(ADD_ONE, "add_one.cu", &opts, sm90).unwrap();
    assert_eq!(cubin.kind, ImageKind::Cubin);
    assert_eq!(&cubin.bytes[..4], b"\x7fELF");
    let sym = cubin.bytes.windows(7).any(|w| w == b"add_one");
    assert!(sym, "the CUBIN names the kernel");
    eprintln!("CUBIN: {} bytes, log {:?}", cubin.bytes.len(), cubin.log);

    let ptx_target = Target::Ptx { major: 9, minor: 0 };
    let ptx = n.compile(ADD_ONE, "add_one.cu", &[], ptx_target).unwrap();
    assert_eq!(ptx.kind, ImageKind::Ptx);
    assert_eq!(ptx.bytes.last(), Some(&0));
    assert_eq!(ptx.bytes.iter().filter(|&&b| b == 0).count(), 1);
    let text = std::str::from_utf8(&ptx.bytes[..ptx.bytes.len() - 1]).unwrap();
    assert!(text.contains(".target sm_90"), "{text}");
    assert!(text.contains(".entry add_one("), "{text}");
    eprintln!(
        "PTX: {} bytes; {}",
        ptx.bytes.len(),
        text.lines()
            .find(|l| l.starts_with(".version"))
            .unwrap_or("")
    );

    let broken = "extern \"C\" __global__ void broken(float* x) { x[0] = ; }\n";
    let e = n.compile(broken, "broken.cu", &[], sm90).unwrap_err();
    let msg = e.to_string();
    eprintln!("syntax error: {msg}");
    let CompileError::Nvrtc {
        call,
        code_name,
        program,
        log,
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(*call, "nvrtcCompileProgram");
    assert_eq!(code_name, "NVRTC_ERROR_COMPILATION");
    assert_eq!(program, "broken.cu");
    assert!(
        log.contains("broken.cu(1)") && log.contains("error"),
        "{log}"
    );
    assert!(msg.contains(log.trim_end()), "{msg}");

    let bad_opt = vec!["--no-such-option".to_string()];
    let e = n
        .compile(ADD_ONE, "add_one.cu", &bad_opt, sm90)
        .unwrap_err();
    eprintln!("bad option: {e}");
    assert!(matches!(&e, CompileError::Nvrtc { code: 5, .. }), "{e:?}");

    // The choice: made once per question, then the same for every caller.
    let dirs: Vec<PathBuf> = std::env::var_os("SIMPLER_NVRTC_TEST_LIB")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .into_iter()
        .collect();
    let a = choose(&dirs, None, Some((9, 0))).unwrap();
    let b = choose(&dirs, None, Some((9, 0))).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    eprintln!("{}", a.summary());
}
