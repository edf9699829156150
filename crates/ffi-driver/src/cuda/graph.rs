//! Captured launches: a batch of launches recorded once into a CUDA graph (stream capture on the
//! worker's stream, `cuStreamCaptureMode` thread-local) and replayed with one `cuGraphLaunch`.
//!
//! Nothing captured runs during the capture, and a replay launches exactly what was captured,
//! with the parameter values captured: the caller keeps what those parameters point at (the
//! task rows) unchanged for as long as it replays the graph. The graph itself is destroyed right
//! after instantiation (the executable graph holds its own copy); executable graphs live until
//! destroyed or the device closes. The entry points are optional: a driver without them does
//! not capture (`captures_graphs`).

use super::calls::{call, call_named, Graphs};
use super::loading::CudaFns;
use super::sys::{self, CuGraph, CuGraphExec};
use super::{CudaDevice, State};
use crate::device::{GraphId, LaunchCall};
use crate::{DeviceError, Op};

impl CudaDevice {
    pub(super) fn has_graphs(&self) -> bool {
        self.f.graphs().is_some()
    }

    /// The graph entry points, else the refusal of a driver without them.
    fn graph_calls(&self) -> Result<Graphs, DeviceError> {
        self.f.graphs().ok_or_else(|| {
            Self::refused_at(
                Op::Launch,
                CudaFns::NAMES.stream_begin_capture,
                sys::CUDA_ERROR_NOT_SUPPORTED,
                "this driver has no graph entry points",
            )
        })
    }

    /// [`crate::Device::capture`]: begin, the launches, end (always, so the stream leaves
    /// capture mode whatever failed), instantiate, destroy the graph.
    pub(super) fn do_capture(
        &self,
        st: &mut State,
        launches: &[LaunchCall<'_>],
    ) -> Result<GraphId, DeviceError> {
        let g = self.graph_calls()?;
        let names = CudaFns::NAMES;
        let op = Op::Launch;
        let _bound = self.enter_as(st, op, names.stream_begin_capture)?;
        let stream = self.stream_ptr();
        call_named(st, op, names.stream_begin_capture, 0, 0, |_| {
            g.stream_begin_capture(stream)
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
            let what = format_args!("{} launch(es) captured", launches.len());
            let (made, r) = g.stream_end_capture(stream, what);
            graph = made;
            r
        });
        // A graph the capture made, destroyed once.
        let destroy_graph = |graph: CuGraph| {
            if graph.is_null() {
                return;
            }
            // SAFETY: the graph the capture just made, destroyed once, here.
            if let Err(e) = unsafe { g.graph_destroy(graph) } {
                log::warn!("{e}");
            }
        };
        if ended.is_err() {
            // The stream must not stay in capture mode (every later call on it would fail):
            // end it once more, keeping nothing it returns. A stream no longer capturing
            // answers CUDA_ERROR_ILLEGAL_STATE, which is what is expected here.
            let (again, _) = g.stream_end_capture(stream, "ending the capture again");
            destroy_graph(again);
        }
        if let Err(e) = captured.and(ended) {
            destroy_graph(graph);
            return Err(e);
        }
        let mut exec: CuGraphExec = std::ptr::null_mut();
        let made = call_named(st, op, names.graph_instantiate, 0, 0, |_| {
            exec = g.graph_instantiate(graph)?;
            Ok(())
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
        let g = self.graph_calls()?;
        let name = CudaFns::NAMES.graph_launch;
        if !st.exec.graphs.contains(&graph.0) {
            return Err(Self::refused_at(
                Op::Launch,
                name,
                sys::CUDA_ERROR_INVALID_HANDLE,
                format!("graph {:#x} is not a live graph of this device", graph.0),
            ));
        }
        // An executable graph this device instantiated and has not destroyed (checked above).
        let what = format_args!("graph {:#x}", graph.0);
        g.graph_launch(graph.0 as CuGraphExec, self.stream_ptr(), what)
    }

    /// [`crate::Device::destroy_graph`].
    pub(super) fn do_destroy_graph(
        &self,
        st: &mut State,
        graph: GraphId,
    ) -> Result<(), DeviceError> {
        let g = self.graph_calls()?;
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
        unsafe {
            g.graph_exec_destroy(graph.0 as CuGraphExec, format_args!("graph {:#x}", graph.0))
        }
    }

    /// Close's part: destroys every executable graph left (the stream has drained).
    pub(super) fn close_graphs(&self, st: &mut State, errors: &mut Vec<DeviceError>) {
        let Some(g) = self.f.graphs() else {
            return;
        };
        // Each executable graph this device instantiated, destroyed once (the set is emptied).
        for exec in std::mem::take(&mut st.exec.graphs) {
            // SAFETY: an executable graph this device instantiated, destroyed once (the set is
            // emptied); the stream drained.
            errors.extend(unsafe { g.graph_exec_destroy(exec as CuGraphExec, "at close") }.err());
        }
    }
}
