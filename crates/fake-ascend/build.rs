//! Builds the fake runtime's dependency (`libc_sec.so`, from `csrc/c_sec.c`) and links the fake
//! against it with the runtime's SONAME (`libascendcl.so`) and no RPATH, as CANN's libraries
//! are: loading the fake by path fails until the dependency is found (beside it, or on
//! `LD_LIBRARY_PATH`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src = "csrc/c_sec.c";
    println!("cargo:rerun-if-changed={src}");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wl,-soname,libc_sec.so", "-o"])
        .arg(out.join("libc_sec.so"))
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "{cc} failed to build libc_sec.so");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=dylib=c_sec");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libascendcl.so");
}
