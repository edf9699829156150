//! The CUDA driver on real hardware. Skips (with the reason printed) where `libcuda.so.1` cannot
//! be opened or has no usable device, so the suite passes on machines without NVIDIA software.

use simpler_driver::cuda::{CudaConfig, CudaDevice};
use simpler_driver::{DevPtr, Device, LoadError, MapGrant, Op};

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

#[test]
fn cuda_round_trip_counts_and_mirrors() {
    let Some(d) = open_or_skip("cuda_round_trip_counts_and_mirrors") else {
        return;
    };
    assert_eq!(d.platform(), "cuda");
    let p = d.alloc(1 << 20).unwrap();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7) as u8).collect();
    d.copy_h2d(p, &data).unwrap();
    let mut out = vec![0u8; 4096];
    d.copy_d2h(&mut out, DevPtr(p.0 + 1000)).unwrap();
    assert_eq!(out[..], data[1000..1000 + 4096]);
    match d.map_host(p, 1 << 20).unwrap() {
        MapGrant::Refused { code, .. } => assert_eq!(code, 801),
        MapGrant::Mapped { .. } => panic!("cuMemAlloc memory is never mapped"),
    }
    assert!(d.unmap_host(p).is_err());
    assert!(d.copy_h2d(DevPtr(p.0 + (1 << 20) - 1), &[0, 0]).is_err());
    assert_eq!(d.alloc(0).unwrap_err().call, "cuMemAlloc_v2");
    d.inject_fault(Op::H2d, 1, None).unwrap();
    let e = d.copy_h2d(p, &[1]).unwrap_err();
    assert_eq!(e.call, "cuMemcpyHtoDAsync_v2");
    d.free(p).unwrap();
    let s = d.stats();
    assert_eq!(
        (
            s.allocs,
            s.frees,
            s.h2d_calls,
            s.d2h_calls,
            s.d2h_bytes,
            s.map_refusals
        ),
        (1, 1, 1, 1, 4096, 1)
    );
    let q = d.alloc(64).unwrap();
    let _ = q;
    let r = d.close();
    assert_eq!((r.leaked_allocations, r.leaked_bytes), (1, 64));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[test]
fn cuda_is_usable_from_several_threads() {
    let Some(d) = open_or_skip("cuda_is_usable_from_several_threads") else {
        return;
    };
    let d = std::sync::Arc::new(d);
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                let p = d.alloc(256).unwrap();
                d.copy_h2d(p, &[t; 256]).unwrap();
                let mut out = [0u8; 256];
                d.copy_d2h(&mut out, p).unwrap();
                assert_eq!(out, [t; 256]);
                d.free(p).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(d.stats().live_allocations, 0);
}
