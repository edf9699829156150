//! Streams and events (the queues themselves are in [`crate::exec`]), and `cuCtxSynchronize`.
//!
//! Every call here needs the current context; a stream or event of another device than the
//! current context's is refused with `CUDA_ERROR_INVALID_HANDLE` and counted as a violation
//! (the event of `cuStreamWaitEvent` excepted). The built-in handles (`0`, `CU_STREAM_LEGACY`,
//! `CU_STREAM_PER_THREAD`) resolve to the calling thread's internal streams of the current
//! device ([`Exec::resolve`]). Calls that block (synchronize, destroy) check their arguments
//! under the state lock, wait with no lock held, then log the outcome.

use std::ffi::{c_float, c_uint};

use crate::exec::{self, Exec, Op, Point, Work, CU_STREAM_NON_BLOCKING};
use crate::{
    export, with_state, CUdevice, CUevent, CUresult, CUstream, State, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_READY, CUDA_SUCCESS,
};

/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;

/// Checks that `h` is a live stream of `dev` (built-in streams always are); logs a failure.
fn own_stream(
    st: &mut State,
    ex: &Exec,
    (name, args): (&str, &str),
    h: usize,
    dev: CUdevice,
) -> Result<(), CUresult> {
    if exec::builtin(h) {
        return Ok(());
    }
    match ex.stream(h).map(|s| s.dev) {
        None => Err(st.ret(name, args, CUDA_ERROR_INVALID_HANDLE)),
        Some(owner) if owner != dev => {
            let note = st.wrong_context("stream", owner, dev);
            Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_HANDLE))
        }
        Some(_) => Ok(()),
    }
}

/// Checks that `e` is a live event of `dev` (any device's with `dev` `None`); logs a failure.
/// Returns the event's device.
fn own_event(
    st: &mut State,
    ex: &Exec,
    (name, args): (&str, &str),
    e: usize,
    dev: Option<CUdevice>,
) -> Result<CUdevice, CUresult> {
    match (ex.events.get(&e).map(|ev| ev.dev), dev) {
        (None, _) => Err(st.ret(name, args, CUDA_ERROR_INVALID_HANDLE)),
        (Some(owner), Some(dev)) if owner != dev => {
            let note = st.wrong_context("event", owner, dev);
            Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_HANDLE))
        }
        (Some(owner), _) => Ok(owner),
    }
}

/// Queues `op` on stream `h` (whose handle it checks; a built-in handle resolves to the calling
/// thread's internal stream of `op.dev`). Returns the point just past `op`; logs a failure only.
pub(crate) fn queue(
    st: &mut State,
    (name, args): (&str, &str),
    h: usize,
    op: Op,
) -> Result<Point, CUresult> {
    if crate::api::graph::refuse_while_capturing(st, h) {
        let args = format!("{args} (the stream is capturing)");
        return Err(st.ret(
            name,
            &args,
            crate::api::graph::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        ));
    }
    let mut ex = exec::lock();
    own_stream(st, &ex, (name, args), h, op.dev)?;
    let s = ex.resolve(h, op.dev);
    ex.enqueue(s, op).map_err(|code| st.ret(name, args, code))?;
    Ok(ex.point_of(s))
}

/// [`queue`] for an asynchronous call, which returns at once: logs the success too.
pub(crate) fn submit(
    st: &mut State,
    name: &str,
    args: &str,
    h: usize,
    op: Op,
) -> Result<CUresult, CUresult> {
    queue(st, (name, args), h, op)?;
    Ok(st.ret(name, args, CUDA_SUCCESS))
}

/// Waits with no lock held for what `wait` says, then logs and returns the device's sticky
/// error (or success).
pub(crate) fn settle(name: &str, args: &str, dev: CUdevice, wait: impl FnOnce()) -> CUresult {
    wait();
    with_state(|st| {
        let code = st.poisoned(dev);
        st.ret(name, args, code)
    })
}

/// What synchronizing built-in or created stream `h` of `dev` waits for: the legacy stream
/// covers every blocking stream of the device (`None`); another stream, its own queue.
fn sync_target(h: usize, dev: CUdevice) -> Option<usize> {
    (!exec::legacy(h)).then(|| exec::lock().resolve(h, dev))
}

/// `CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)`: `Flags` is 0 or
/// `CU_STREAM_NON_BLOCKING` (1).
///
/// # Safety
/// `ph_stream` must be null or valid for a write of one `CUstream`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph_stream: *mut CUstream, flags: c_uint) -> CUresult {
    export(|st| {
        let name = "cuStreamCreate";
        let args = format!("- flags={flags}");
        let dev = st.enter(name, &args)?;
        if ph_stream.is_null() || flags & !CU_STREAM_NON_BLOCKING != 0 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let h = exec::lock().create_stream(dev, flags);
        // SAFETY: `ph_stream` is non-null and, per the caller, valid for this write.
        unsafe { ph_stream.write(h as CUstream) };
        Ok(st.ret(name, &format!("{h:#x} flags={flags}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuStreamDestroy(CUstream hStream)` (the `_v2` entry point): the handle is invalid
/// at once; the call returns once the stream's queued work ran (or was discarded). On a
/// poisoned context the stream is still destroyed and the sticky error returned.
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(h_stream: CUstream) -> CUresult {
    let name = "cuStreamDestroy_v2";
    let h = h_stream as usize;
    let args = format!("{h:#x}");
    let checked = with_state(|st| {
        let dev = st.enter_any(name, &args)?;
        let mut ex = exec::lock();
        if exec::builtin(h) {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE));
        }
        own_stream(st, &ex, (name, &args), h, dev)?;
        if let Some(s) = ex.streams.get_mut(&h) {
            s.destroyed = true;
        }
        Ok(dev)
    });
    let dev = match checked {
        Ok(dev) => dev,
        Err(code) => return code,
    };
    settle(name, &args, dev, || {
        exec::wait_stream(h);
        exec::lock().streams.remove(&h);
        exec::notify();
    })
}

/// `CUresult cuStreamSynchronize(CUstream hStream)`: waits until the stream's work ran (on the
/// legacy stream: the work of every blocking stream of the device); returns the context's sticky
/// error if there is (or comes to be) one.
#[no_mangle]
pub extern "C" fn cuStreamSynchronize(h_stream: CUstream) -> CUresult {
    let name = "cuStreamSynchronize";
    let h = h_stream as usize;
    let args = format!("{h:#x}");
    let checked = with_state(|st| {
        let dev = st.enter_any(name, &args)?;
        own_stream(st, &exec::lock(), (name, &args), h, dev)?;
        if crate::api::graph::refuse_while_capturing(st, h) {
            let args = format!("{args} (the stream is capturing)");
            let code = crate::api::graph::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            return Err(st.ret(name, &args, code));
        }
        Ok(dev)
    });
    match checked {
        Ok(dev) => settle(name, &args, dev, || match sync_target(h, dev) {
            None => exec::wait_device(Some(dev), true),
            Some(s) => exec::wait_stream(s),
        }),
        Err(code) => code,
    }
}

/// `CUresult cuStreamQuery(CUstream hStream)`: `CUDA_SUCCESS` when the stream is idle (the
/// legacy stream: every blocking stream of the device), `CUDA_ERROR_NOT_READY` otherwise.
#[no_mangle]
pub extern "C" fn cuStreamQuery(h_stream: CUstream) -> CUresult {
    export(|st| {
        let name = "cuStreamQuery";
        let h = h_stream as usize;
        let args = format!("{h:#x}");
        let dev = st.enter(name, &args)?;
        let mut ex = exec::lock();
        own_stream(st, &ex, (name, &args), h, dev)?;
        let idle = if exec::legacy(h) {
            ex.idle(Some(dev), true)
        } else {
            let s = ex.resolve(h, dev);
            ex.streams.get(&s).is_none_or(exec::Stream::idle)
        };
        let code = if idle {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_NOT_READY
        };
        Ok(st.ret(name, &args, code))
    })
}

/// `CUresult cuCtxSynchronize(void)`: waits until every stream of the current context's device
/// is idle; returns the context's sticky error if there is one.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    let name = "cuCtxSynchronize";
    let checked = with_state(|st| st.enter_any(name, "-"));
    match checked {
        Ok(dev) => settle(name, "-", dev, || exec::wait_device(Some(dev), false)),
        Err(code) => code,
    }
}

/// `CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)`: `Flags` from
/// `CU_EVENT_BLOCKING_SYNC` (1) and `CU_EVENT_DISABLE_TIMING` (2); interprocess events are not
/// modelled. Without `CU_EVENT_DISABLE_TIMING` the event is a timing event (see
/// [`cuEventElapsedTime`]).
///
/// # Safety
/// `ph_event` must be null or valid for a write of one `CUevent`.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph_event: *mut CUevent, flags: c_uint) -> CUresult {
    export(|st| {
        let name = "cuEventCreate";
        let args = format!("- flags={flags}");
        let dev = st.enter(name, &args)?;
        if ph_event.is_null() || flags & !3 != 0 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let e = crate::new_handle(crate::EVENT_BASE);
        let timing = flags & CU_EVENT_DISABLE_TIMING == 0;
        exec::lock().events.insert(e, exec::Event::new(dev, timing));
        // SAFETY: `ph_event` is non-null and, per the caller, valid for this write.
        unsafe { ph_event.write(e as CUevent) };
        Ok(st.ret(name, &format!("{e:#x} flags={flags}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuEventRecord(CUevent hEvent, CUstream hStream)`: the event now stands for the
/// stream's work queued so far (on the legacy stream, or a blocking one, the implicit waits of
/// legacy synchronization included); the call never waits. A timing event's recording queues
/// a marker that stamps the time the stream reaches it.
#[no_mangle]
pub extern "C" fn cuEventRecord(h_event: CUevent, h_stream: CUstream) -> CUresult {
    export(|st| {
        let name = "cuEventRecord";
        let (e, h) = (h_event as usize, h_stream as usize);
        let args = format!("{e:#x} stream={h:#x}");
        let dev = st.enter(name, &args)?;
        let mut ex = exec::lock();
        own_event(st, &ex, (name, &args), e, Some(dev))?;
        own_stream(st, &ex, (name, &args), h, dev)?;
        let s = ex.resolve(h, dev);
        ex.record(e, s, dev)
            .map_err(|code| st.ret(name, &args, code))?;
        Ok(st.ret(name, &args, CUDA_SUCCESS))
    })
}

/// `CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)`: later
/// work of the stream (a built-in one included) waits until the event's last recorded point
/// (taken now) ran; the event may be of any device. A never-recorded event is no wait. The call
/// itself never waits. `Flags` must be 0.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(
    h_stream: CUstream,
    h_event: CUevent,
    flags: c_uint,
) -> CUresult {
    export(|st| {
        let name = "cuStreamWaitEvent";
        let (h, e) = (h_stream as usize, h_event as usize);
        let args = format!("{h:#x} event={e:#x} flags={flags}");
        let dev = st.enter(name, &args)?;
        if flags != 0 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let ex = exec::lock();
        own_stream(st, &ex, (name, &args), h, dev)?;
        own_event(st, &ex, (name, &args), e, None)?;
        let Some(point) = ex.events.get(&e).and_then(|ev| ev.point) else {
            return Err(st.ret(name, &format!("{args} (never recorded)"), CUDA_SUCCESS));
        };
        drop(ex);
        let op = Op {
            dev,
            what: format!("{name} {h:#x} event={e:#x}"),
            work: Work::Wait(point),
        };
        submit(st, name, &args, h, op)
    })
}

/// Checks an event call's context and handle: the event's point, and the current device.
fn event_point(name: &str, args: &str, e: usize) -> Result<(CUdevice, Option<Point>), CUresult> {
    with_state(|st| {
        let dev = st.enter_any(name, args)?;
        let ex = exec::lock();
        own_event(st, &ex, (name, args), e, Some(dev))?;
        Ok((dev, ex.events.get(&e).and_then(|ev| ev.point)))
    })
}

/// `CUresult cuEventSynchronize(CUevent hEvent)`: waits until the event's recorded point ran
/// (at once when never recorded); returns the context's sticky error if there is one.
#[no_mangle]
pub extern "C" fn cuEventSynchronize(h_event: CUevent) -> CUresult {
    let name = "cuEventSynchronize";
    let e = h_event as usize;
    let args = format!("{e:#x}");
    match event_point(name, &args, e) {
        Ok((dev, point)) => settle(name, &args, dev, || {
            if let Some(p) = point {
                exec::wait_point(p);
            }
        }),
        Err(code) => code,
    }
}

/// `CUresult cuEventQuery(CUevent hEvent)`: `CUDA_SUCCESS` when the recorded point ran (or the
/// event was never recorded), `CUDA_ERROR_NOT_READY` otherwise.
#[no_mangle]
pub extern "C" fn cuEventQuery(h_event: CUevent) -> CUresult {
    let name = "cuEventQuery";
    let e = h_event as usize;
    let args = format!("{e:#x}");
    let (dev, point) = match event_point(name, &args, e) {
        Ok(found) => found,
        Err(code) => return code,
    };
    with_state(|st| {
        let code = match st.poisoned(dev) {
            CUDA_SUCCESS if point.is_some_and(|p| !exec::lock().complete(p)) => {
                CUDA_ERROR_NOT_READY
            }
            code => code,
        };
        st.ret(name, &args, code)
    })
}

/// `CUresult cuEventDestroy(CUevent hEvent)` (the `_v2` entry point). Waits already queued on
/// the event keep their point. On a poisoned context the event is still destroyed and the
/// sticky error returned.
#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(h_event: CUevent) -> CUresult {
    let name = "cuEventDestroy_v2";
    let e = h_event as usize;
    let args = format!("{e:#x}");
    let dev = match event_point(name, &args, e) {
        Ok((dev, _)) => dev,
        Err(code) => return code,
    };
    settle(name, &args, dev, || {
        exec::lock().events.remove(&e);
    })
}

/// `CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)`: the time
/// between the two recordings' markers, in milliseconds, as stamped by the host's monotonic
/// clock when each stream reached them. `CUDA_ERROR_INVALID_HANDLE` when either event was made
/// with `CU_EVENT_DISABLE_TIMING` or never recorded (or is not the current device's);
/// `CUDA_ERROR_NOT_READY` when either recording has not completed.
///
/// # Safety
/// `ms` must be null or valid for a write of one `float`.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    h_start: CUevent,
    h_end: CUevent,
) -> CUresult {
    // SAFETY: forwarded caller guarantee.
    unsafe { elapsed("cuEventElapsedTime", ms, h_start, h_end) }
}

/// `CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)` (the
/// name `cuda.h` 12.8 and later use): as [`cuEventElapsedTime`].
///
/// # Safety
/// `ms` must be null or valid for a write of one `float`.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    h_start: CUevent,
    h_end: CUevent,
) -> CUresult {
    // SAFETY: forwarded caller guarantee.
    unsafe { elapsed("cuEventElapsedTime_v2", ms, h_start, h_end) }
}

/// The elapsed-time exports (`name` is the one called).
///
/// # Safety
/// `ms` must be null or valid for a write of one `float`.
unsafe fn elapsed(name: &str, ms: *mut c_float, h_start: CUevent, h_end: CUevent) -> CUresult {
    export(|st| {
        let (a, b) = (h_start as usize, h_end as usize);
        let args = format!("{a:#x} {b:#x}");
        let dev = st.enter(name, &args)?;
        if ms.is_null() {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let ex = exec::lock();
        let mut stamps = Vec::with_capacity(2);
        for e in [a, b] {
            own_event(st, &ex, (name, &args), e, Some(dev))?;
            let ev = &ex.events[&e];
            let Some(point) = ev.point.filter(|_| ev.timing) else {
                let why = if ev.timing {
                    "never recorded"
                } else {
                    "made with CU_EVENT_DISABLE_TIMING"
                };
                let args = format!("{args} ({e:#x} {why})");
                return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE));
            };
            match ev.stamp.filter(|_| ex.complete(point)) {
                Some(t) => stamps.push(t),
                None => return Err(st.ret(name, &args, CUDA_ERROR_NOT_READY)),
            }
        }
        let (start, end) = (stamps[0], stamps[1]);
        let millis = if end >= start {
            (end - start).as_secs_f64() * 1e3
        } else {
            -((start - end).as_secs_f64() * 1e3)
        };
        // SAFETY: `ms` is non-null and, per the caller, valid for this write.
        unsafe { ms.write(millis as c_float) };
        Ok(st.ret(name, &format!("{args} ms={millis:.3}"), CUDA_SUCCESS))
    })
}
