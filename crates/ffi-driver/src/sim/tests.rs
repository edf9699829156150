//! Unit tests of the sim backend: what is sim's own. What every backend does alike (round
//! trips, counters, refusals, close) is checked by `tests/sim.rs` through the shared conformance.

use super::*;

fn sim(svm: SvmPolicy) -> SimDevice {
    SimDevice::new(SimConfig {
        svm,
        ..SimConfig::default()
    })
}

#[test]
fn addresses_are_not_host_pointers_and_fresh_memory_is_poisoned() {
    let d = sim(SvmPolicy::Always);
    let p = d.alloc(8).unwrap();
    assert!(p.0 >= SIM_BASE);
    let (mem, off) = d.kernel_memory(p, 8).unwrap();
    assert_ne!(mem.owned_addr().unwrap() as u64 + off as u64, p.0);
    let mut out = [0u8; 8];
    d.copy_d2h(&mut out, p).unwrap();
    assert_eq!(out, [POISON; 8]);
}

#[test]
fn invalid_calls_are_errors() {
    let d = sim(SvmPolicy::Always);
    assert_eq!(d.alloc(0).unwrap_err().code, codes::INVALID_VALUE);
    let p = d.alloc(16).unwrap();
    let e = d.copy_h2d(DevPtr(p.0 + 8), &[0u8; 9]).unwrap_err();
    assert_eq!((e.op, e.code), (Op::H2d, codes::BAD_ADDRESS));
    assert_eq!(
        d.free(DevPtr(p.0 + 1)).unwrap_err().code,
        codes::BAD_ADDRESS
    );
    // The messages, double frees and copies into freed memory: `tests/sim.rs` (conformance).
}

#[test]
fn mapping_policy_double_map_and_unmap_rules() {
    let d = sim(SvmPolicy::MinBytes(1024));
    let small = d.alloc(64).unwrap();
    let big = d.alloc(4096).unwrap();
    assert!(matches!(
        d.map_host(small, 64).unwrap(),
        MapGrant::Refused {
            code: codes::NOT_SUPPORT,
            ..
        }
    ));
    let MapGrant::Mapped { mem, offset } = d.map_host(big, 4096).unwrap() else {
        panic!("big allocation must map")
    };
    mem.write(offset, &[42]).unwrap();
    let mut b = [0u8];
    d.copy_d2h(&mut b, big).unwrap();
    assert_eq!(b, [42]);
    assert_eq!(d.map_host(big, 16).unwrap_err().code, codes::PARA_ERROR);
    assert_eq!(d.free(big).unwrap_err().code, codes::BUSY);
    assert_eq!(d.unmap_host(small).unwrap_err().code, codes::NOT_EXIST);
    d.unmap_host(big).unwrap();
    assert_eq!(d.unmap_host(big).unwrap_err().code, codes::NOT_EXIST);
    d.free(big).unwrap();
    let s = d.stats();
    assert_eq!(
        (s.maps, s.map_refusals, s.unmaps, s.live_mappings),
        (2, 1, 1, 0)
    );
}

#[test]
fn injected_faults_fail_the_nth_call_and_leave_the_device_usable() {
    let d = sim(SvmPolicy::Always);
    for op in Op::ALL {
        d.inject_fault(op, 1, None).unwrap();
    }
    let e = d.alloc(8).unwrap_err();
    assert_eq!((e.op, e.code), (Op::Alloc, codes::INNER_ERR));
    let p = d.alloc(8).unwrap();
    assert_eq!(d.copy_h2d(p, &[1]).unwrap_err().op, Op::H2d);
    assert_eq!(d.copy_d2h(&mut [0u8], p).unwrap_err().op, Op::D2h);
    assert_eq!(d.map_host(p, 8).unwrap_err().op, Op::Map);
    d.map_host(p, 8).unwrap();
    assert_eq!(d.unmap_host(p).unwrap_err().op, Op::Unmap);
    d.unmap_host(p).unwrap();
    assert_eq!(d.free(p).unwrap_err().op, Op::Free);
    d.free(p).unwrap();
    d.inject_fault(Op::H2d, 3, Some(99)).unwrap();
    let q = d.alloc(8).unwrap();
    d.copy_h2d(q, &[1]).unwrap();
    d.copy_h2d(q, &[1]).unwrap();
    assert_eq!(d.copy_h2d(q, &[1]).unwrap_err().code, 99);
    assert_eq!(d.stats().live_allocations, 1);
}

#[test]
fn close_frees_live_allocations_and_reports_them() {
    let d = sim(SvmPolicy::Always);
    let a = d.alloc(10).unwrap();
    d.alloc(20).unwrap();
    d.map_host(a, 10).unwrap();
    let r = d.close();
    assert_eq!(
        (r.leaked_allocations, r.leaked_bytes, r.leaked_mappings),
        (2, 30, 1)
    );
    assert!(r.errors.is_empty());
    assert_eq!(d.stats().live_allocations, 0);
    assert_eq!(d.close(), CloseReport::default());
}

#[test]
fn freed_addresses_are_reused_only_on_request() {
    let d = sim(SvmPolicy::Always);
    let a = d.alloc(100).unwrap();
    d.free(a).unwrap();
    assert_ne!(d.alloc(100).unwrap(), a);
    let d = SimDevice::new(SimConfig {
        reuse_addresses: true,
        ..SimConfig::default()
    });
    let a = d.alloc(100).unwrap();
    let b = d.alloc(5000).unwrap();
    d.free(a).unwrap();
    assert_eq!(
        d.alloc(4096).unwrap(),
        a,
        "same aligned size: the freed address"
    );
    d.free(b).unwrap();
    assert_ne!(d.alloc(100).unwrap(), b, "another size: a fresh address");
}

#[test]
fn capacity_limits_allocation() {
    let d = SimDevice::new(SimConfig {
        capacity: 100,
        ..SimConfig::default()
    });
    d.alloc(60).unwrap();
    assert_eq!(d.alloc(60).unwrap_err().code, codes::OUT_OF_MEMORY);
    assert_eq!(d.alloc(u64::MAX).unwrap_err().code, codes::OUT_OF_MEMORY);
}
