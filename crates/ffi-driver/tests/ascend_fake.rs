//! The Ascend driver end to end against the fake vendor library (`crates/fake-ascend`): calls,
//! checks, mappings, errors. The lifecycle (references, contexts, threads, device ids) is in
//! `ascend_lifecycle.rs`.
//!
//! Each test gets a private copy of the fake (see `common`), passed in `AscendConfig::lib_dir`,
//! so no test touches environment variables.

mod common;

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use common::{
    ascend_config as config, ascend_standard as standard, ascend_with_links as with_links,
    libc_path, Fake,
};
use simpler_driver::ascend::{AscendConfig, AscendDevice, MallocPolicy, RuntimeApi};
use simpler_driver::{DevPtr, Device, HostMemError, LoadError, MapGrant, Op};

const NOT_SUPPORT: i64 = 0xfffe;

fn open(fake: &Fake) -> AscendDevice {
    AscendDevice::open(config(fake)).unwrap()
}

fn hex(p: DevPtr) -> String {
    format!("{:#x}", p.0)
}

/// The shared conformance checks, and what the vendor saw of them: each counted call reached it
/// once, with the huge-first policy and the right kinds, and no refused one did.
#[test]
fn conforms_and_every_counted_call_reaches_the_vendor_once() {
    let fake = standard();
    let d = open(&fake);
    assert_eq!(d.platform(), "ascend");
    assert_eq!(d.runtime_api(), RuntimeApi::Acl);
    let c = common::conformance(&d, "ascend");
    assert!(
        c.ptr.0 >= 0xa5c0_0000_0000_0000,
        "device address {} looks like a host pointer",
        c.ptr
    );
    assert_eq!(
        (c.refused.call.as_str(), c.refused.called),
        ("aclrtMemcpy", false)
    );
    assert_eq!(c.stats.peak_bytes, common::CONFORMANCE_BYTES);
    assert_eq!(fake.calls("aclInit").len(), 1);
    assert_eq!(
        fake.calls("aclrtSetDevice"),
        ["aclrtSetDevice 0 logical=0 refs=1 -> 0"]
    );
    let malloc = fake.calls("aclrtMalloc");
    assert_eq!(malloc.len() as u64, c.stats.allocs);
    assert!(malloc[0].contains(" 65536 HugeFirst "), "{malloc:?}");
    let memcpy = fake.calls("aclrtMemcpy");
    let kind = |k: &str| memcpy.iter().filter(|l| l.contains(k)).count() as u64;
    assert_eq!(
        (memcpy.len() as u64, kind("kind=1"), kind("kind=2")),
        (
            c.stats.h2d_calls + c.stats.d2h_calls,
            c.stats.h2d_calls,
            c.stats.d2h_calls
        ),
        "{memcpy:?}"
    );
    assert!(memcpy[0].contains("kind=1"), "{memcpy:?}");
    assert_eq!(fake.calls("aclrtMemset").len() as u64, c.stats.memset_calls);
    let free = fake.calls("aclrtFree");
    assert_eq!(free[0], format!("aclrtFree {} -> 0", hex(c.ptr)));
    assert_eq!(
        free.len() as u64,
        c.stats.frees + c.close.leaked_allocations
    );
    assert_eq!(fake.count("live_allocations"), 0);
}

#[test]
fn invalid_calls_fail_before_any_vendor_call() {
    let fake = standard();
    let d = open(&fake);
    let e = d.alloc(0).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.called),
        (Op::Alloc, "aclrtMalloc", false)
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with("alloc refused before calling aclrtMalloc"),
        "{msg}"
    );
    assert!(
        msg.contains("zero-byte") && !msg.contains("failed"),
        "{msg}"
    );
    assert!(fake.calls("aclrtMalloc").is_empty());
    // Copies, fills and frees out of range: the conformance test above.
}

#[test]
fn small_allocations_mirror_and_large_ones_map_on_the_same_device() {
    let fake = standard();
    assert_eq!(fake.set("set_map", Some("min:4096")), 0);
    let d = open(&fake);
    let small = d.alloc(64).unwrap();
    let big = d.alloc(8192).unwrap();
    match d.map_host(small, 64).unwrap() {
        MapGrant::Refused { code, reason } => {
            assert_eq!(code, NOT_SUPPORT);
            assert!(reason.contains("DRV_ERROR_NOT_SUPPORT"), "{reason}");
        }
        MapGrant::Mapped { .. } => panic!("a 64-byte allocation must be refused"),
    }
    let MapGrant::Mapped { mem, offset } = d.map_host(big, 8192).unwrap() else {
        panic!("an 8 KiB allocation must map")
    };
    assert_eq!((offset, mem.len()), (0, 8192));
    assert!(
        mem.owned_addr().is_none(),
        "a vendor mapping is foreign memory"
    );
    // The mapping and the copies see the same bytes.
    mem.write(100, &[1, 2, 3]).unwrap();
    let mut b = [0u8; 3];
    d.copy_d2h(&mut b, DevPtr(big.0 + 100)).unwrap();
    assert_eq!(b, [1, 2, 3]);
    d.copy_h2d(DevPtr(big.0 + 8000), &[9; 4]).unwrap();
    let mut m = [0u8; 4];
    mem.read(8000, &mut m).unwrap();
    assert_eq!(m, [9; 4]);
    // Mapping twice is an invalid call (the HAL would answer PARA_ERROR), not a refusal.
    let e = d.map_host(big, 16).unwrap_err();
    assert_eq!(e.code, 8);
    // Free refuses a mapped allocation; nothing reaches the runtime.
    let e = d.free(big).unwrap_err();
    assert!(e.to_string().contains("unmap first"), "{e}");
    assert!(
        e.to_string()
            .starts_with("free refused before calling aclrtFree"),
        "a call never made must not read as a failed one: {e}"
    );
    assert!(fake.calls("aclrtFree").is_empty());
    d.unmap_host(big).unwrap();
    assert_eq!(mem.read(0, &mut m), Err(HostMemError::Revoked));
    assert!(d.unmap_host(big).is_err());
    assert!(d.unmap_host(small).is_err());
    d.free(big).unwrap();
    d.free(small).unwrap();
    let s = d.stats();
    assert_eq!(
        (s.maps, s.map_refusals, s.unmaps, s.live_mappings),
        (2, 1, 1, 0)
    );
    assert_eq!(fake.calls("halHostRegister").len(), 2);
    assert_eq!(
        (fake.count("live_mappings"), fake.count("violations")),
        (0, 0)
    );
    let refused: Vec<_> = d
        .call_log()
        .into_iter()
        .filter(|c| c.op == Op::Map && c.code == NOT_SUPPORT)
        .collect();
    assert_eq!(refused.len(), 1, "the refusal is recorded in the call log");
}

#[test]
fn ordinary_pages_are_refused_and_huge_only_makes_small_allocations_mappable() {
    let fake = standard();
    assert_eq!(fake.set("set_map", Some("pages")), 0);
    let d = open(&fake);
    let small = d.alloc(4096).unwrap();
    let large = d.alloc(2 << 20).unwrap();
    assert!(matches!(
        d.map_host(small, 4096).unwrap(),
        MapGrant::Refused {
            code: NOT_SUPPORT,
            ..
        }
    ));
    assert!(matches!(
        d.map_host(large, 2 << 20).unwrap(),
        MapGrant::Mapped { .. }
    ));
    drop(d);

    let fake = standard();
    assert_eq!(fake.set("set_map", Some("pages")), 0);
    let d = AscendDevice::open(AscendConfig {
        malloc_policy: MallocPolicy::HugeOnly,
        ..config(&fake)
    })
    .unwrap();
    let small = d.alloc(4096).unwrap();
    assert!(fake.calls("aclrtMalloc")[0].contains("HugeOnly"));
    assert!(matches!(
        d.map_host(small, 4096).unwrap(),
        MapGrant::Mapped { .. }
    ));
    let r = d.close();
    assert_eq!((r.leaked_mappings, r.leaked_allocations), (1, 1));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[test]
fn stub_style_null_success_is_a_refusal() {
    let fake = standard();
    assert_eq!(fake.set("set_map", Some("stubnull")), 0);
    let d = open(&fake);
    let p = d.alloc(1 << 20).unwrap();
    match d.map_host(p, 1 << 20).unwrap() {
        MapGrant::Refused { code, reason } => {
            assert_eq!(code, 0);
            assert!(reason.contains("no host pointer"), "{reason}");
        }
        MapGrant::Mapped { .. } => panic!("a null out-pointer must not be a mapping"),
    }
    let s = d.stats();
    assert_eq!((s.maps, s.map_refusals, s.live_mappings), (1, 1, 0));
    // Nothing to unregister: the free goes straight through.
    d.free(p).unwrap();
    assert!(fake.calls("halHostUnregister").is_empty());
}

#[test]
fn every_unregister_precedes_the_matching_free() {
    let fake = standard();
    let d = open(&fake);
    let ptrs: Vec<DevPtr> = (1..=4).map(|i| d.alloc(i * 4096).unwrap()).collect();
    for (i, &p) in ptrs.iter().enumerate() {
        assert!(matches!(
            d.map_host(p, (i as u64 + 1) * 4096).unwrap(),
            MapGrant::Mapped { .. }
        ));
    }
    // One unmapped and freed explicitly; the rest left for close.
    d.unmap_host(ptrs[0]).unwrap();
    d.free(ptrs[0]).unwrap();
    let r = d.close();
    assert_eq!((r.leaked_mappings, r.leaked_allocations), (3, 3));
    assert!(r.errors.is_empty(), "{:?}", r.errors);

    let log = fake.log();
    let index = |prefix: &str| {
        log.iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` in {log:#?}"))
    };
    for &p in &ptrs {
        let unregister = index(&format!("halHostUnregister {} ", hex(p)));
        let free = index(&format!("aclrtFree {} ", hex(p)));
        assert!(
            unregister < free,
            "free before unregister for {p}: {log:#?}"
        );
    }
    assert!(log.iter().all(|l| !l.contains("STILL-MAPPED")), "{log:#?}");
    assert_eq!(fake.count("violations"), 0);
    assert_eq!(
        (fake.count("live_allocations"), fake.count("live_mappings")),
        (0, 0)
    );
    // Close left the process's session (the device reference) to the next worker; releasing
    // the sessions gives it back, once.
    assert!(fake.calls("aclrtResetDevice").is_empty());
    simpler_driver::release_sessions_of(d.runtime_library());
    assert_eq!(
        fake.calls("aclrtResetDevice"),
        ["aclrtResetDevice 0 logical=0 refs=0 -> 0"]
    );
}

#[test]
fn a_failed_unregister_keeps_the_allocation_alive_until_it_succeeds() {
    let fake = standard();
    let d = open(&fake);
    let p = d.alloc(4096).unwrap();
    let MapGrant::Mapped { mem, .. } = d.map_host(p, 4096).unwrap() else {
        panic!("must map")
    };
    fake.inject("halHostUnregister", 1, 7);
    let e = d.unmap_host(p).unwrap_err();
    assert_eq!((e.call.as_str(), e.code), ("halHostUnregister", 7));
    assert!(e.to_string().contains("DRV_ERROR_INNER_ERR"), "{e}");
    // The HAL still maps it: the host side stays usable, the allocation cannot be freed yet.
    mem.write(0, &[42]).unwrap();
    let mut b = [0u8; 1];
    d.copy_d2h(&mut b, p).unwrap();
    assert_eq!(b, [42], "the mapping still reaches device memory");
    assert!(d.free(p).is_err());
    d.unmap_host(p).unwrap();
    // Unregistered: now the host side is gone.
    assert_eq!(mem.read(0, &mut b), Err(HostMemError::Revoked));
    d.free(p).unwrap();
    assert_eq!(fake.count("violations"), 0);
}

#[test]
fn an_injected_memcpy_failure_names_the_call_and_code_and_leaks_nothing() {
    let fake = standard();
    let d = open(&fake);
    let p = d.alloc(256).unwrap();
    fake.inject("aclrtMemcpy", 1, 507_000);
    let e = d.copy_h2d(p, &[1u8; 256]).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.code, e.code_name.as_str()),
        (
            Op::H2d,
            "aclrtMemcpy",
            507_000,
            "ACL_ERROR_RT_INTERNAL_ERROR"
        )
    );
    let msg = e.to_string();
    for needle in [
        "aclrtMemcpy",
        "507000",
        "ACL_ERROR_RT_INTERNAL_ERROR",
        &hex(p),
        "256 bytes",
    ] {
        assert!(msg.contains(needle), "{needle} missing from: {msg}");
    }
    assert_eq!(d.stats().h2d_calls, 0, "a failed copy is not counted");
    assert_eq!(d.call_log().last().unwrap().code, 507_000);
    // The device stays usable and nothing leaks.
    d.copy_h2d(p, &[2u8; 256]).unwrap();
    d.free(p).unwrap();
    assert_eq!(d.stats().live_allocations, 0);
    assert_eq!(fake.count("live_allocations"), 0);

    // A fault injected through the Device trait fails before the vendor call, with its name.
    let q = d.alloc(8).unwrap();
    let before = fake.calls("aclrtMemcpy").len();
    d.inject_fault(Op::D2h, 1, None).unwrap();
    let e = d.copy_d2h(&mut [0u8; 8], q).unwrap_err();
    assert_eq!((e.call.as_str(), e.code), ("aclrtMemcpy", 507_000));
    assert_eq!(fake.calls("aclrtMemcpy").len(), before);
    d.free(q).unwrap();
    assert_eq!(fake.count("live_allocations"), 0);
    assert_eq!(d.close(), Default::default());
}

#[test]
fn missing_libraries_are_errors_naming_library_paths_and_settings() {
    // Nothing at all: the HAL is looked for first, and the error says how to point at it.
    let fake = with_links(&[]);
    let e = AscendDevice::open(config(&fake)).unwrap_err();
    let LoadError::Library { library, tried, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(library, "libascend_hal.so");
    let paths: Vec<&str> = tried.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(
        paths,
        [fake.dir.join("libascend_hal.so").display().to_string()]
    );
    let msg = e.to_string();
    assert!(
        msg.contains("SIMPLER_ASCEND_LIB_DIR") && msg.contains("ASCEND_HOME_PATH"),
        "{msg}"
    );

    // A HAL but no runtime: both runtime alternatives are reported with their paths.
    let fake = with_links(&["libascend_hal.so"]);
    let e = AscendDevice::open(config(&fake)).unwrap_err();
    assert!(matches!(e, LoadError::NoAlternative { .. }), "{e:?}");
    let msg = e.to_string();
    for name in ["libascendcl.so", "libruntime.so"] {
        let path = fake.dir.join(name);
        assert!(
            msg.contains(&path.display().to_string()),
            "{path:?} missing from: {msg}"
        );
    }
}

#[test]
fn a_missing_symbol_is_an_error_naming_library_path_and_symbol() {
    let fake = with_links(&["libascendcl.so"]);
    let libc = libc_path();
    fake.link("libascend_hal.so", &libc);
    let e = AscendDevice::open(config(&fake)).unwrap_err();
    let LoadError::Symbol {
        library,
        path,
        symbol,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(
        (library.as_str(), symbol.as_str()),
        ("libascend_hal.so", "halHostRegister")
    );
    assert_eq!(
        path,
        &fake.dir.join("libascend_hal.so").display().to_string()
    );
    let msg = e.to_string();
    assert!(
        msg.contains("halHostRegister") && msg.contains(path.as_str()),
        "{msg}"
    );
}

#[test]
fn the_rt_runtime_is_used_where_acl_is_absent() {
    for acl_is_libc in [false, true] {
        let fake = with_links(&["libruntime.so", "libascend_hal.so"]);
        if acl_is_libc {
            // libascendcl.so opens but lacks the acl symbols.
            fake.link("libascendcl.so", &libc_path());
        }
        let d = open(&fake);
        assert_eq!(d.runtime_api(), RuntimeApi::Rt);
        assert!(d.runtime_library().ends_with("libruntime.so"));
        let p = d.alloc(64).unwrap();
        assert!(matches!(
            d.map_host(p, 64).unwrap(),
            MapGrant::Mapped { .. }
        ));
        fake.inject("rtMemcpy", 1, 207_001);
        let e = d.copy_h2d(p, &[1]).unwrap_err();
        assert_eq!(
            (e.call.as_str(), e.code_name.as_str()),
            ("rtMemcpy", "ACL_ERROR_RT_MEMORY_ALLOCATION")
        );
        // The conformance checks with `p` still mapped: close removes its mapping and frees it
        // with what the checks leave live.
        let c = common::conformance(&d, "ascend over rt");
        assert_eq!(
            (c.close.leaked_mappings, c.close.leaked_allocations),
            (1, 2)
        );
        let log = fake.log();
        assert!(log.iter().all(|l| !l.starts_with("acl")), "{log:#?}");
        assert_eq!(fake.calls("rtSetDevice").len(), 1);
        assert!(fake.calls("rtMalloc")[0].contains("HugeFirst"));
        assert_eq!(
            fake.calls("rtFree").len() as u64,
            c.stats.frees + c.close.leaked_allocations
        );
        assert_eq!(
            fake.calls("rtDeviceReset").len(),
            0,
            "the session outlives close"
        );
        simpler_driver::release_sessions_of(d.runtime_library());
        assert_eq!(fake.calls("rtDeviceReset").len(), 1);
        assert_eq!(
            (fake.count("violations"), fake.count("live_allocations")),
            (0, 0)
        );
    }
}

#[test]
fn the_fake_hal_rejects_double_registration_unaligned_pointers_and_unknown_unregisters() {
    type Reg =
        unsafe extern "C" fn(*mut c_void, c_ulonglong, c_uint, c_uint, *mut *mut c_void) -> c_int;
    type Unreg = unsafe extern "C" fn(*mut c_void, c_uint) -> c_int;
    let fake = standard();
    let d = open(&fake);
    let p = d.alloc(8192).unwrap();
    // SAFETY: the symbols have exactly these C signatures (`ascend_hal.h`); `out` is a valid
    // out-pointer and `p` is a live allocation of the same fake instance.
    unsafe {
        let reg = fake.sym::<Reg>("halHostRegister");
        let unreg = fake.sym::<Unreg>("halHostUnregister");
        let mut out: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            reg((p.0 + 64) as *mut c_void, 64, 2, 0, &mut out),
            3,
            "unaligned: INVALID_VALUE"
        );
        // A registration is keyed by its devid: unregistering under another id finds nothing
        // and leaves it registered (leaked), as in the driver.
        assert_eq!(reg(p.0 as *mut c_void, 4096, 2, 7, &mut out), 0);
        assert!(!out.is_null());
        assert_eq!(reg(p.0 as *mut c_void, 16, 2, 0, &mut out), 8, "PARA_ERROR");
        assert_ne!(unreg((p.0 + 64) as *mut c_void, 7), 0);
        assert_eq!(
            unreg(p.0 as *mut c_void, 5),
            11,
            "NOT_EXIST under another devid"
        );
        assert_eq!(fake.count("live_mappings"), 1, "still registered");
        assert_eq!(unreg(p.0 as *mut c_void, 7), 0);
        assert_eq!(fake.count("live_mappings"), 0);
    }
    d.free(p).unwrap();
}
