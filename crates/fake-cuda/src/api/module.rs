//! Modules, functions and launches.
//!
//! `cuModuleLoadData` accepts only images of the fake NVRTC ([`crate::image`]), of a version
//! and architecture the driver and device run. A function has limits of its own (its
//! `__launch_bounds__`, its dynamic shared memory opt-in). A launch is checked and its parameter
//! values are copied at call time; it then runs, in stream order, the host function registered
//! for its entry ([`crate::exec`]).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use super::stream::submit;
use crate::exec::{Launch, Op, Work};
use crate::image::{runs_on, too_new, Image};
use crate::{
    driver_version, export, CUdevice, CUfunction, CUmodule, CUresult, CUstream, State,
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_SUCCESS,
};

/// `CUfunction_attribute` (`cuda.h`: an enum, passed as `int`).
#[allow(non_camel_case_types)] // the header's name
pub type CUfunction_attribute = c_int;

/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUfunction_attribute = 0;
/// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`.
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: CUfunction_attribute = 1;
/// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`.
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: CUfunction_attribute = 3;
/// `CU_FUNC_ATTRIBUTE_NUM_REGS`.
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: CUfunction_attribute = 4;
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: CUfunction_attribute = 8;

/// Most threads a block may have (the device's `MAX_THREADS_PER_BLOCK`).
pub const MAX_THREADS: u32 = 1024;
/// The dynamic shared memory a launch may use without an opt-in (48 KiB: the device's
/// `MAX_SHARED_MEMORY_PER_BLOCK`, no static shared memory).
pub const DEFAULT_DYNAMIC_SHARED: u32 = 48 << 10;
/// Registers a thread uses, as `CU_FUNC_ATTRIBUTE_NUM_REGS` reports.
const NUM_REGS: c_int = 32;

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
    /// Most threads a block of it may have: its `__launch_bounds__` (at most [`MAX_THREADS`]),
    /// else [`MAX_THREADS`].
    pub max_threads: u32,
    /// Most dynamic shared memory a launch of it may use: [`DEFAULT_DYNAMIC_SHARED`] until
    /// `cuFuncSetAttribute` opts in to more.
    pub max_dynamic_shared: u32,
}

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
/// (else `CUDA_ERROR_INVALID_IMAGE`), of a version the driver (`FAKE_CUDA_DRIVER_VERSION`)
/// loads (else `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`: PTX of a newer major.minor, or a cubin of
/// a newer major; see [`too_new`]), for an architecture the device runs (else
/// `CUDA_ERROR_NO_BINARY_FOR_GPU`; see [`runs_on`]).
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
        let made = img
            .cuda
            .map_or_else(|| "unknown".into(), |(a, b)| format!("{a}.{b}"));
        let args = format!(
            "{args} arch={arch} cuda={made} entries={}",
            img.entries.len()
        );
        let v = driver_version();
        let driver = (
            u32::try_from(v / 1000).unwrap_or(0),
            u32::try_from(v % 1000 / 10).unwrap_or(0),
        );
        if too_new(img.cuda, img.arch.as_deref(), driver) {
            let args = format!("{args} (driver is {}.{})", driver.0, driver.1);
            return Err(st.ret(name, &args, CUDA_ERROR_UNSUPPORTED_PTX_VERSION));
        }
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
            .find(|e| e.name == entry)
            .map(|e| (e.params, e.max_threads));
        let Some((params, bounds)) = found else {
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
                    max_threads: bounds.map_or(MAX_THREADS, |b| b.min(MAX_THREADS)),
                    max_dynamic_shared: DEFAULT_DYNAMIC_SHARED,
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

/// What is wrong with a launch configuration for the device, if anything.
fn bad_launch(grid: [c_uint; 3], block: [c_uint; 3]) -> Option<&'static str> {
    let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
    if grid.contains(&0) || block.contains(&0) {
        Some("a zero dimension")
    } else if grid[0] > i32::MAX as c_uint || grid[1] > 65535 || grid[2] > 65535 {
        Some("grid too large")
    } else if threads > u64::from(MAX_THREADS) || block[2] > 64 {
        Some("block too large")
    } else {
        None
    }
}

/// `CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
/// unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int
/// blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void
/// **extra)`.
///
/// Checked at call time, nothing queued on a failure: `CUDA_ERROR_INVALID_VALUE` unless every
/// dimension >= 1, grid x <= 2^31-1, y and z <= 65535, at most 1024 threads a block and z <= 64;
/// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES` (not sticky) for more threads a block than the
/// function's `__launch_bounds__`; `CUDA_ERROR_INVALID_VALUE` for more `sharedMemBytes` than
/// the function's dynamic shared memory limit (48 KiB unless raised by `cuFuncSetAttribute`),
/// a non-null `extra`, or a null `kernelParams` when the entry has parameters. The parameter
/// values are copied now, each read as 8 bytes (`*(uint64_t *)kernelParams[i]`: a limit of the
/// fake, every parameter is 8 bytes wide). The launch then runs in stream order (on a built-in
/// stream too: the call returns at once).
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
    export(|st| {
        let dev = st.enter(name, &args)?;
        let Some(func) = st.functions.get(&fh) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE));
        };
        let (entry, n, m) = (func.entry.clone(), func.params, func.module);
        let (max_threads, max_shared) = (func.max_threads, func.max_dynamic_shared);
        args = format!("{entry} {args}");
        let owner = st.modules.get(&m).map_or(dev, |md| md.dev);
        if owner != dev {
            let note = st.wrong_context("function", owner, dev);
            return Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_HANDLE));
        }
        let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
        let why = if let Some(why) = bad_launch(grid, block) {
            Some(why)
        } else if threads > u64::from(max_threads) {
            let args = format!("{args} ({threads} threads: the function's limit is {max_threads})");
            return Err(st.ret(name, &args, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES));
        } else if shared_mem_bytes > max_shared {
            Some("more dynamic shared memory than the function's limit")
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
        if let Some(c) = st.captures.get_mut(&h) {
            // Captured, not run (`api::graph`).
            c.launches.push(launch);
            return Ok(st.ret(name, &format!("{args} (captured)"), CUDA_SUCCESS));
        }
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
    })
}

/// Checks that `fh` is a function of a module of `dev`; logs a failure.
fn own_function(
    st: &mut State,
    (name, args): (&str, &str),
    fh: usize,
    dev: CUdevice,
) -> Result<(), CUresult> {
    let Some(m) = st.functions.get(&fh).map(|f| f.module) else {
        return Err(st.ret(name, args, CUDA_ERROR_INVALID_HANDLE));
    };
    own_module(st, (name, args), m, dev)
}

/// `CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)`:
/// `MAX_THREADS_PER_BLOCK` (0): the first argument of the entry's `__launch_bounds__`, else
/// 1024; `SHARED_SIZE_BYTES` (1) and `LOCAL_SIZE_BYTES` (3): 0; `NUM_REGS` (4): 32;
/// `MAX_DYNAMIC_SHARED_SIZE_BYTES` (8): the function's current limit (49152 until raised). Any
/// other attribute is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `pi` must be null or valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    hfunc: CUfunction,
) -> CUresult {
    export(|st| {
        let name = "cuFuncGetAttribute";
        let fh = hfunc as usize;
        let args = format!("{attrib} {fh:#x}");
        let dev = st.enter(name, &args)?;
        own_function(st, (name, &args), fh, dev)?;
        let f = &st.functions[&fh];
        let value = match attrib {
            CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => c_int::try_from(f.max_threads).ok(),
            CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES | CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => Some(0),
            CU_FUNC_ATTRIBUTE_NUM_REGS => Some(NUM_REGS),
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                c_int::try_from(f.max_dynamic_shared).ok()
            }
            _ => None,
        };
        let Some(value) = value.filter(|_| !pi.is_null()) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        };
        // SAFETY: `pi` is non-null and, per the caller, valid for this write.
        unsafe { pi.write(value) };
        Ok(st.ret(name, &format!("{args} value={value}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)`:
/// only `MAX_DYNAMIC_SHARED_SIZE_BYTES` (8), from 0 up to the device's
/// `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN` (`FAKE_CUDA_SHARED_OPTIN`); anything else is
/// `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(
    hfunc: CUfunction,
    attrib: CUfunction_attribute,
    value: c_int,
) -> CUresult {
    export(|st| {
        let name = "cuFuncSetAttribute";
        let fh = hfunc as usize;
        let args = format!("{fh:#x} {attrib} value={value}");
        let dev = st.enter(name, &args)?;
        own_function(st, (name, &args), fh, dev)?;
        let optin = st.shared_optin;
        let bytes = u32::try_from(value).ok().filter(|&v| v <= optin);
        let (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, Some(bytes)) = (attrib, bytes) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        };
        if let Some(f) = st.functions.get_mut(&fh) {
            f.max_dynamic_shared = bytes;
        }
        Ok(st.ret(name, &args, CUDA_SUCCESS))
    })
}
