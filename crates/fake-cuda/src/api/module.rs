//! Modules, functions and launches.
//!
//! `cuModuleLoadData` accepts only images of the fake NVRTC ([`crate::image`]). A launch is
//! checked and its parameter values are copied at call time; it then runs, in stream order, the
//! host function registered for its entry ([`crate::exec`]).

use std::ffi::{c_char, c_uint, c_void, CStr, CString};

use super::stream::{finish, submit};
use crate::exec::{Launch, Op, Work};
use crate::image::{runs_on, Image};
use crate::{
    export, with_state, CUdevice, CUfunction, CUmodule, CUresult, CUstream, State,
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_SUCCESS,
};

/// A loaded module.
pub struct Module {
    pub dev: CUdevice,
    pub image: Image,
}

/// A function got from a module.
pub struct Function {
    pub module: usize,
    pub entry: String,
    pub params: u32,
}

/// Largest `sharedMemBytes` of a launch (the static limit of a block).
const MAX_SHARED: c_uint = 48 << 10;

/// Checks that `m` is a loaded module of `dev`; logs a failure.
fn own_module(
    st: &mut State,
    (name, args): (&str, &str),
    m: usize,
    dev: CUdevice,
) -> Result<(), CUresult> {
    match st.modules.get(&m).map(|md| md.dev) {
        None => Err(st.ret(name, args, CUDA_ERROR_INVALID_HANDLE)),
        Some(owner) if owner != dev => {
            let note = st.wrong_context("module", owner, dev);
            Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_HANDLE))
        }
        Some(_) => Ok(()),
    }
}

/// `CUresult cuModuleLoadData(CUmodule *module, const void *image)`: only a fake NVRTC image
/// (else `CUDA_ERROR_INVALID_IMAGE`) for an architecture the device runs (else
/// `CUDA_ERROR_NO_BINARY_FOR_GPU`).
///
/// # Safety
/// `module` must be null or valid for a write of one `CUmodule`; `image` must be null or
/// readable as described at [`Image::read`].
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    export(|st| {
        let name = "cuModuleLoadData";
        let args = format!("- image={:#x}", image as usize);
        let dev = st.enter(name, &args)?;
        if module.is_null() || image.is_null() {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: `image` is non-null and readable as `Image::read` needs, per the caller.
        let Some(img) = (unsafe { Image::read(image.cast::<u8>()) }) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_IMAGE));
        };
        let arch = img.arch.clone().unwrap_or_else(|| "none".into());
        let args = format!("{args} arch={arch} entries={}", img.entries.len());
        if !runs_on(img.arch.as_deref(), st.cc) {
            let (a, b) = st.cc;
            let args = format!("{args} (device is {a}.{b})");
            return Err(st.ret(name, &args, CUDA_ERROR_NO_BINARY_FOR_GPU));
        }
        let m = crate::new_handle(crate::MODULE_BASE);
        st.modules.insert(m, Module { dev, image: img });
        st.module_loads += 1;
        // SAFETY: `module` is non-null and, per the caller, valid for this write.
        unsafe { module.write(m as CUmodule) };
        Ok(st.ret(name, &format!("{m:#x}{}", &args[1..]), CUDA_SUCCESS))
    })
}

/// `CUresult cuModuleUnload(CUmodule hmod)`: its functions become invalid handles. On a
/// poisoned context the module is still unloaded and the sticky error returned.
#[no_mangle]
pub extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    export(|st| {
        let name = "cuModuleUnload";
        let m = hmod as usize;
        let args = format!("{m:#x}");
        let dev = st.enter_any(name, &args)?;
        own_module(st, (name, &args), m, dev)?;
        st.modules.remove(&m);
        st.functions.retain(|_, f| f.module != m);
        let code = st.poisoned(dev);
        Ok(st.ret(name, &args, code))
    })
}

/// `CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)`:
/// `CUDA_ERROR_NOT_FOUND` for an entry the module lacks; the same handle for the same entry.
///
/// # Safety
/// `hfunc` must be null or valid for a write of one `CUfunction`; `name` must be null or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    export(|st| {
        let fname = "cuModuleGetFunction";
        let m = hmod as usize;
        let entry = if name.is_null() {
            None
        } else {
            // SAFETY: non-null and NUL-terminated per the caller.
            Some(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let args = format!("- {m:#x} {}", entry.as_deref().unwrap_or("(null)"));
        let dev = st.enter(fname, &args)?;
        let Some(entry) = entry.filter(|_| !hfunc.is_null()) else {
            return Err(st.ret(fname, &args, CUDA_ERROR_INVALID_VALUE));
        };
        own_module(st, (fname, &args), m, dev)?;
        let found = st.modules[&m]
            .image
            .entries
            .iter()
            .find(|(e, _)| *e == entry)
            .map(|(_, n)| *n);
        let Some(params) = found else {
            return Err(st.ret(fname, &args, CUDA_ERROR_NOT_FOUND));
        };
        let known = st
            .functions
            .iter()
            .find(|(_, f)| f.module == m && f.entry == entry)
            .map(|(&h, _)| h);
        let f = known.unwrap_or_else(|| {
            let f = crate::new_handle(crate::FUNCTION_BASE);
            st.functions.insert(
                f,
                Function {
                    module: m,
                    entry,
                    params,
                },
            );
            f
        });
        // SAFETY: `hfunc` is non-null and, per the caller, valid for this write.
        unsafe { hfunc.write(f as CUfunction) };
        Ok(st.ret(fname, &format!("{f:#x}{}", &args[1..]), CUDA_SUCCESS))
    })
}

/// `(x,y,z)`.
fn dims(d: [c_uint; 3]) -> String {
    format!("({},{},{})", d[0], d[1], d[2])
}

/// What is wrong with a launch configuration, if anything.
fn bad_launch(grid: [c_uint; 3], block: [c_uint; 3], shared: c_uint) -> Option<&'static str> {
    let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
    if grid.contains(&0) || block.contains(&0) {
        Some("a zero dimension")
    } else if grid[0] > i32::MAX as c_uint || grid[1] > 65535 || grid[2] > 65535 {
        Some("grid too large")
    } else if threads > 1024 || block[2] > 64 {
        Some("block too large")
    } else if shared > MAX_SHARED {
        Some("too much shared memory")
    } else {
        None
    }
}

/// `CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
/// unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int
/// blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void
/// **extra)`.
///
/// Checked at call time (`CUDA_ERROR_INVALID_VALUE`): every dimension >= 1, grid x <= 2^31-1,
/// y and z <= 65535, at most 1024 threads a block and z <= 64, `sharedMemBytes` <= 48 KiB,
/// `extra` null, `kernelParams` non-null when the entry has parameters. The parameter values
/// are copied now, each read as 8 bytes (`*(uint64_t *)kernelParams[i]`: a limit of the fake,
/// every parameter is 8 bytes wide). The launch then runs in stream order.
///
/// # Safety
/// `kernel_params` must be null or hold one pointer per parameter of the entry, each readable
/// for 8 bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // the driver's signature
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_dim_x: c_uint,
    grid_dim_y: c_uint,
    grid_dim_z: c_uint,
    block_dim_x: c_uint,
    block_dim_y: c_uint,
    block_dim_z: c_uint,
    shared_mem_bytes: c_uint,
    h_stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let name = "cuLaunchKernel";
    let (fh, h) = (f as usize, h_stream as usize);
    let grid = [grid_dim_x, grid_dim_y, grid_dim_z];
    let block = [block_dim_x, block_dim_y, block_dim_z];
    let mut args = format!(
        "{fh:#x} grid={} block={} shared={shared_mem_bytes} stream={h:#x}",
        dims(grid),
        dims(block)
    );
    let r = with_state(|st| {
        let dev = st.enter(name, &args)?;
        let Some(func) = st.functions.get(&fh) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE));
        };
        let (entry, n, m) = (func.entry.clone(), func.params, func.module);
        args = format!("{entry} {args}");
        let owner = st.modules.get(&m).map_or(dev, |md| md.dev);
        if owner != dev {
            let note = st.wrong_context("function", owner, dev);
            return Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_HANDLE));
        }
        let why = if let Some(why) = bad_launch(grid, block, shared_mem_bytes) {
            Some(why)
        } else if !extra.is_null() {
            Some("extra is not supported")
        } else if kernel_params.is_null() && n > 0 {
            Some("no kernelParams")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(st.ret(name, &format!("{args} ({why})"), CUDA_ERROR_INVALID_VALUE));
        }
        let params: Vec<u64> = (0..n as usize)
            .map(|i| {
                // SAFETY: `kernel_params` holds one readable pointer per parameter, each to 8
                // readable bytes, per the caller; unaligned reads are tolerated.
                unsafe { (*kernel_params.add(i)).cast::<u64>().read_unaligned() }
            })
            .collect();
        let shown: Vec<String> = params.iter().map(|p| format!("{p:#x}")).collect();
        args.push_str(&format!(" params=[{}]", shown.join(",")));
        let launch = Launch {
            entry: CString::new(entry.clone()).unwrap_or_default(),
            params,
            grid,
            block,
            shared: shared_mem_bytes,
        };
        let op = Op {
            dev,
            what: format!("{name} {entry}"),
            work: Work::Launch(launch),
        };
        let submitted = submit(st, name, &args, h, op);
        if submitted.is_ok() {
            st.launches += 1;
        }
        submitted
    });
    finish(name, &args, h, r)
}
