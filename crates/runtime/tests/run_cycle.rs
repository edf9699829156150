//! The run cycle and ownership rules over the sim device, without Python.

use std::sync::Arc;

use proptest::prelude::*;
use simpler_driver::sim::{SimConfig, SimDevice, SvmPolicy};
use simpler_driver::{DevPtr, Device, Op};
use simpler_runtime::{BindArg, DType, Direction, Error, Geometry, Staging, Value, Worker};

fn worker(svm: SvmPolicy, staging: Staging) -> (Worker, Arc<SimDevice>) {
    let dev = Arc::new(SimDevice::new(SimConfig {
        svm,
        ..SimConfig::default()
    }));
    (Worker::new(dev.clone(), staging), dev)
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_geo(n: u64) -> Geometry {
    Geometry::contiguous("r", DType::U8, vec![n]).unwrap()
}

fn geo(n: u64) -> Geometry {
    Geometry::contiguous("t", DType::F32, vec![n]).unwrap()
}

/// One staged run: x (IN) doubled into y (OUT) by a "kernel" working on the task buffers.
fn run_double(
    w: &mut Worker,
    x: &[f32],
    y: &mut [u8],
) -> Result<simpler_runtime::RunReport, Error> {
    let xb = f32s(x);
    let n = x.len() as u64;
    let gen = w.begin_run(&[
        BindArg::Staged {
            name: "x".into(),
            geometry: geo(n),
            dir: Direction::In,
            host: &xb,
        },
        BindArg::Staged {
            name: "y".into(),
            geometry: geo(n),
            dir: Direction::Out,
            host: y,
        },
    ])?;
    let mut body = |w: &mut Worker| -> Result<(), Error> {
        // Task tensors are views of the run's arguments, whose geometry is relative to their
        // allocation (here: arena slices).
        let (_, gx, _) = w.run_arg(gen, 0)?;
        let (_, gy, _) = w.run_arg(gen, 1)?;
        w.submit(gen, vec![(0, gx, Direction::In), (1, gy, Direction::Out)])?;
        w.begin_execute(gen)?;
        let bufs = w.task_buffers(gen, 0)?;
        let mut tmp = vec![0u8; bufs[0].len];
        bufs[0].mem.read(bufs[0].offset, &mut tmp).unwrap();
        let doubled: Vec<f32> = tmp
            .chunks(4)
            .map(|c| 2.0 * f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        bufs[1].mem.write(bufs[1].offset, &f32s(&doubled)).unwrap();
        w.finish_task(gen, 0)?;
        w.end_execute(gen, true)?;
        w.copy_back(gen, &mut [None, Some(&mut *y)])
    };
    let r = body(w);
    if r.is_err() {
        w.fail_run(gen);
    }
    let report = w.finish_run(gen);
    r?;
    report
}

#[test]
fn staged_run_counts_and_results() {
    let (mut w, dev) = worker(SvmPolicy::Always, Staging::Arena);
    let mut y = vec![0u8; 16];
    let r = run_double(&mut w, &[1.0, 2.0, 3.0, 4.0], &mut y).unwrap();
    assert_eq!(y, f32s(&[2.0, 4.0, 6.0, 8.0]));
    assert_eq!(
        (r.counters.staged_bytes, r.counters.copied_back_bytes),
        (16, 16)
    );
    assert_eq!(r.counters.device_mallocs, 1);
    let r = run_double(&mut w, &[1.0; 4], &mut y).unwrap();
    assert_eq!((r.counters.device_mallocs, r.counters.device_frees), (0, 0));
    assert!(r.ok);
    assert_eq!(dev.stats().live_allocations, 1); // the arena
}

#[test]
fn fault_matrix_over_the_staged_phases_leaks_nothing() {
    // (staging, op, nth, phase name)
    let cells = [
        (Staging::Arena, Op::Alloc, 1, "bind"),
        (Staging::Arena, Op::H2d, 1, "bind"),
        (Staging::Fresh, Op::Alloc, 2, "bind"),
        (Staging::Fresh, Op::H2d, 1, "bind"),
        (Staging::Arena, Op::D2h, 1, "copy_back"),
        (Staging::Fresh, Op::Free, 1, "cleanup"),
    ];
    for (staging, op, nth, phase) in cells {
        let (mut w, dev) = worker(SvmPolicy::Always, staging);
        dev.inject_fault(op, nth, Some(99)).unwrap();
        let mut y = vec![0u8; 16];
        let e = run_double(&mut w, &[1.0; 4], &mut y).unwrap_err();
        match &e {
            Error::Device {
                phase: p, source, ..
            } => {
                assert_eq!((p.name(), source.op, source.code), (phase, op, 99), "{e}");
            }
            other => panic!("{other}"),
        }
        let arena = usize::from(w.arena().is_some()) as u64;
        let orphaned = u64::from(phase == "cleanup");
        assert_eq!(
            dev.stats().live_allocations,
            arena + orphaned,
            "{staging:?} {op} {phase}"
        );
        // The worker runs the next call correctly.
        run_double(&mut w, &[5.0; 4], &mut y).unwrap();
        assert_eq!(y, f32s(&[10.0; 4]));
        let s = w.close();
        assert!(s.errors.is_empty());
        assert_eq!(dev.stats().live_allocations, 0);
    }
}

#[test]
fn resident_views_mirror_refresh_and_release_order() {
    let (mut w, dev) = worker(SvmPolicy::Never, Staging::Arena);
    let set = w.resident_open().unwrap();
    let g = Geometry::contiguous("c", DType::I32, vec![4]).unwrap();
    let p = w
        .resident_add(set, "c", &bytes_geo(16), Direction::InOut, &[0u8; 16])
        .unwrap();
    for round in 0..3i64 {
        let gen = w
            .begin_run(&[BindArg::Device {
                name: "c".into(),
                ptr: p,
                geometry: g.clone(),
                dir: Direction::InOut,
            }])
            .unwrap();
        assert_eq!(w.orch_read(gen, 0, &g, &[0]).unwrap(), Value::Int(round));
        w.submit(gen, vec![(0, g.clone(), Direction::InOut)])
            .unwrap();
        w.begin_execute(gen).unwrap();
        let b = &w.task_buffers(gen, 0).unwrap()[0];
        b.mem
            .write(b.offset, &((round + 1) as i32).to_le_bytes())
            .unwrap();
        w.end_execute(gen, true).unwrap();
        w.copy_back(gen, &mut [None]).unwrap();
        let r = w.finish_run(gen).unwrap();
        assert_eq!(r.counters.mirror_refreshes, u64::from(round > 0));
        assert_eq!(r.counters.views_mirrored, u64::from(round == 0));
    }
    assert_eq!(w.host_view_info(p).unwrap(), Some("mirror"));
    assert!(
        w.free(p).is_err(),
        "resident buffers are released with their set"
    );
    assert!(w.resident_release(set).is_empty());
    assert!(w.resident_release(set).is_empty(), "idempotent");
    assert_eq!(dev.stats().live_allocations, 0);
}

#[test]
fn a_failed_resident_upload_frees_what_it_allocated() {
    let (mut w, dev) = worker(SvmPolicy::Always, Staging::Arena);
    let set = w.resident_open().unwrap();
    dev.inject_fault(Op::H2d, 1, None).unwrap();
    let e = w
        .resident_add(set, "w", &bytes_geo(8), Direction::In, &[1u8; 8])
        .unwrap_err();
    assert!(e.to_string().contains("[resident_add] tensor w"), "{e}");
    assert_eq!(dev.stats().live_allocations, 0);
    assert!(w
        .resident_add(set, "w", &bytes_geo(8), Direction::In, &[1u8; 8])
        .is_ok());
    assert!(
        w.resident_add(set, "w", &bytes_geo(8), Direction::In, &[1u8; 8])
            .is_err(),
        "duplicate name"
    );
}

#[test]
fn release_attempts_every_free_when_one_fails() {
    let (mut w, dev) = worker(SvmPolicy::Always, Staging::Arena);
    let set = w.resident_open().unwrap();
    for name in ["a", "b", "c"] {
        w.resident_add(set, name, &bytes_geo(8), Direction::In, &[0u8; 8])
            .unwrap();
    }
    dev.inject_fault(Op::Free, 2, None).unwrap();
    let errors = w.resident_release(set);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].to_string().contains("tensor b"), "{}", errors[0]);
    assert_eq!(dev.stats().live_allocations, 1); // b, orphaned: close retries it
    w.close();
    assert_eq!(dev.stats().live_allocations, 0);
}

proptest! {
    #[test]
    fn release_is_lifo(n in 1usize..12) {
        let (mut w, dev) = worker(SvmPolicy::Always, Staging::Arena);
        let set = w.resident_open().unwrap();
        let mut ptrs = vec![];
        for i in 0..n {
            ptrs.push(w.resident_add(set, &format!("t{i}"), &bytes_geo(8 + i as u64), Direction::Out, &vec![0u8; 8 + i]).unwrap());
        }
        prop_assert!(w.resident_release(set).is_empty());
        let frees: Vec<DevPtr> = dev.call_log().iter().filter(|c| c.op == Op::Free).map(|c| DevPtr(c.addr)).collect();
        ptrs.reverse();
        prop_assert_eq!(frees, ptrs);
    }
}
