//! Stream capture and CUDA graphs, strictly: a graph replays exactly the launches captured, with
//! the parameter values captured, on the stream it is launched on.
//!
//! * `cuStreamBeginCapture_v2(stream, mode)` starts capturing a stream made by `cuStreamCreate`
//!   (the built-in streams cannot be captured: `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); a
//!   stream already capturing is `CUDA_ERROR_ILLEGAL_STATE`. `mode` is 0 (global), 1 (thread
//!   local) or 2 (relaxed).
//! * While a stream captures, `cuLaunchKernel` on it records the launch (checked as usual, its
//!   parameters copied) and runs nothing. Any other work queued on it (a copy, a memset, an
//!   event wait) and `cuStreamSynchronize` of it are refused with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidate the capture — stricter than the
//!   driver, which captures copies as nodes: the runtime captures launches only.
//! * `cuStreamEndCapture(stream, &graph)` ends it: the graph of the launches captured, or
//!   `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (no graph) after an invalidation, or
//!   `CUDA_ERROR_ILLEGAL_STATE` for a stream that is not capturing.
//! * `cuGraphInstantiateWithFlags(&exec, graph, 0)` copies the graph into an executable graph
//!   (later changes to `graph` do not reach it; it may be destroyed at once).
//! * `cuGraphLaunch(exec, stream)` queues the captured launches, in capture order, on `stream`
//!   as one operation (any stream of the device, a built-in one included); each runs its host
//!   kernel as a launch would, and the first fault stops the rest. Launching on a capturing
//!   stream is refused.
//! * `cuGraphDestroy`, `cuGraphExecDestroy` free them; a handle is invalid afterwards.
//!
//! Counted for tests: graphs and executable graphs alive (`fake_cuda_live_graphs`), graph
//! launches and the kernel launches they replayed (`fake_cuda_graph_launches`,
//! `fake_cuda_replayed_launches`).

use std::ffi::c_uint;
use std::sync::Arc;

use crate::api::stream::queue;
use crate::exec::{self, Launch, Op, Work};
use crate::{
    export, CUdevice, CUresult, CUstream, State, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
};

/// `CUgraph`, `CUgraphExec` (`cuda.h`: opaque pointers).
pub type CUgraph = *mut std::ffi::c_void;
pub type CUgraphExec = *mut std::ffi::c_void;

pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;

/// Bases of the graph handles.
const GRAPH_BASE: usize = 0x6A00_0000_0000;
const GRAPH_EXEC_BASE: usize = 0x6E00_0000_0000;

/// A capture in progress on one stream.
pub struct Capture {
    pub launches: Vec<Launch>,
    pub invalidated: bool,
}

/// A graph or an executable graph: the launches captured, of device `dev`.
pub struct Graph {
    pub dev: CUdevice,
    pub launches: Arc<Vec<Launch>>,
}

/// Whether stream `h` is capturing; if so, invalidates the capture (the caller refuses the work
/// with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`).
pub(crate) fn refuse_while_capturing(st: &mut State, h: usize) -> bool {
    match st.captures.get_mut(&h) {
        Some(c) => {
            c.invalidated = true;
            true
        }
        None => false,
    }
}

/// `CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)` (the name
/// `cuStreamBeginCapture` has in `cuda.h` since CUDA 10.1).
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(h_stream: CUstream, mode: c_uint) -> CUresult {
    export(|st| {
        let name = "cuStreamBeginCapture_v2";
        let h = h_stream as usize;
        let args = format!("{h:#x} mode={mode}");
        let dev = st.enter(name, &args)?;
        if mode > 2 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        if exec::builtin(h) {
            return Err(st.ret(name, &args, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        }
        match exec::lock().stream(h).map(|s| s.dev) {
            Some(owner) if owner == dev => {}
            _ => return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE)),
        }
        if st.captures.contains_key(&h) {
            return Err(st.ret(name, &args, CUDA_ERROR_ILLEGAL_STATE));
        }
        st.captures.insert(
            h,
            Capture {
                launches: Vec::new(),
                invalidated: false,
            },
        );
        Ok(st.ret(name, &args, CUDA_SUCCESS))
    })
}

/// `CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)`.
///
/// # Safety
/// `ph_graph` must be null or valid for a write of one `CUgraph`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(
    h_stream: CUstream,
    ph_graph: *mut CUgraph,
) -> CUresult {
    export(|st| {
        let name = "cuStreamEndCapture";
        let h = h_stream as usize;
        let args = format!("{h:#x}");
        let dev = st.enter(name, &args)?;
        if ph_graph.is_null() {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let Some(c) = st.captures.remove(&h) else {
            return Err(st.ret(name, &args, CUDA_ERROR_ILLEGAL_STATE));
        };
        if c.invalidated {
            // SAFETY: `ph_graph` is non-null and, per the caller, valid for this write.
            unsafe { ph_graph.write(std::ptr::null_mut()) };
            return Err(st.ret(name, &args, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        }
        let g = crate::new_handle(GRAPH_BASE);
        let n = c.launches.len();
        st.graphs.insert(
            g,
            Graph {
                dev,
                launches: Arc::new(c.launches),
            },
        );
        // SAFETY: as above.
        unsafe { ph_graph.write(g as CUgraph) };
        Ok(st.ret(
            name,
            &format!("{args} graph={g:#x} launches={n}"),
            CUDA_SUCCESS,
        ))
    })
}

/// `CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned
/// long long flags)`: `flags` must be 0 here.
///
/// # Safety
/// `ph_exec` must be null or valid for a write of one `CUgraphExec`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    ph_exec: *mut CUgraphExec,
    h_graph: CUgraph,
    flags: u64,
) -> CUresult {
    export(|st| {
        let name = "cuGraphInstantiateWithFlags";
        let g = h_graph as usize;
        let args = format!("{g:#x} flags={flags}");
        let dev = st.enter(name, &args)?;
        if ph_exec.is_null() || flags != 0 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let launches = match st.graphs.get(&g) {
            // A copy: the executable graph does not follow later changes to the graph.
            Some(graph) if graph.dev == dev => Arc::new(graph.launches.as_ref().clone()),
            _ => return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE)),
        };
        let e = crate::new_handle(GRAPH_EXEC_BASE);
        st.graph_execs.insert(e, Graph { dev, launches });
        // SAFETY: `ph_exec` is non-null and, per the caller, valid for this write.
        unsafe { ph_exec.write(e as CUgraphExec) };
        Ok(st.ret(name, &format!("{args} exec={e:#x}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)`: queues the captured
/// launches on `hStream`, in capture order; returns at once.
#[no_mangle]
pub extern "C" fn cuGraphLaunch(h_exec: CUgraphExec, h_stream: CUstream) -> CUresult {
    export(|st| {
        let name = "cuGraphLaunch";
        let (e, h) = (h_exec as usize, h_stream as usize);
        let args = format!("{e:#x} stream={h:#x}");
        let dev = st.enter(name, &args)?;
        let launches = match st.graph_execs.get(&e) {
            Some(g) if g.dev == dev => g.launches.clone(),
            _ => return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE)),
        };
        if refuse_while_capturing(st, h) {
            return Err(st.ret(name, &args, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        }
        let n = launches.len() as u64;
        let op = Op {
            dev,
            what: format!("{name} {e:#x}"),
            work: Work::Graph(launches),
        };
        queue(st, (name, &args), h, op)?;
        st.graph_launches += 1;
        st.replayed_launches += n;
        Ok(st.ret(name, &format!("{args} launches={n}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)`.
#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(h_exec: CUgraphExec) -> CUresult {
    export(|st| {
        let name = "cuGraphExecDestroy";
        let e = h_exec as usize;
        let args = format!("{e:#x}");
        st.enter_any(name, &args)?;
        if st.graph_execs.remove(&e).is_none() {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE));
        }
        Ok(st.ret(name, &args, CUDA_SUCCESS))
    })
}

/// `CUresult cuGraphDestroy(CUgraph hGraph)`.
#[no_mangle]
pub extern "C" fn cuGraphDestroy(h_graph: CUgraph) -> CUresult {
    export(|st| {
        let name = "cuGraphDestroy";
        let g = h_graph as usize;
        let args = format!("{g:#x}");
        st.enter_any(name, &args)?;
        if st.graphs.remove(&g).is_none() {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_HANDLE));
        }
        Ok(st.ret(name, &args, CUDA_SUCCESS))
    })
}
