//! The executor threads: one per busy stream, running its queue in order (see the parent
//! module), lingering a while once it is empty; and what they run: copies in chunks, host
//! kernels, waits, time stamps. A fault poisons the device.

use std::ffi::{c_uint, c_void};
use std::ptr;
use std::time::{Duration, Instant};

use super::{lock, notify, wait_until, Kind, Launch, Op, Source, Work, CHANGED, EXECUTOR};
use crate::{
    with_state, CUdevice, CUresult, HostKernel, CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_FAILED, CUDA_SUCCESS,
};

/// Starts a detached executor thread for stream `h`; `false` when the system refuses.
///
/// A plain pthread rather than a `std::thread`: a host kernel may be a Python ctypes callback,
/// and Python (before 3.14) ends a thread that wants the GIL while the interpreter finalizes
/// with `pthread_exit`, a forced unwind. A `std::thread` would catch that at its top and abort
/// the whole process at exit; on a plain thread it unwinds to the thread's start, through
/// frames of the fake that own nothing while a host kernel runs ([`worker`] to
/// [`call_kernel`] hold only raw pointers and plain values), and just ends the thread.
pub(super) fn spawn(h: usize) -> bool {
    extern "C" {
        fn pthread_create(
            thread: *mut std::ffi::c_ulong,
            attr: *const c_void,
            start: extern "C-unwind" fn(*mut c_void) -> *mut c_void,
            arg: *mut c_void,
        ) -> std::ffi::c_int;
        fn pthread_detach(thread: std::ffi::c_ulong) -> std::ffi::c_int;
    }
    let mut t: std::ffi::c_ulong = 0;
    // SAFETY: `t` is a valid out pointer, a null `attr` asks for the defaults, and
    // `executor_start` takes the stream handle smuggled in `arg` (no pointer is dereferenced).
    let rc = unsafe { pthread_create(&mut t, std::ptr::null(), executor_start, h as *mut c_void) };
    if rc != 0 {
        return false;
    }
    // SAFETY: `t` is the thread just created, detached once (it is never joined).
    unsafe { pthread_detach(t) };
    true
}

/// The start routine of an executor thread: `arg` is the stream handle.
extern "C-unwind" fn executor_start(arg: *mut c_void) -> *mut c_void {
    worker(arg as usize);
    std::ptr::null_mut()
}

/// How long an executor thread keeps looking at its empty queue for more work before it ends.
const LINGER: Duration = Duration::from_millis(20);

/// How often a lingering executor looks at its queue, at least: it polls rather than waits to
/// be woken, so queueing work on a stream costs no thread wake-up (a system call, tens of
/// microseconds on a loaded machine), as a driver's queueing costs no system call.
const POLL: Duration = Duration::from_micros(50);

/// The executor of stream `h`: after the launch latency, runs its queue until it is empty, then
/// lingers for more work (which it runs after the latency again) until [`linger`] says to end.
fn worker(h: usize) {
    EXECUTOR.with(|c| c.set(true));
    loop {
        let latency = lock().latency;
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        while let Some(job) = next_job(h) {
            run_job(job);
            if let Some(s) = lock().streams.get_mut(&h) {
                s.done += 1;
            }
            notify();
        }
        if !linger(h) {
            return;
        }
    }
}

/// Looks at the empty queue of stream `h` every launch latency (or [`POLL`], if longer) for up to
/// [`LINGER`]: `true` once work is queued (it then waits the latency, as on a thread just
/// started); `false` when the thread is to end, with the stream marked as having no thread (or
/// dropped, when it is an orphaned per-thread stream): the time ran out, or the stream is gone,
/// destroyed or orphaned.
fn linger(h: usize) -> bool {
    let start = Instant::now();
    loop {
        let poll = {
            let mut ex = lock();
            let poll = ex.latency.max(POLL);
            let Some(s) = ex.streams.get_mut(&h) else {
                return false;
            };
            if !s.ops.is_empty() {
                return true;
            }
            if s.destroyed || s.orphan || start.elapsed() >= LINGER {
                s.worker = false;
                if s.orphan && s.idle() {
                    ex.streams.remove(&h);
                }
                return false;
            }
            poll
        };
        std::thread::sleep(poll);
    }
}

/// The next operation of stream `h` once it is not held (boxed and leaked, so no frame owns it
/// while it runs), or `None` when the queue is empty (or the stream is gone).
fn next_job(h: usize) -> Option<*mut Op> {
    let mut ex = lock();
    loop {
        let all_held = ex.held;
        let s = ex.streams.get_mut(&h)?;
        if s.ops.is_empty() {
            return None;
        }
        let held = s.held || (all_held && s.kind == Kind::Created);
        if !held {
            if let Some(op) = s.ops.pop_front() {
                return Some(Box::into_raw(Box::new(op)));
            }
        }
        ex = CHANGED.wait(ex).unwrap_or_else(|e| e.into_inner());
    }
}

/// Runs and frees `job` (from [`next_job`]); a fault poisons the device.
fn run_job(job: *mut Op) {
    // SAFETY: `job` is a live box from `next_job`, freed below and nowhere else.
    let (dev, launch, graph) = unsafe {
        match &(*job).work {
            Work::Launch(l) => ((*job).dev, Some(ptr::from_ref(l)), None),
            Work::Graph(ls) => ((*job).dev, None, Some((ls.as_ptr(), ls.len()))),
            _ => ((*job).dev, None, None),
        }
    };
    if let Some((first, n)) = graph {
        for i in 0..n {
            // SAFETY: `first` points at the `n` launches of the graph the live job holds.
            let code = call_kernel(unsafe { first.add(i) });
            if code != CUDA_SUCCESS {
                // SAFETY: as above; `job` is not used again.
                let op = unsafe { Box::from_raw(job) };
                fault(dev, code, &op.what);
                return;
            }
        }
        // SAFETY: as above; `job` is not used again.
        drop(unsafe { Box::from_raw(job) });
        return;
    }
    let Some(l) = launch else {
        // SAFETY: as above; `job` is not used again.
        let op = unsafe { Box::from_raw(job) };
        run(*op);
        return;
    };
    // Nothing owned lives in this frame (or `call_kernel`'s) while the host kernel runs.
    let code = call_kernel(l);
    // SAFETY: as above; `job` is not used again.
    let op = unsafe { Box::from_raw(job) };
    if code != CUDA_SUCCESS {
        fault(dev, code, &op.what);
    }
}

/// Runs `op` on its stream's thread with no lock held; a fault poisons the device. (Launches
/// go through [`run_job`], which owns nothing while the host kernel runs.)
fn run(op: Op) {
    let dev = op.dev;
    let code = match op.work {
        Work::HtoD { dst, src, n } => {
            let from = match &src {
                Source::Host(p) => *p as *const u8,
                Source::Copied(v) => v.as_ptr(),
            };
            in_chunks(dst, n, dev, |to, at, len| {
                // SAFETY: `to` has `len` bytes of a live backing block behind it (checked under
                // the lock `in_chunks` holds); `from` is the fake's own `n`-byte copy, or a host
                // range the caller vouched for at call time (valid until the copy ran: a pinned
                // range, as for DMA, or the buffer of a synchronous call that waits for this
                // copy), and `at + len <= n`.
                unsafe { std::ptr::copy_nonoverlapping(from.add(at), to, len) };
            })
        }
        Work::DtoH { dst, src, n } => in_chunks(src, n, dev, |from, at, len| {
            // SAFETY: `from` has `len` bytes of a live backing block behind it (checked under
            // the lock `in_chunks` holds); `dst` was valid for `n` bytes per the enqueuing
            // caller, who must keep it so until the copy ran (a synchronous call waits for it),
            // and `at + len <= n`.
            unsafe { std::ptr::copy_nonoverlapping(from, (dst as *mut u8).add(at), len) };
        }),
        Work::Memset { dst, value, n } => in_chunks(dst, n, dev, |to, _, len| {
            // SAFETY: `to` has `len` bytes of a live backing block behind it (checked under the
            // lock `in_chunks` holds).
            unsafe { std::ptr::write_bytes(to, value, len) };
        }),
        Work::Launch(ref l) => call_kernel(l),
        Work::Graph(ref ls) => ls
            .iter()
            .map(|l| call_kernel(ptr::from_ref(l)))
            .find(|&c| c != CUDA_SUCCESS)
            .unwrap_or(CUDA_SUCCESS),
        Work::Wait(p) => {
            wait_until(|ex| ex.complete(p));
            CUDA_SUCCESS
        }
        Work::Stamp { event, records } => {
            let now = Instant::now();
            if let Some(ev) = lock()
                .events
                .get_mut(&event)
                .filter(|ev| ev.records == records)
            {
                ev.stamp = Some(now);
            }
            CUDA_SUCCESS
        }
    };
    if code != CUDA_SUCCESS {
        fault(dev, code, &op.what);
    }
}

/// The most bytes a copy or memset moves under one hold of the state lock: host calls made
/// while the stream works (a launch, a graph launch) wait for one chunk, not for the whole copy,
/// as they would not wait for a copy engine at all.
const CHUNK: usize = 16 << 10;

/// Runs `f(device pointer, offset, length)` over the `n` bytes of device memory at `addr`, a
/// chunk at a time, each translated and run under the state lock (so memory freed meanwhile is
/// an illegal address, never a dangling pointer); `CUDA_ERROR_ILLEGAL_ADDRESS` at the first chunk
/// that is not live memory of `dev`.
fn in_chunks(
    addr: u64,
    n: usize,
    dev: CUdevice,
    mut f: impl FnMut(*mut u8, usize, usize),
) -> CUresult {
    let mut at = 0;
    loop {
        let len = CHUNK.min(n - at);
        let ok = with_state(|st| {
            let Ok(p) = st.device_range(addr + at as u64, len as u64, dev) else {
                return false;
            };
            if len > 0 {
                f(p, at, len);
            }
            true
        });
        if !ok {
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        at += len;
        if at >= n {
            return CUDA_SUCCESS;
        }
        // A caller waiting for the lock takes it now (the lock is not fair).
        std::thread::yield_now();
    }
}

/// The host implementation registered for `l`'s entry.
fn kernel_of(l: &Launch) -> Option<(HostKernel, usize)> {
    let name = l.entry.to_string_lossy();
    let found = with_state(|st| st.kernels.get(name.as_ref()).copied());
    if found.is_none() {
        with_state(|st| {
            st.log.line(&format!(
                "fake_cuda exec {name}: no host implementation registered"
            ))
        });
    }
    found
}

/// Calls the host implementation of `l`'s entry; its result as a `CUresult`
/// (`CUDA_ERROR_LAUNCH_FAILED` without one). Holds no lock and owns nothing during the call.
fn call_kernel(l: *const Launch) -> CUresult {
    // SAFETY: `l` points at a launch its caller keeps alive for this call.
    let l = unsafe { &*l };
    let Some((f, user)) = kernel_of(l) else {
        return CUDA_ERROR_LAUNCH_FAILED;
    };
    let n = c_uint::try_from(l.params.len()).unwrap_or(c_uint::MAX);
    // SAFETY: `f` was registered as a `fake_cuda_host_kernel`; every pointer passed points at
    // data of `l`, alive for the call; no lock of the fake is held, so the function may call
    // `fake_cuda_translate` (or any control).
    let rc = unsafe {
        f(
            user as *mut c_void,
            l.entry.as_ptr(),
            l.params.as_ptr(),
            n,
            l.grid.as_ptr(),
            l.block.as_ptr(),
            l.shared,
        )
    };
    match rc {
        0 => CUDA_SUCCESS,
        CUDA_ERROR_ILLEGAL_ADDRESS => CUDA_ERROR_ILLEGAL_ADDRESS,
        _ => CUDA_ERROR_LAUNCH_FAILED,
    }
}

/// A device fault of `dev`: poisons its primary context (the first fault's code sticks; none
/// while the context is not retained), discards the work queued on its streams, logs it.
fn fault(dev: CUdevice, code: CUresult, what: &str) {
    with_state(|st| {
        let alive = st.retain_count(dev) > 0;
        if alive {
            st.poison.entry(dev).or_insert(code);
        }
        let discarded = lock().discard(dev);
        let note = if alive { "" } else { " (context gone)" };
        st.log.line(&format!(
            "fake_cuda fault dev={dev} {what} -> {code}{note}; {discarded} queued ops discarded"
        ));
    });
    notify();
}
