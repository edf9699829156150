//! The CUDA driver end to end against the fake `libcuda` (`crates/fake-cuda`): one primary-context
//! reference per device, the caller's context restored, page-locked mirrors, errors, address
//! reuse. The same driver on a real GPU: `cuda.rs`.

mod common;

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use common::Fake;
use simpler_driver::cuda::{CudaConfig, CudaDevice};
use simpler_driver::{DevPtr, Device, MapGrant, Op};

type Ctx = *mut c_void;

fn fake() -> Fake {
    Fake::new("fake-cuda", "fake_cuda", &["libcuda.so.1"])
}

fn open_id(fake: &Fake, device_id: u32) -> CudaDevice {
    CudaDevice::open(CudaConfig {
        device_id,
        lib_path: Some(fake.dir.join("libcuda.so.1")),
        pin_mirrors: None,
    })
    .unwrap()
}

fn retains(fake: &Fake, dev: c_int) -> i64 {
    fake.query::<c_int, i64>("retain_count", dev)
}

/// The calling thread's current context, as the fake driver sees it.
fn current(fake: &Fake) -> Ctx {
    let mut ctx: Ctx = std::ptr::null_mut();
    // SAFETY: `CUresult cuCtxGetCurrent(CUcontext *)`; `&mut ctx` is valid for the write.
    let rc =
        unsafe { fake.sym::<unsafe extern "C" fn(*mut Ctx) -> c_int>("cuCtxGetCurrent")(&mut ctx) };
    assert_eq!(rc, 0);
    ctx
}

#[test]
fn round_trip_is_exact_counted_and_every_view_is_a_mirror() {
    let fake = fake();
    let d = open_id(&fake, 0);
    assert_eq!(d.platform(), "cuda");
    let p = d.alloc(1 << 16).unwrap();
    assert!(
        p.0 >= 0xc0da_0000_0000_0000,
        "{p} looks like a host pointer"
    );
    let data: Vec<u8> = (0..1u32 << 16).map(|i| (i * 7) as u8).collect();
    d.copy_h2d(p, &data).unwrap();
    let mut out = vec![0u8; 4096];
    d.copy_d2h(&mut out, DevPtr(p.0 + 1000)).unwrap();
    assert_eq!(out[..], data[1000..1000 + 4096]);
    d.fill(DevPtr(p.0 + 8), 8, 0xA5).unwrap();
    let mut b = [0u8; 8];
    d.copy_d2h(&mut b, DevPtr(p.0 + 8)).unwrap();
    assert_eq!(b, [0xA5; 8]);
    assert!(matches!(
        d.map_host(p, 1 << 16).unwrap(),
        MapGrant::Refused { code: 801, .. }
    ));
    let e = d
        .copy_h2d(DevPtr(p.0 + (1 << 16) - 1), &[0, 0])
        .unwrap_err();
    assert!(
        !e.called
            && e.to_string()
                .starts_with("h2d refused before calling cuMemcpyHtoDAsync_v2"),
        "{e}"
    );
    d.inject_fault(Op::H2d, 1, None).unwrap();
    let e = d.copy_h2d(p, &[1]).unwrap_err();
    assert_eq!(
        (e.call.as_str(), e.code_name.as_str()),
        ("cuMemcpyHtoDAsync_v2", "CUDA_ERROR_ILLEGAL_ADDRESS")
    );
    fake.inject("cuMemAlloc_v2", 1, 2);
    let e = d.alloc(64).unwrap_err();
    assert_eq!(
        (e.code, e.code_name.as_str()),
        (2, "CUDA_ERROR_OUT_OF_MEMORY")
    );
    assert!(
        e.to_string()
            .starts_with("cuMemAlloc_v2 failed with code 2"),
        "{e}"
    );
    d.free(p).unwrap();
    let s = d.stats();
    assert_eq!(
        (
            s.allocs,
            s.frees,
            s.h2d_calls,
            s.d2h_calls,
            s.memset_calls,
            s.map_refusals
        ),
        (1, 1, 1, 2, 1, 1)
    );
    assert_eq!(fake.count("live_allocations"), 0);
}

#[test]
fn one_primary_context_reference_per_device_across_threads_and_devices() {
    let fake = fake();
    let devs: Vec<Arc<CudaDevice>> = (0..2).map(|id| Arc::new(open_id(&fake, id))).collect();
    assert_eq!((retains(&fake, 0), retains(&fake, 1)), (1, 1));
    common::round_trips_on_threads(&devs, 4, 10, 256);
    assert_eq!(
        fake.count("violations"),
        0,
        "every call ran in its own device's context"
    );
    assert_eq!((retains(&fake, 0), retains(&fake, 1)), (1, 1));
    drop(devs);
    assert_eq!((retains(&fake, 0), retains(&fake, 1)), (0, 0));
    assert_eq!(fake.calls("cuDevicePrimaryCtxRelease_v2").len(), 2);
}

#[test]
fn the_callers_context_is_restored_after_every_call() {
    let fake = fake();
    let d = open_id(&fake, 0);
    // A thread with no context keeps none.
    assert!(current(&fake).is_null());
    let p = d.alloc(4096).unwrap();
    assert!(
        current(&fake).is_null(),
        "the primary context was left current"
    );
    // A thread running its own context (device 1) keeps it.
    let mut theirs: Ctx = std::ptr::null_mut();
    // SAFETY: `cuDevicePrimaryCtxRetain(CUcontext *, CUdevice)` / `cuCtxSetCurrent(CUcontext)`.
    unsafe {
        assert_eq!(
            fake.sym::<unsafe extern "C" fn(*mut Ctx, c_int) -> c_int>("cuDevicePrimaryCtxRetain")(
                &mut theirs,
                1
            ),
            0
        );
        assert_eq!(
            fake.sym::<unsafe extern "C" fn(Ctx) -> c_int>("cuCtxSetCurrent")(theirs),
            0
        );
    }
    let q = d.alloc(4096).unwrap();
    assert_eq!(
        fake.query::<u64, c_int>("alloc_device", q.0),
        0,
        "landed on the worker's device"
    );
    assert_eq!(current(&fake), theirs);
    d.copy_h2d(q, &[1; 64]).unwrap();
    d.free(q).unwrap();
    d.free(p).unwrap();
    assert_eq!(current(&fake), theirs);
    assert_eq!(fake.count("violations"), 0);
    drop(d);
    assert_eq!(
        (retains(&fake, 0), retains(&fake, 1)),
        (0, 1),
        "their reference is theirs"
    );
}

#[test]
fn mirrors_are_page_locked_until_freed_and_a_refusal_leaves_them_pageable() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let m = d.alloc_mirror(1 << 20).unwrap();
    assert_eq!(
        (
            fake.count("live_registrations"),
            fake.count("registered_bytes")
        ),
        (1, 1 << 20)
    );
    let s = d.stats();
    assert_eq!((s.pins, s.pinned_bytes), (1, 1 << 20));
    d.free_mirror(&m).unwrap();
    assert_eq!(fake.count("live_registrations"), 0);
    // Nothing left to undo.
    d.free_mirror(&m).unwrap();
    // The driver refuses: an ordinary mirror, still usable.
    fake.inject("cuMemHostRegister_v2", 1, 2);
    let m2 = d.alloc_mirror(4096).unwrap();
    m2.write(0, &[1, 2, 3]).unwrap();
    assert_eq!(fake.count("live_registrations"), 0);
    let refused = d
        .call_log()
        .into_iter()
        .filter(|c| c.op == Op::Pin && c.code == 2)
        .count();
    assert_eq!(refused, 1, "the refusal is in the call log");
    // A failed unregister keeps the memory registered (and alive); close retries it.
    let m3 = d.alloc_mirror(8192).unwrap();
    fake.inject("cuMemHostUnregister", 1, 999);
    let e = d.free_mirror(&m3).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.code),
        (Op::Unpin, "cuMemHostUnregister", 999)
    );
    drop(m3);
    assert_eq!(fake.count("live_registrations"), 1);
    let r = d.close();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(fake.count("live_registrations"), 0);
    let s = d.stats();
    assert_eq!((s.pins, s.unpins, s.pinned_bytes), (2, 2, 0));
}

#[test]
fn a_mirror_close_cannot_unregister_is_leaked_never_freed() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let m = d.alloc_mirror(8192).unwrap();
    fake.inject("cuMemHostUnregister", 1, 999);
    let r = d.close();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!((r.errors[0].op, r.errors[0].code), (Op::Unpin, 999));
    let host = format!("host {:#x} (8192 bytes)", m.owned_addr().unwrap());
    assert!(r.errors[0].detail.contains(&host), "{}", r.errors[0]);
    // Still registered with the driver: the memory stays alive (leaked), and is counted.
    let s = d.stats();
    assert_eq!((s.pins, s.unpins, s.pinned_bytes), (1, 0, 8192));
    assert_eq!(
        Arc::strong_count(&m),
        2,
        "the driver's reference was leaked, not dropped"
    );
    d.free_mirror(&m).unwrap();
}

#[test]
fn close_releases_once_and_the_device_refuses_use_afterwards() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let _p = d.alloc(64).unwrap();
    let r = d.close();
    assert_eq!((r.leaked_allocations, r.leaked_bytes), (1, 64));
    assert_eq!(retains(&fake, 0), 0);
    let e = d.alloc(8).unwrap_err();
    assert!(e.to_string().contains("the device is closed"), "{e}");
    assert_eq!(d.close(), Default::default());
    drop(d);
    assert_eq!(fake.calls("cuDevicePrimaryCtxRelease_v2").len(), 1);
}

#[test]
fn the_fake_reuses_addresses() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let a = d.alloc(4096).unwrap();
    d.free(a).unwrap();
    let b = d.alloc(4096).unwrap();
    assert_eq!(a, b);
    // The ledger tracks the new allocation: the old handle's range is the new one's, so only
    // the runtime's generations can tell them apart (tested from Python).
    d.free(b).unwrap();
    assert!(d.free(b).is_err());
}

#[test]
fn a_failed_context_bind_names_the_address_and_size() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let p = d.alloc(4096).unwrap();
    fake.inject("cuCtxGetCurrent", 1, 201);
    let e = d.copy_h2d(DevPtr(p.0 + 16), &[1; 32]).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.addr, e.bytes),
        (Op::H2d, "cuCtxGetCurrent", Some(p.0 + 16), Some(32))
    );
    fake.inject("cuCtxGetCurrent", 1, 201);
    let e = d.free(p).unwrap_err();
    assert_eq!((e.addr, e.bytes), (Some(p.0), Some(4096)), "{e}");
    fake.inject("cuCtxGetCurrent", 1, 201);
    let e = d.alloc(64).unwrap_err();
    assert_eq!((e.addr, e.bytes), (None, Some(64)), "{e}");
    d.free(p).unwrap();
}
