//! The destructor of the DLPack capsules the Python layer hands out (`python/simpler/_dlpack.py`).
//!
//! DLPack (`dlpack.h`): a capsule named `"dltensor"` holds a `DLManagedTensor*`; a consumer
//! renames it `"used_dltensor"` and then owns the tensor (it calls its `deleter`). A capsule
//! dropped still named `"dltensor"` was never consumed, and its destructor must call the
//! deleter. A consumer that refuses the capsule (numpy, for CUDA memory) drops it with its own
//! error set; the destructor must then leave that error untouched, which only a C-level
//! destructor can do (it puts the error aside with `PyErr_Fetch` and back with `PyErr_Restore`
//! around the deleter). This is that destructor; the functions of the interpreter's C API it
//! calls are looked up in the running process (the interpreter that loaded us), once.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

type Obj = *mut c_void;

#[derive(Clone, Copy)]
struct PyApi {
    err_fetch: unsafe extern "C" fn(*mut Obj, *mut Obj, *mut Obj),
    err_restore: unsafe extern "C" fn(Obj, Obj, Obj),
    is_valid: unsafe extern "C" fn(Obj, *const c_char) -> c_int,
    get_pointer: unsafe extern "C" fn(Obj, *const c_char) -> *mut c_void,
}

static API: OnceLock<Option<PyApi>> = OnceLock::new();

const NAME: &[u8] = b"dltensor\0";

/// Offset of `deleter` in `DLManagedTensor`: a 48-byte `DLTensor` (data pointer, device
/// (2 x int32), ndim (int32), dtype (4 bytes), shape and strides pointers, byte_offset
/// (uint64)), then `manager_ctx` (a pointer).
const DELETER_OFFSET: usize = 56;

type Deleter = unsafe extern "C" fn(*mut c_void);

fn api() -> Option<PyApi> {
    *API.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        // SAFETY: each type is the C signature of the interpreter's function of that name
        // (`Python.h`, stable ABI); the process's own symbols stay loaded for its life.
        unsafe {
            Some(PyApi {
                err_fetch: *this.get(b"PyErr_Fetch\0").ok()?,
                err_restore: *this.get(b"PyErr_Restore\0").ok()?,
                is_valid: *this.get(b"PyCapsule_IsValid\0").ok()?,
                get_pointer: *this.get(b"PyCapsule_GetPointer\0").ok()?,
            })
        }
    })
}

/// `void destructor(PyObject *capsule)`: see the module docs. Called by the interpreter, with
/// the GIL held, when a capsule made with it is deallocated.
unsafe extern "C" fn destructor(capsule: Obj) {
    let Some(api) = api() else {
        return;
    };
    let (mut t, mut v, mut tb): (Obj, Obj, Obj) = Default::default();
    // SAFETY: the interpreter calls capsule destructors with the GIL held; fetch moves any
    // pending error into the three locals (owned references), restore moves it back.
    unsafe {
        (api.err_fetch)(&mut t, &mut v, &mut tb);
        if (api.is_valid)(capsule, NAME.as_ptr().cast()) != 0 {
            let managed = (api.get_pointer)(capsule, NAME.as_ptr().cast());
            if !managed.is_null() {
                // The deleter field of the `DLManagedTensor` the capsule holds.
                let field = managed
                    .cast::<u8>()
                    .add(DELETER_OFFSET)
                    .cast::<Option<Deleter>>();
                if let Some(deleter) = field.read_unaligned() {
                    deleter(managed);
                }
            }
        }
        (api.err_restore)(t, v, tb);
    }
}

/// The address of the destructor, for `PyCapsule_New`; `None` when the process has no Python
/// interpreter's C API (never, when called from the bindings).
pub fn dlpack_destructor_address() -> Option<usize> {
    api().map(|_| destructor as *const () as usize)
}
