//! Facts about the process the driver runs in, read from what it exports.
//!
//! The bindings need one: whether the Python interpreter hosting the process is finalizing (a
//! thread must not take the GIL back then; see the bindings' `shutdown.rs`). CPython exports
//! the flag as `Py_IsFinalizing` (3.13 on) or `_Py_IsFinalizing` (before), an `int f(void)`
//! that reads one runtime field and needs no thread state; where neither is exported (the
//! library outside Python) the answer is `None`.

use std::os::raw::c_int;
use std::sync::OnceLock;

type Flag = unsafe extern "C" fn() -> c_int;

fn finalizing_flag() -> Option<Flag> {
    static FLAG: OnceLock<Option<Flag>> = OnceLock::new();
    *FLAG.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        let found = [&b"Py_IsFinalizing\0"[..], &b"_Py_IsFinalizing\0"[..]]
            .into_iter()
            // SAFETY: where the process exports these names they are CPython's `int f(void)`
            // finalization flag; the pointer is copied out of the symbol and stays valid for
            // the process's life (the executable, or libpython, is never unloaded).
            .find_map(|name| unsafe { this.get::<Flag>(name) }.ok().map(|s| *s));
        // The handle of the running program: nothing to close.
        std::mem::forget(this);
        found
    })
}

/// Whether the Python interpreter hosting this process is finalizing; `None` when the process
/// exports no such flag (not a Python process).
pub fn python_finalizing() -> Option<bool> {
    // SAFETY: an `int f(void)` reading one field of CPython's runtime state, documented as
    // callable from any thread without the GIL (`Py_IsFinalizing`, 3.13), as its private
    // predecessor is.
    finalizing_flag().map(|f| unsafe { f() } != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn outside_python_there_is_no_answer() {
        // A Rust test binary exports no CPython symbols.
        assert_eq!(super::python_finalizing(), None);
    }
}
