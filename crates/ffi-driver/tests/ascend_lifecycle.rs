//! The Ascend driver's lifecycle as the CANN runtime counts it, against the fake vendor library:
//! one ACL reference and one device reference per device and process (a session every worker on
//! the device shares), given back once, by the release of the sessions; threads bound
//! without counting; the caller's context restored; a later ACL user unharmed; HAL error
//! classes; logical device ids; address reuse.

mod common;

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use common::{ascend_config, ascend_standard as standard, ascend_with_links, Fake};
use simpler_driver::ascend::{AscendConfig, AscendDevice, RuntimeApi, VisibleDevices};
use simpler_driver::{DevPtr, Device, LoadError, MapGrant, Op, ReleaseReport};

/// Gives back the sessions of this test's private library (what the exit hook does for all).
fn release(fake: &Fake) -> ReleaseReport {
    simpler_driver::release_sessions_of(&fake_lib(fake))
}

fn open_id(fake: &Fake, device_id: u32) -> AscendDevice {
    AscendDevice::open(AscendConfig {
        device_id,
        ..ascend_config(fake)
    })
    .unwrap()
}

/// The call and code name of an open error, which must be `LoadError::Init`.
fn init_call(e: &LoadError) -> (&str, &str) {
    let LoadError::Init {
        call, code_name, ..
    } = e
    else {
        panic!("{e:?}")
    };
    (call, code_name)
}

/// `(aclInit references, device 0 references, device 1 references)` as the fake counts them.
fn refs(fake: &Fake) -> (u64, u64, u64) {
    (
        fake.count("init_count"),
        fake.query::<u32, u64>("device_refs", 0),
        fake.query::<u32, u64>("device_refs", 1),
    )
}

/// The vendor's own entry points, called as another user of the runtime in this process would.
struct OtherUser<'a>(&'a Fake);

impl OtherUser<'_> {
    fn init(&self) -> c_int {
        // SAFETY: `aclError aclInit(const char *)` accepts NULL.
        unsafe {
            self.0
                .sym::<unsafe extern "C" fn(*const c_char) -> c_int>("aclInit")(
                std::ptr::null()
            )
        }
    }
    fn finalize_reference(&self) -> c_int {
        // SAFETY: `aclError aclFinalizeReference(uint64_t *)` accepts NULL.
        unsafe {
            self.0
                .sym::<unsafe extern "C" fn(*mut u64) -> c_int>("aclFinalizeReference")(
                std::ptr::null_mut(),
            )
        }
    }
    fn set_device(&self, id: i32) -> c_int {
        // SAFETY: `aclError aclrtSetDevice(int32_t)`.
        unsafe { self.0.sym::<extern "C" fn(i32) -> c_int>("aclrtSetDevice")(id) }
    }
    fn reset_device(&self, id: i32) -> c_int {
        // SAFETY: `aclError aclrtResetDevice(int32_t)`.
        unsafe {
            self.0
                .sym::<extern "C" fn(i32) -> c_int>("aclrtResetDevice")(id)
        }
    }
    fn malloc_free(&self) -> (c_int, c_int) {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `aclError aclrtMalloc(void **, size_t, int)` / `aclrtFree(void *)`; `&mut p`
        // is valid for the write, and `p` is freed only if the malloc succeeded.
        unsafe {
            let m = self
                .0
                .sym::<unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> c_int>(
                    "aclrtMalloc",
                )(&mut p, 64, 0);
            let f = if m == 0 {
                self.0
                    .sym::<extern "C" fn(*mut c_void) -> c_int>("aclrtFree")(p)
            } else {
                -1
            };
            (m, f)
        }
    }
}

#[test]
fn references_balance_with_workers_on_several_threads_and_devices() {
    let fake = standard();
    assert_eq!(refs(&fake), (0, 0, 0));
    let devs: Vec<AscendDevice> = (0..2).map(|id| open_id(&fake, id)).collect();
    assert_eq!(
        refs(&fake),
        (2, 1, 1),
        "one ACL and one device reference per device"
    );
    // Each thread alternates between the two devices.
    common::round_trips_on_threads(&[&devs[0], &devs[1]], 4, 10, 64);
    // Alternating on this thread too.
    for _ in 0..10 {
        for d in &devs {
            d.free(d.alloc(8).unwrap()).unwrap();
        }
    }
    assert_eq!(refs(&fake), (2, 1, 1), "threads are bound without counting");
    assert_eq!(fake.calls("aclrtSetDevice").len(), 2);
    assert_eq!(
        fake.count("violations"),
        0,
        "every call ran on its own device's context"
    );
    // A second worker on device 0 joins its session: no new reference.
    let again = open_id(&fake, 0);
    assert_eq!(refs(&fake), (2, 1, 1));
    drop(again);
    drop(devs);
    assert_eq!(
        refs(&fake),
        (2, 1, 1),
        "closing the workers keeps the sessions"
    );
    assert!(fake.calls("aclrtResetDevice").is_empty());
    let r = release(&fake);
    assert_eq!((r.sessions, r.errors.len()), (2, 0));
    assert_eq!(refs(&fake), (0, 0, 0), "everything given back once");
    assert_eq!(
        fake.count("reset_freed"),
        0,
        "everything freed before the reset"
    );
    assert_eq!(fake.calls("aclrtResetDevice").len(), 2);
    assert_eq!(fake.calls("aclFinalizeReference").len(), 2);
    assert!(
        fake.calls("aclFinalize").is_empty(),
        "never the global teardown"
    );
}

#[test]
fn a_thread_switched_to_another_device_still_allocates_on_ours_and_keeps_its_context() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let other = OtherUser(&fake);
    // User code (or a framework) binds device 1 on this thread between our calls.
    assert_eq!(other.init(), 100_002);
    assert_eq!(other.set_device(1), 0);
    let theirs = fake.query::<(), usize>("current_context", ());
    assert_ne!(theirs, 0);
    let p = d.alloc(4096).unwrap();
    assert_eq!(
        fake.query::<u64, c_int>("alloc_device", p.0),
        0,
        "landed on the worker's device"
    );
    assert_eq!(
        fake.query::<(), usize>("current_context", ()),
        theirs,
        "their context is back"
    );
    d.copy_h2d(p, &[7; 16]).unwrap();
    d.free(p).unwrap();
    assert_eq!(fake.query::<(), usize>("current_context", ()), theirs);
    assert_eq!(fake.count("violations"), 0);
    drop(d);
    assert_eq!(refs(&fake).2, 1, "their device reference is theirs");
    assert_eq!(other.reset_device(1), 0);
    assert_eq!(other.finalize_reference(), 0);
    assert_eq!(refs(&fake), (1, 1, 0), "our session's");
    release(&fake);
    assert_eq!(refs(&fake), (0, 0, 0));
}

#[test]
fn a_later_acl_user_survives_our_close() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let other = OtherUser(&fake);
    assert_eq!(
        other.init(),
        100_002,
        "REPEAT_INITIALIZE: one more reference"
    );
    d.free(d.alloc(8).unwrap()).unwrap();
    drop(d);
    release(&fake);
    assert_eq!(refs(&fake), (1, 0, 0));
    // ACL is still initialized for them.
    assert_eq!(other.set_device(0), 0);
    assert_eq!(other.malloc_free(), (0, 0));
    assert_eq!(other.reset_device(0), 0);
    assert_eq!(other.finalize_reference(), 0);
    assert_eq!(refs(&fake), (0, 0, 0));
}

#[test]
fn a_failing_set_device_is_an_open_error_that_gives_the_acl_reference_back() {
    let fake = standard();
    fake.inject("aclrtSetDevice", 1, 507_033);
    let e = AscendDevice::open(ascend_config(&fake)).unwrap_err();
    assert_eq!(
        init_call(&e),
        ("aclrtSetDevice", "ACL_ERROR_RT_DEV_SETUP_ERROR")
    );
    assert_eq!(refs(&fake), (0, 0, 0), "{:#?}", fake.log());
    // A later open works.
    let d = open_id(&fake, 0);
    d.free(d.alloc(8).unwrap()).unwrap();
}

#[test]
fn close_frees_the_workers_memory_and_the_release_gives_the_references_back_once() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let p = d.alloc(4096).unwrap();
    assert!(matches!(
        d.map_host(p, 4096).unwrap(),
        MapGrant::Mapped { .. }
    ));
    let r = d.close();
    assert_eq!((r.leaked_mappings, r.leaked_allocations), (1, 1));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        refs(&fake),
        (1, 1, 0),
        "the session stays for the next worker"
    );
    let e = d.alloc(8).unwrap_err();
    assert!(e.to_string().contains("the device is closed"), "{e}");
    assert!(!e.called);
    assert_eq!(d.close(), Default::default(), "close is idempotent");
    // The reset's failure is reported under the device lifecycle.
    fake.inject("aclrtResetDevice", 1, 507_000);
    let r = simpler_driver::release_sessions_of(d.runtime_library());
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    let e = &r.errors[0];
    assert_eq!(
        (e.op, e.call.as_str(), e.code),
        (Op::Device, "aclrtResetDevice", 507_000)
    );
    assert!(
        e.to_string()
            .contains("giving back the reference to device 0"),
        "{e}"
    );
    assert_eq!(fake.count("init_count"), 0);
    assert_eq!(fake.calls("aclrtResetDevice").len(), 1);
    let r = simpler_driver::release_sessions_of(d.runtime_library());
    assert_eq!((r.sessions, r.errors.len()), (0, 0), "released once");
    assert_eq!(fake.calls("aclrtResetDevice").len(), 1);
}

#[test]
fn ten_workers_opened_and_closed_in_a_row_cost_one_device_open() {
    let fake = standard();
    for _ in 0..10 {
        let d = open_id(&fake, 0);
        d.free(d.alloc(64).unwrap()).unwrap();
        d.close();
    }
    let mut events = [0u64; 4];
    // SAFETY: `fake_ascend_lifecycle(uint64_t out[4])`; `events` holds four.
    let ns = unsafe {
        fake.sym::<unsafe extern "C" fn(*mut u64) -> u64>("fake_ascend_lifecycle")(
            events.as_mut_ptr(),
        )
    };
    // [ACL inits, device opens, device resets, finalizes]
    assert_eq!(events, [1, 1, 0, 0], "{:#?}", fake.log());
    assert_eq!(fake.calls("aclrtSetDevice").len(), 1);
    release(&fake);
    let after = unsafe {
        // SAFETY: as above, with a null `out`.
        fake.sym::<unsafe extern "C" fn(*mut u64) -> u64>("fake_ascend_lifecycle")(
            std::ptr::null_mut(),
        )
    };
    assert!(after > ns, "the teardown is priced too");
    assert_eq!(refs(&fake), (0, 0, 0));
}

#[test]
fn hal_error_classes_map_to_mirror_or_error() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let p = d.alloc(8192).unwrap();
    // Capability answers: mirror.
    fake.inject("halHostRegister", 1, 0xfffe);
    assert!(matches!(
        d.map_host(p, 8192).unwrap(),
        MapGrant::Refused { code: 0xfffe, .. }
    ));
    // Bugs: errors naming the call and code.
    for (code, name) in [
        (3, "DRV_ERROR_INVALID_VALUE"),
        (8, "DRV_ERROR_PARA_ERROR"),
        (2, "DRV_ERROR_INVALID_DEVICE"),
        (7, "DRV_ERROR_INNER_ERR"),
    ] {
        fake.inject("halHostRegister", 1, code);
        let e = d.map_host(p, 8192).unwrap_err();
        assert_eq!(
            (e.op, e.call.as_str(), e.code, e.code_name.as_str()),
            (Op::Map, "halHostRegister", i64::from(code), name)
        );
        assert!(e.called);
    }
    // A real unaligned pointer, inside the allocation: the fake HAL's INVALID_VALUE is an error.
    let e = d.map_host(DevPtr(p.0 + 64), 64).unwrap_err();
    assert_eq!((e.call.as_str(), e.code), ("halHostRegister", 3));
    let s = d.stats();
    assert_eq!(
        (s.maps, s.map_refusals, s.live_mappings),
        (1, 1, 0),
        "errors are not refusals"
    );
    assert!(matches!(
        d.map_host(p, 8192).unwrap(),
        MapGrant::Mapped { .. }
    ));
    d.unmap_host(p).unwrap();
    d.free(p).unwrap();
}

#[test]
fn the_hal_gets_the_logical_id_the_runtime_translates() {
    let fake = standard();
    assert_eq!(fake.set("set_visible", Some("3,5")), 0);
    let d = open_id(&fake, 1);
    assert_eq!((d.device_id(), d.logical_device_id()), (1, 5));
    let p = d.alloc(4096).unwrap();
    assert!(matches!(
        d.map_host(p, 4096).unwrap(),
        MapGrant::Mapped { .. }
    ));
    d.unmap_host(p).unwrap();
    d.free(p).unwrap();
    assert_eq!(
        fake.calls("aclrtGetLogicDevIdByUserDevId"),
        ["aclrtGetLogicDevIdByUserDevId 1 logical=5 -> 0"]
    );
    assert!(fake.calls("aclrtSetDevice")[0].starts_with("aclrtSetDevice 1 logical=5"));
    assert!(fake.calls("halHostRegister")[0].contains("devid=5"));
    assert_eq!(
        fake.calls("halHostUnregister"),
        [format!("halHostUnregister {:#x} devid=5 -> 0", p.0)]
    );
    let lib = d.runtime_library().to_string();
    drop(d);

    // Where the runtime does not translate, the ASCEND_RT_VISIBLE_DEVICES value is read by the
    // runtime's rules (here: from the config, stopping at the bad entry), by a new session.
    simpler_driver::release_sessions_of(&lib);
    fake.inject("aclrtGetLogicDevIdByUserDevId", 1, 200_001);
    let d = AscendDevice::open(AscendConfig {
        device_id: 1,
        visible_devices: VisibleDevices::Value("3,5,x,9".into()),
        ..ascend_config(&fake)
    })
    .unwrap();
    assert_eq!(d.logical_device_id(), 5);
    drop(d);

    // A user id the runtime does not know: an open error naming the translation call.
    let e = AscendDevice::open(AscendConfig {
        device_id: 2,
        lib_dir: Some(fake.dir.clone()),
        ..AscendConfig::default()
    })
    .unwrap_err();
    assert_eq!(
        init_call(&e),
        (
            "aclrtGetLogicDevIdByUserDevId",
            "ACL_ERROR_RT_INVALID_DEVICEID"
        )
    );
    assert_eq!(
        refs(&fake),
        (1, 0, 0),
        "user device 1's session (logical 5) stays"
    );
    assert_eq!(fake.query::<u32, u64>("device_refs", 5), 1);
    release(&fake);
    assert_eq!(refs(&fake), (0, 0, 0));
}

#[test]
fn the_rt_runtime_is_bound_and_counted_the_same_way() {
    let fake = ascend_with_links(&["libruntime.so", "libascend_hal.so"]);
    let d = Arc::new(open_id(&fake, 1));
    assert_eq!(d.runtime_api(), RuntimeApi::Rt);
    let t = {
        let d = d.clone();
        std::thread::spawn(move || d.free(d.alloc(64).unwrap()).unwrap())
    };
    t.join().unwrap();
    assert_eq!(fake.calls("rtSetDevice").len(), 1);
    assert!(
        !fake.calls("rtCtxSetCurrent").is_empty(),
        "the other thread was bound by context"
    );
    let lib = d.runtime_library().to_string();
    drop(d);
    assert!(
        fake.calls("rtDeviceReset").is_empty(),
        "the session outlives the worker"
    );
    simpler_driver::release_sessions_of(&lib);
    assert_eq!(refs(&fake), (0, 0, 0));
    assert_eq!(fake.calls("rtDeviceReset").len(), 1);
    assert_eq!(fake.count("violations"), 0);
}

#[test]
fn the_fake_reuses_addresses_and_can_hand_out_host_addresses() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let a = d.alloc(4096).unwrap();
    d.free(a).unwrap();
    let b = d.alloc(4096).unwrap();
    assert_eq!(
        a, b,
        "a freed address is handed out again, as the runtime does"
    );
    d.free(b).unwrap();

    // Host address mode: the mapping's host pointer equals the device address; nothing in the
    // driver depends on them differing.
    assert_eq!(fake.set("set_addresses", Some("host")), 0);
    let p = d.alloc(8192).unwrap();
    let MapGrant::Mapped { mem, .. } = d.map_host(p, 8192).unwrap() else {
        panic!("must map")
    };
    assert!(fake.calls("halHostRegister")[0].contains(&format!("host={:#x}", p.0)));
    mem.write(10, &[4, 5]).unwrap();
    let mut out = [0u8; 2];
    d.copy_d2h(&mut out, DevPtr(p.0 + 10)).unwrap();
    assert_eq!(out, [4, 5]);
    d.unmap_host(p).unwrap();
    d.free(p).unwrap();
    assert_eq!(fake.count("violations"), 0);
}

#[test]
fn close_frees_before_it_resets_and_revokes_a_mapping_it_could_not_unregister() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let kept = d.alloc(4096).unwrap();
    let MapGrant::Mapped { mem, .. } = d.map_host(kept, 4096).unwrap() else {
        panic!("must map")
    };
    d.alloc(64).unwrap();
    fake.inject("halHostUnregister", 1, 7);
    let r = d.close();
    let errs: Vec<(Op, &str, bool)> = r
        .errors
        .iter()
        .map(|e| (e.op, e.call.as_str(), e.called))
        .collect();
    // The unregister failed; so the free of that allocation was refused (never a free while mapped).
    assert_eq!(
        errs,
        [
            (Op::Unmap, "halHostUnregister", true),
            (Op::Free, "aclrtFree", false)
        ]
    );
    // The failed unmap is logged with the mapping's size.
    let unmaps: Vec<(u64, u64, i64)> = d
        .call_log()
        .iter()
        .filter(|c| c.op == Op::Unmap)
        .map(|c| (c.addr, c.bytes, c.code))
        .collect();
    assert_eq!(unmaps, [(kept.0, 4096, 7)]);
    // The host side is gone at close; the runtime frees what we could not when the session's
    // device reference goes.
    assert!(mem.write(0, &[1]).is_err());
    assert_eq!(fake.count("reset_freed"), 0);
    simpler_driver::release_sessions_of(d.runtime_library());
    assert_eq!(
        fake.count("reset_freed"),
        1,
        "only the allocation still mapped"
    );
    // The HAL is not reached after close either.
    let e = d.map_host(kept, 4096).unwrap_err();
    assert!(
        !e.called && e.to_string().contains("the device is closed"),
        "{e}"
    );
    let e = d.unmap_host(kept).unwrap_err();
    assert!(!e.called, "{e}");
    assert_eq!(fake.calls("halHostRegister").len(), 1);

    // Without failures, nothing is left for the reset to free.
    let fake = standard();
    let d = open_id(&fake, 0);
    let p = d.alloc(4096).unwrap();
    assert!(matches!(
        d.map_host(p, 4096).unwrap(),
        MapGrant::Mapped { .. }
    ));
    d.alloc(64).unwrap();
    assert!(d.close().errors.is_empty());
    release(&fake);
    assert_eq!(
        (fake.count("reset_freed"), fake.count("violations")),
        (0, 0)
    );
}

#[test]
fn a_failed_open_leaves_the_callers_context_current() {
    let fake = standard();
    let other = OtherUser(&fake);
    assert_eq!(other.init(), 0);
    assert_eq!(other.set_device(1), 0);
    let theirs = fake.query::<(), usize>("current_context", ());
    // The context read after `aclrtSetDevice` fails: the open fails, and undoes what it did.
    fake.inject("aclrtGetCurrentContext", 2, 507_000);
    let e = AscendDevice::open(ascend_config(&fake)).unwrap_err();
    assert!(matches!(e, LoadError::Init { .. }), "{e:?}");
    assert_eq!(fake.query::<(), usize>("current_context", ()), theirs);
    assert_eq!(refs(&fake), (1, 0, 1), "only their references remain");
    assert_eq!(other.reset_device(1), 0);
    assert_eq!(other.finalize_reference(), 0);
}

/// Runs `f` on a thread of its own that keeps running between calls (a worker thread of the
/// user's), one call per message, and returns the sender; `None` ends it.
fn bound_thread() -> (
    std::sync::mpsc::Sender<Option<Arc<AscendDevice>>>,
    std::sync::mpsc::Receiver<()>,
    std::thread::JoinHandle<()>,
) {
    let (go, wait) = std::sync::mpsc::channel::<Option<Arc<AscendDevice>>>();
    let (done, finished) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        while let Ok(Some(d)) = wait.recv() {
            let p = d.alloc(64).unwrap();
            d.free(p).unwrap();
            drop(d); // before the test goes on (a session is kept while a worker is open)
            done.send(()).unwrap();
        }
    });
    (go, finished, t)
}

#[test]
fn a_thread_left_on_a_given_back_context_works_with_a_reopened_device() {
    let fake = standard();
    let d = Arc::new(open_id(&fake, 0));
    // A thread that never bound a context keeps the worker's after a call (the runtime has no
    // "unbind"); after the session is given back, that thread holds a dead context, which the
    // runtime brings back to life (the same object) when the device is set again.
    let (go, finished, t) = bound_thread();
    go.send(Some(d.clone())).unwrap();
    finished.recv().unwrap();
    drop(d);
    release(&fake);
    let d2 = Arc::new(open_id(&fake, 0));
    go.send(Some(d2.clone())).unwrap();
    finished.recv().unwrap();
    go.send(None).unwrap();
    t.join().unwrap();
    assert_eq!(fake.count("violations"), 0);
    drop(d2);
    release(&fake);
    assert_eq!(refs(&fake), (0, 0, 0));
}

#[test]
fn a_context_given_back_is_never_restored() {
    let fake = standard();
    let d0 = Arc::new(open_id(&fake, 0));
    let (go, finished, t) = bound_thread();
    go.send(Some(d0.clone())).unwrap();
    finished.recv().unwrap();
    drop(d0);
    // The thread is left on device 0's context; giving the session back resets that device.
    release(&fake);
    let dead = fake.log().len();
    // Another device's worker, called from that thread: its context is bound, and the dead one
    // is not made current again afterwards (restoring a reset device's context is forbidden).
    let d1 = Arc::new(open_id(&fake, 1));
    go.send(Some(d1.clone())).unwrap();
    finished.recv().unwrap();
    go.send(None).unwrap();
    t.join().unwrap();
    let sets: Vec<String> = fake.log()[dead..]
        .iter()
        .filter(|l| l.starts_with("aclrtSetCurrentContext"))
        .cloned()
        .collect();
    assert_eq!(sets.len(), 1, "bound once, never restored: {sets:#?}");
    assert!(sets[0].ends_with("-> 0"), "{sets:#?}");
    drop(d1);
    release(&fake);
    assert_eq!(refs(&fake), (0, 0, 0));
}

/// Where this test's runtime library was opened from (its sessions' key).
fn fake_lib(fake: &Fake) -> String {
    fake.dir.join("libascendcl.so").display().to_string()
}

#[test]
fn a_failed_context_bind_names_the_address_and_size() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let p = d.alloc(4096).unwrap();
    fake.inject("aclrtGetCurrentContext", 1, 507_000);
    let e = d.fill(DevPtr(p.0 + 16), 32, 0).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.addr, e.bytes),
        (
            Op::Memset,
            "aclrtGetCurrentContext",
            Some(p.0 + 16),
            Some(32)
        )
    );
    fake.inject("aclrtGetCurrentContext", 1, 507_000);
    let e = d.free(p).unwrap_err();
    assert_eq!((e.addr, e.bytes), (Some(p.0), Some(4096)), "{e}");
    fake.inject("aclrtGetCurrentContext", 1, 507_000);
    let e = d.alloc(64).unwrap_err();
    assert_eq!((e.addr, e.bytes), (None, Some(64)), "{e}");
    d.free(p).unwrap();
}

#[test]
fn a_device_fault_poisons_every_worker_on_the_device_until_the_last_one_closes() {
    let fake = standard();
    let (a, b) = (open_id(&fake, 0), open_id(&fake, 0));
    let p = a.alloc(4096).unwrap();
    let q = b.alloc(4096).unwrap();
    // An AI Core exception reported by a copy: the fake poisons the device, as the runtime does.
    fake.inject("aclrtMemcpy", 1, 507_015);
    let e = a.copy_h2d(p, &[1; 64]).unwrap_err();
    assert_eq!((e.code, e.called), (507_015, true), "{e}");
    assert_eq!(fake.query::<u32, c_int>("poisoned", 0), 507_015);
    // Every later call of every worker on the device is refused, naming the first fault.
    let e = b.copy_h2d(q, &[1; 64]).unwrap_err();
    assert!(!e.called && e.code == 507_015, "{e}");
    assert!(e.to_string().contains("aclrtMemcpy reported"), "{e}");
    let r = a.close();
    assert_eq!(r.errors.len(), 1, "one summary: {:?}", r.errors);
    assert!(
        r.errors[0]
            .to_string()
            .contains("after the device fault aclrtMemcpy reported"),
        "{}",
        r.errors[0]
    );
    assert_eq!(refs(&fake), (1, 1, 0), "b still holds the session");
    b.close();
    // The last close gave the faulted session back: the device was reset, its fault cleared,
    // and what the failed frees left was freed by the reset.
    assert_eq!(refs(&fake), (0, 0, 0));
    assert_eq!(fake.query::<u32, c_int>("poisoned", 0), 0);
    assert_eq!(fake.count("reset_freed"), 2);
    let c = open_id(&fake, 0);
    c.free(c.alloc(64).unwrap()).unwrap();
    drop(c);
    release(&fake);
    assert_eq!(refs(&fake), (0, 0, 0));
}

#[test]
fn a_session_is_never_given_back_under_an_open_device() {
    let fake = standard();
    let d = open_id(&fake, 0);
    let p = d.alloc(4096).unwrap();
    // The device was opened directly (not through open_device): the release cannot close it,
    // so it keeps the session and says why.
    let r = release(&fake);
    assert_eq!(r.sessions, 0);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(
        r.errors[0].to_string().contains("close them first"),
        "{}",
        r.errors[0]
    );
    assert_eq!(refs(&fake), (1, 1, 0));
    d.copy_h2d(p, &[3; 64]).unwrap();
    d.close();
    assert_eq!(release(&fake).sessions, 1);
    assert_eq!(refs(&fake), (0, 0, 0));
}
