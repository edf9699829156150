//! The CUDA driver on real hardware. Skips (with the reason printed) where `libcuda.so.1` cannot
//! be opened or has no usable device, so the suite passes on machines without NVIDIA software.

mod common;

use simpler_driver::cuda::{CudaConfig, CudaDevice};
use simpler_driver::{Device, LoadError, MapGrant, Op};

fn open_or_skip(test: &str) -> Option<CudaDevice> {
    match CudaDevice::open(CudaConfig::default()) {
        Ok(d) => Some(d),
        // No driver library, the toolkit's stub library, or no device: nothing to test here.
        Err(e @ LoadError::Library { .. }) | Err(e @ LoadError::Init { code: 34 | 100, .. }) => {
            eprintln!("skipping {test}: CUDA unavailable: {e}");
            None
        }
        // A driver that loads but fails otherwise is a real failure.
        Err(e) => panic!("CUDA driver present but unusable: {e}"),
    }
}

/// The driver's own answers first (a refused mapping, its call names), then the shared
/// conformance checks (round trips, counters, refusals, asynchronous uploads, threads, close).
#[test]
fn cuda_round_trip_counts_and_mirrors() {
    let Some(d) = open_or_skip("cuda_round_trip_counts_and_mirrors") else {
        return;
    };
    assert_eq!(d.platform(), "cuda");
    let p = d.alloc(1 << 20).unwrap();
    match d.map_host(p, 1 << 20).unwrap() {
        MapGrant::Refused { code, .. } => assert_eq!(code, 801),
        MapGrant::Mapped { .. } => panic!("cuMemAlloc memory is never mapped"),
    }
    assert!(d.unmap_host(p).is_err());
    assert_eq!(d.alloc(0).unwrap_err().call, "cuMemAlloc_v2");
    d.inject_fault(Op::H2d, 1, None).unwrap();
    let e = d.copy_h2d(p, &[1]).unwrap_err();
    assert_eq!(e.call, "cuMemcpyHtoDAsync_v2");
    d.free(p).unwrap();
    let s = d.stats();
    assert_eq!(
        (s.allocs, s.frees, s.h2d_calls, s.map_refusals),
        (1, 1, 0, 1)
    );
    let c = common::conformance(&d, "cuda");
    assert_eq!(c.refused.call, "cuMemcpyHtoDAsync_v2");
}
