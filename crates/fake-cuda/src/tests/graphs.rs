//! Stream capture and graphs: a graph replays exactly what was captured, with the captured
//! parameter values, on the stream it is launched on; nothing runs during capture.

use std::ptr;

use super::*;
use crate::exec::CU_STREAM_NON_BLOCKING;

fn end_capture(s: CUstream) -> Result<CUgraph, CUresult> {
    let mut g: CUgraph = ptr::null_mut();
    // SAFETY: `g` is a valid out pointer.
    match unsafe { cuStreamEndCapture(s, &mut g) } {
        CUDA_SUCCESS => Ok(g),
        code => Err(code),
    }
}

fn instantiate(g: CUgraph) -> CUgraphExec {
    let mut e: CUgraphExec = ptr::null_mut();
    // SAFETY: `e` is a valid out pointer.
    let rc = unsafe { cuGraphInstantiateWithFlags(&mut e, g, 0) };
    assert_eq!(rc, CUDA_SUCCESS);
    e
}

#[test]
fn a_graph_replays_exactly_what_was_captured_on_the_stream_it_is_launched_on() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &["-arch=sm_90"]).unwrap()).unwrap();
    let fill = function(m, c"fill").unwrap();
    register(c"fill", fill_kernel);
    let d = alloc(64).unwrap();
    let (s, other) = (
        stream(CU_STREAM_NON_BLOCKING),
        stream(CU_STREAM_NON_BLOCKING),
    );
    assert_eq!(cuStreamBeginCapture_v2(s, 1), CUDA_SUCCESS);
    assert_eq!(
        cuStreamBeginCapture_v2(s, 1),
        api::graph::CUDA_ERROR_ILLEGAL_STATE
    );
    assert_eq!(
        launch(fill, [1, 1, 1], [32, 1, 1], s, &[d, 16, 1]),
        CUDA_SUCCESS
    );
    assert_eq!(
        launch(fill, [1, 1, 1], [32, 1, 1], s, &[d + 16, 16, 2]),
        CUDA_SUCCESS
    );
    let g = end_capture(s).unwrap();
    // Nothing ran during capture, and a launch after the capture is not part of the graph.
    assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_eq!(fake_cuda_launch_count(), 0);
    assert_eq!(peek(d, 32), vec![0xCD; 32]);
    assert_eq!(
        launch(fill, [1, 1, 1], [32, 1, 1], s, &[d + 32, 16, 3]),
        CUDA_SUCCESS
    );
    assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
    let e = instantiate(g);
    assert_eq!(cuGraphDestroy(g), CUDA_SUCCESS); // the executable graph keeps its own copy
    assert_eq!(fake_cuda_live_graphs(), 1);
    // Replayed on another stream than the one captured: there, in capture order.
    let mut want = vec![1u8; 16];
    want.extend([2u8; 16]);
    want.extend([3u8; 16]);
    want.extend([0xCD; 16]);
    for _ in 0..2 {
        assert_eq!(cuMemsetD8Async(d, 0, 48, other), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(other), CUDA_SUCCESS);
        fake_cuda_hold_streams(1);
        assert_eq!(cuGraphLaunch(e, other), CUDA_SUCCESS);
        assert_eq!(peek(d, 16), vec![0; 16], "queued, not run");
        fake_cuda_hold_streams(0);
        assert_eq!(cuStreamSynchronize(other), CUDA_SUCCESS);
        want[32..48].fill(0);
        assert_eq!(peek(d, 64), want);
    }
    assert_eq!(
        (fake_cuda_graph_launches(), fake_cuda_replayed_launches()),
        (2, 4)
    );
    assert_eq!(fake_cuda_launch_count(), 1);
    assert_eq!(cuGraphExecDestroy(e), CUDA_SUCCESS);
    assert_eq!(cuGraphExecDestroy(e), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(cuGraphLaunch(e, s), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(fake_cuda_live_graphs(), 0);
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(cuStreamDestroy_v2(other), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    dev.finish();
}

#[test]
fn other_work_on_a_capturing_stream_invalidates_the_capture() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &["-arch=sm_90"]).unwrap()).unwrap();
    let fill = function(m, c"fill").unwrap();
    register(c"fill", fill_kernel);
    let d = alloc(64).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    let unsupported = api::graph::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    // The built-in streams cannot be captured; a stream not capturing cannot end a capture.
    assert_eq!(cuStreamBeginCapture_v2(ptr::null_mut(), 1), unsupported);
    assert_eq!(end_capture(s), Err(api::graph::CUDA_ERROR_ILLEGAL_STATE));
    for spoil in 0..2 {
        assert_eq!(cuStreamBeginCapture_v2(s, 1), CUDA_SUCCESS);
        assert_eq!(
            launch(fill, [1, 1, 1], [32, 1, 1], s, &[d, 16, 1]),
            CUDA_SUCCESS
        );
        let code = match spoil {
            0 => cuStreamSynchronize(s),
            _ => cuMemsetD8Async(d, 0, 8, s),
        };
        assert_eq!(code, unsupported);
        assert_eq!(
            end_capture(s),
            Err(api::graph::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        );
    }
    assert_eq!(fake_cuda_live_graphs(), 0);
    assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_eq!(peek(d, 16), vec![0xCD; 16], "nothing captured ran");
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    dev.finish();
}
