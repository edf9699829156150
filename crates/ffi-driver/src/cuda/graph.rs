//! Captured launches: a batch of launches recorded once into a CUDA graph (stream capture on the
//! worker's stream, `cuStreamCaptureMode` thread-local) and replayed with one `cuGraphLaunch`.
//!
//! Nothing captured runs during the capture, and a replay launches exactly what was captured,
//! with the parameter values captured: the caller keeps what those parameters point at (the
//! task rows) unchanged for as long as it replays the graph. The graph itself is destroyed right
//! after instantiation (the executable graph holds its own copy); executable graphs live until
//! destroyed or the device closes. The entry points are optional: a driver without them does
//! not capture (`captures_graphs`).

use std::ffi::c_void;

use super::loading::CudaFns;
use super::sys::{self, CuGraph, CuGraphExec, CuResult};
use super::{call, call_named, CudaDevice, State};
use crate::device::{GraphId, LaunchCall};
use crate::{DeviceError, Op};

/// The graph entry points, when the driver has them all.
struct GraphFns {
    begin: sys::CuStreamBeginCaptureFn,
    end: sys::CuStreamEndCaptureFn,
    instantiate: sys::CuGraphInstantiateWithFlagsFn,
    launch: sys::CuGraphLaunchFn,
    exec_destroy: sys::CuGraphExecDestroyFn,
    destroy: sys::CuGraphDestroyFn,
}

impl CudaDevice {
    fn graph_fns(&self) -> Option<GraphFns> {
        Some(GraphFns {
            begin: self.f.stream_begin_capture?,
            end: self.f.stream_end_capture?,
            instantiate: self.f.graph_instantiate?,
            launch: self.f.graph_launch?,
            exec_destroy: self.f.graph_exec_destroy?,
            destroy: self.f.graph_destroy?,
        })
    }

    pub(super) fn has_graphs(&self) -> bool {
        self.graph_fns().is_some()
    }

    fn no_graphs() -> DeviceError {
        Self::refused_at(
            Op::Launch,
            CudaFns::NAMES.stream_begin_capture,
            sys::CUDA_ERROR_NOT_SUPPORTED,
            "this driver has no graph entry points",
        )
    }

    /// [`crate::Device::capture`]: begin, the launches, end (always, so the stream leaves
    /// capture mode whatever failed), instantiate, destroy the graph.
    pub(super) fn do_capture(
        &self,
        st: &mut State,
        launches: &[LaunchCall<'_>],
    ) -> Result<GraphId, DeviceError> {
        let g = self.graph_fns().ok_or_else(Self::no_graphs)?;
        let names = CudaFns::NAMES;
        let op = Op::Launch;
        let _bound = self.enter_as(st, op, names.stream_begin_capture)?;
        let stream = self.stream_ptr();
        call_named(st, op, names.stream_begin_capture, 0, 0, |_| {
            // SAFETY: the worker's stream, created at open and destroyed only at close.
            CuResult(unsafe { (g.begin)(stream, sys::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) })
                .result()
                .map_err(|s| s.error(op, names.stream_begin_capture, "the worker's stream"))
        })?;
        let mut captured = Ok(());
        for l in launches {
            captured = call(st, op, 0, 0, |st| {
                self.launch_bound(st, l.func, l.dims, l.params)
            });
            if captured.is_err() {
                break;
            }
        }
        let mut graph: CuGraph = std::ptr::null_mut();
        let ended = call_named(st, op, names.stream_end_capture, 0, 0, |_| {
            // SAFETY: the stream began capturing above; `&mut graph` is valid for the write.
            CuResult(unsafe { (g.end)(stream, &mut graph) })
                .result()
                .map_err(|s| {
                    s.error(
                        op,
                        names.stream_end_capture,
                        format!("{} launch(es) captured", launches.len()),
                    )
                })
        });
        let destroy_graph = |graph: CuGraph| {
            if graph.is_null() {
                return;
            }
            // SAFETY: a graph the capture made, destroyed once.
            if let Err(s) = CuResult(unsafe { (g.destroy)(graph) }).result() {
                log::warn!("{}", s.error(op, names.graph_destroy, "a captured graph"));
            }
        };
        if ended.is_err() {
            // The stream must not stay in capture mode (every later call on it would fail):
            // end it once more, keeping nothing it returns. A stream no longer capturing
            // answers CUDA_ERROR_ILLEGAL_STATE, which is what is expected here.
            let mut again: CuGraph = std::ptr::null_mut();
            // SAFETY: the worker's stream; `&mut again` is valid for the write.
            let _ = unsafe { (g.end)(stream, &mut again) };
            destroy_graph(again);
        }
        if let Err(e) = captured.and(ended) {
            destroy_graph(graph);
            return Err(e);
        }
        let mut exec: CuGraphExec = std::ptr::null_mut();
        let made = call_named(st, op, names.graph_instantiate, 0, 0, |_| {
            // SAFETY: `graph` is the graph the capture made; `&mut exec` is valid for the write.
            CuResult(unsafe { (g.instantiate)(&mut exec, graph, 0) })
                .result()
                .map_err(|s| s.error(op, names.graph_instantiate, "a captured graph"))
        });
        destroy_graph(graph);
        made?;
        st.exec.graphs.insert(exec as u64);
        Ok(GraphId(exec as u64))
    }

    /// [`crate::Device::launch_graph`], the context bound by the caller.
    pub(super) fn launch_graph_bound(
        &self,
        st: &mut State,
        graph: GraphId,
    ) -> Result<(), DeviceError> {
        let g = self.graph_fns().ok_or_else(Self::no_graphs)?;
        let name = CudaFns::NAMES.graph_launch;
        if !st.exec.graphs.contains(&graph.0) {
            return Err(Self::refused_at(
                Op::Launch,
                name,
                sys::CUDA_ERROR_INVALID_HANDLE,
                format!("graph {:#x} is not a live graph of this device", graph.0),
            ));
        }
        // SAFETY: an executable graph this device instantiated and has not destroyed (checked
        // above); the worker's stream.
        CuResult(unsafe { (g.launch)(graph.0 as *mut c_void, self.stream_ptr()) })
            .result()
            .map_err(|s| s.error(Op::Launch, name, format!("graph {:#x}", graph.0)))
    }

    /// [`crate::Device::destroy_graph`].
    pub(super) fn do_destroy_graph(
        &self,
        st: &mut State,
        graph: GraphId,
    ) -> Result<(), DeviceError> {
        let g = self.graph_fns().ok_or_else(Self::no_graphs)?;
        let name = CudaFns::NAMES.graph_exec_destroy;
        if !st.exec.graphs.remove(&graph.0) {
            return Err(Self::refused_at(
                Op::Launch,
                name,
                sys::CUDA_ERROR_INVALID_HANDLE,
                format!("graph {:#x} is not a live graph of this device", graph.0),
            ));
        }
        let _bound = self.enter_as(st, Op::Launch, name)?;
        // SAFETY: an executable graph this device instantiated, destroyed once (removed above).
        CuResult(unsafe { (g.exec_destroy)(graph.0 as *mut c_void) })
            .result()
            .map_err(|s| s.error(Op::Launch, name, format!("graph {:#x}", graph.0)))
    }

    /// Close's part: destroys every executable graph left (the stream has drained).
    pub(super) fn close_graphs(&self, st: &mut State, errors: &mut Vec<DeviceError>) {
        let Some(g) = self.graph_fns() else {
            return;
        };
        for exec in std::mem::take(&mut st.exec.graphs) {
            // SAFETY: an executable graph this device instantiated, destroyed once (the set
            // is emptied).
            let r = CuResult(unsafe { (g.exec_destroy)(exec as CuGraphExec) }).result();
            if let Err(s) = r {
                errors.push(s.error(Op::Launch, CudaFns::NAMES.graph_exec_destroy, "at close"));
            }
        }
    }
}
