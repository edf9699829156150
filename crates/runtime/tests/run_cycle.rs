//! The run cycle and ownership rules over the sim device, without Python: every run goes through
//! `simpler_runtime::run`, the entry point the bindings use.

mod common;

use std::cell::RefCell;

use common::*;
use proptest::prelude::*;
use simpler_driver::sim::SvmPolicy;
use simpler_driver::{DevPtr, Device, Op};
use simpler_runtime::{
    ArgValue, BatchScalar, BatchSlot, DType, Direction, Error, Geometry, RunArgSpec, RunError,
    Staging, Value, ViewPolicy,
};

use Direction::{In, InOut, Out};

/// One staged run: x (IN) doubled into y (OUT) by a kernel working on the task buffers.
fn run_double(
    cell: &Cell,
    x: &[f32],
    y: &mut Vec<u8>,
) -> Result<simpler_runtime::RunReport, RunError<String>> {
    let n = x.len() as u64;
    let s = sig(&[In, Out]);
    let k = sig(&[In, Out]);
    let args = [
        staged("x", geo(DType::F32, &[n])),
        staged("y", geo(DType::F32, &[n])),
    ];
    let mut host = Host::new(vec![f32s(x), std::mem::take(y)], |run| {
        let o = orch(cell, run);
        let (gx, gy) = (o.tensor(0).unwrap().geometry, o.tensor(1).unwrap().geometry);
        o.submit(kernel(0, "double", &k), &[(0, gx), (1, gy)], &[])
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .kernel(|call| {
        let xs = to_f32s(&window_bytes(&call.buffers[0]));
        let doubled: Vec<f32> = xs.iter().map(|v| v * 2.0).collect();
        let b = &call.buffers[1];
        b.mem.write(b.offset, &f32s(&doubled)).unwrap();
        Ok(())
    });
    let r = go(cell, "double", &s, &args, &mut host);
    *y = host.staged.pop().unwrap();
    r
}

#[test]
fn staged_run_counts_and_results() {
    let (cell, dev) = sim(SvmPolicy::Always, Staging::Arena);
    let mut y = vec![0u8; 16];
    let r = run_double(&cell, &[1.0, 2.0, 3.0, 4.0], &mut y).unwrap();
    assert_eq!(y, f32s(&[2.0, 4.0, 6.0, 8.0]));
    assert_eq!(
        (r.counters.staged_bytes, r.counters.copied_back_bytes),
        (16, 16)
    );
    assert_eq!((r.counters.device_mallocs, r.counters.tasks), (1, 1));
    let r = run_double(&cell, &[1.0; 4], &mut y).unwrap();
    assert_eq!((r.counters.device_mallocs, r.counters.device_frees), (0, 0));
    assert!(r.ok);
    assert_eq!(dev.stats().live_allocations, 1); // the arena
    assert!(!cell.lock().unwrap().is_busy());
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
        let (cell, dev) = sim(SvmPolicy::Always, staging);
        dev.inject_fault(op, nth, Some(99)).unwrap();
        let mut y = vec![0u8; 16];
        let e = run_double(&cell, &[1.0; 4], &mut y).unwrap_err();
        match &e {
            RunError::Runtime(Error::Device {
                phase: p, source, ..
            }) => {
                assert_eq!((p.name(), source.op, source.code), (phase, op, 99), "{e:?}");
            }
            other => panic!("{other:?}"),
        }
        let w = cell.lock().unwrap();
        let arena = u64::from(w.arena().is_some());
        assert!(!w.is_busy());
        drop(w);
        let orphaned = u64::from(phase == "cleanup");
        assert_eq!(
            dev.stats().live_allocations,
            arena + orphaned,
            "{staging:?} {op} {phase}"
        );
        // The worker runs the next call correctly.
        let mut y = vec![0u8; 16];
        run_double(&cell, &[5.0; 4], &mut y).unwrap();
        assert_eq!(y, f32s(&[10.0; 4]));
        let s = cell.lock().unwrap().close();
        assert!(s.errors.is_empty());
        assert_eq!(dev.stats().live_allocations, 0);
    }
}

#[test]
fn every_failure_point_finishes_the_run_and_skips_copy_back() {
    // Where the run fails: 1 = the checkpoint after bind, 2 = the orchestration, 3 = a kernel,
    // 4 = the checkpoint after execute.
    for point in 1..=4u32 {
        let (cell, dev) = sim(SvmPolicy::Always, Staging::Fresh);
        let s = sig(&[In, Out]);
        let k = sig(&[In, Out]);
        let args = [
            staged("x", geo(DType::F32, &[4])),
            staged("y", geo(DType::F32, &[4])),
        ];
        let mut host = Host::new(vec![f32s(&[1.0; 4]), vec![7u8; 16]], |run| {
            if point == 2 {
                return Err("orchestration raised".into());
            }
            let o = orch(&cell, run);
            let (gx, gy) = (o.tensor(0).unwrap().geometry, o.tensor(1).unwrap().geometry);
            o.submit(kernel(0, "k", &k), &[(0, gx), (1, gy)], &[])
                .unwrap();
            Ok(())
        })
        .kernel(|_| {
            if point == 3 {
                Err("kernel raised".into())
            } else {
                Ok(())
            }
        });
        host.interrupt_at = match point {
            1 => Some(1),
            4 => Some(2),
            _ => None,
        };
        let e = go(&cell, "c", &s, &args, &mut host).unwrap_err();
        let RunError::Host(msg) = e else {
            panic!("{e:?}")
        };
        assert!(["interrupted", "orchestration raised", "kernel raised"].contains(&msg.as_str()));
        assert_eq!(
            host.staged[1],
            vec![7u8; 16],
            "point {point}: copy back was skipped"
        );
        assert!(!cell.lock().unwrap().is_busy());
        assert_eq!(
            dev.stats().live_allocations,
            0,
            "point {point}: fresh buffers released"
        );
    }
}

#[test]
fn a_panicking_orchestration_still_finishes_the_run() {
    let (cell, dev) = sim(SvmPolicy::Always, Staging::Fresh);
    let s = sig(&[In]);
    let args = [staged("x", geo(DType::F32, &[4]))];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut host = Host::new(vec![f32s(&[1.0; 4])], |_| panic!("boom"));
        let _ = go(&cell, "c", &s, &args, &mut host);
    }));
    assert!(r.is_err());
    assert!(!cell.lock().unwrap_or_else(|e| e.into_inner()).is_busy());
    assert_eq!(dev.stats().live_allocations, 0);
}

#[test]
fn a_second_run_while_one_is_in_progress_is_refused_before_device_work() {
    let (cell, dev) = sim(SvmPolicy::Always, Staging::Arena);
    let s = sig(&[In]);
    let args = [staged("x", geo(DType::F32, &[4]))];
    let inner = RefCell::new(None);
    let mut host = Host::new(vec![f32s(&[1.0; 4])], |_| {
        let before = dev.stats();
        let mut h2 = Host::new(vec![f32s(&[1.0; 4])], |_| Ok(()));
        *inner.borrow_mut() = Some((
            go(&cell, "c", &s, &args, &mut h2).unwrap_err(),
            before == dev.stats(),
        ));
        Ok(())
    });
    go(&cell, "c", &s, &args, &mut host).unwrap();
    let (e, untouched) = inner.take().unwrap();
    assert!(format!("{e:?}").contains("worker busy"), "{e:?}");
    assert!(untouched);
}

#[test]
fn validation_happens_before_any_device_work() {
    let (cell, dev) = sim(SvmPolicy::Always, Staging::Arena);
    let s = sig(&[In, Out]);
    let scalar = RunArgSpec {
        name: "alpha".into(),
        value: ArgValue::Scalar,
    };
    let cases: Vec<(Vec<RunArgSpec>, &str)> = vec![
        (
            vec![staged("x", geo(DType::F32, &[4]))],
            "signature has 2 tensor arguments, got 1",
        ),
        (
            vec![
                staged("x", geo(DType::F32, &[4])),
                scalar.clone(),
                staged("y", geo(DType::F32, &[4])),
            ],
            "tensor 'y' after scalar 'alpha'",
        ),
    ];
    for (args, msg) in cases {
        let mut host = Host::new(vec![vec![0; 16]; 2], |_| Ok(()));
        let e = go(&cell, "c", &s, &args, &mut host).unwrap_err();
        assert!(format!("{e:?}").contains(msg), "{e:?}");
    }
    let typed = typed_sig(&[(In, Some(DType::I32)), (Out, None)]);
    let args = [
        staged("x", geo(DType::F32, &[4])),
        staged("y", geo(DType::F32, &[4])),
    ];
    let mut host = Host::new(vec![vec![0; 16]; 2], |_| Ok(()));
    let e = go(&cell, "c", &typed, &args, &mut host).unwrap_err();
    assert!(
        format!("{e:?}").contains("tensor 'x' is float32, signature wants int32"),
        "{e:?}"
    );
    assert_eq!(dev.stats().allocs, 0);
}

#[test]
fn resident_views_mirror_refresh_and_release_order() {
    let (cell, dev) = sim(SvmPolicy::Never, Staging::Arena);
    let g = geo(DType::I32, &[4]);
    let (set, buf) = {
        let mut w = cell.lock().unwrap();
        let set = w.resident_open().unwrap();
        let b = w
            .resident_add(set, "c", &g, InOut, &[0u8; 16])
            .unwrap()
            .unwrap();
        (set, b)
    };
    let s = sig(&[InOut]);
    let args = [RunArgSpec {
        name: "c".into(),
        value: ArgValue::Device {
            buffer: buf,
            geometry: g,
        },
    }];
    for round in 0..3i64 {
        let mut host = Host::new(vec![], |run| {
            let o = orch(&cell, run);
            assert_eq!(o.read(0, &g, &[0]).unwrap(), Value::Int(round));
            o.submit(kernel(0, "inc", &s), &[(0, g)], &[]).unwrap();
            Ok(())
        })
        .kernel(|call| {
            let b = &call.buffers[0];
            b.mem
                .write(b.offset, &((round + 1) as i32).to_le_bytes())
                .unwrap();
            Ok(())
        });
        let r = go(&cell, "c", &s, &args, &mut host).unwrap();
        assert_eq!(r.counters.mirror_refreshes, u64::from(round > 0));
        assert_eq!(r.counters.views_mirrored, u64::from(round == 0));
        assert_eq!(r.counters.resident_tensors, 1);
    }
    let mut w = cell.lock().unwrap();
    assert_eq!(w.host_view_info(buf).unwrap(), Some("mirror"));
    assert!(
        w.free(buf).is_err(),
        "resident buffers are released with their set"
    );
    assert!(w.resident_release(set).unwrap().is_empty());
    assert!(w.resident_release(set).unwrap().is_empty(), "idempotent");
    assert_eq!(dev.stats().live_allocations, 0);
    let e = w.free(buf).unwrap_err();
    assert!(e.to_string().contains("is not a live allocation"), "{e}");
}

#[test]
fn resident_add_rules_have_one_owner() {
    let (cell, dev) = sim(SvmPolicy::Always, Staging::Arena);
    let mut w = cell.lock().unwrap();
    let set = w.resident_open().unwrap();
    let g = geo(DType::U8, &[8]);
    dev.inject_fault(Op::H2d, 1, None).unwrap();
    let e = w.resident_add(set, "w", &g, In, &[1u8; 8]).unwrap_err();
    assert!(e.to_string().contains("[resident_add] tensor w"), "{e}");
    assert_eq!(dev.stats().live_allocations, 0);
    assert!(w
        .resident_add(set, "w", &g, In, &[1u8; 8])
        .unwrap()
        .is_some());
    let e = w.resident_add(set, "w", &g, In, &[1u8; 8]).unwrap_err();
    assert!(e.to_string().contains("already added"), "{e}");
    let strided = Geometry::new(&"s", DType::U8, &[4], Some(&[2]), 0).unwrap();
    let e = w
        .resident_add(set, "s", &strided, In, &[1u8; 7])
        .unwrap_err();
    assert!(e.to_string().contains("C-contiguous"), "{e}");
    // A fixture without bytes stays host-staged: no allocation, no error.
    let before = dev.stats().allocs;
    assert!(w
        .resident_add(set, "empty", &geo(DType::F32, &[0, 3]), In, &[])
        .unwrap()
        .is_none());
    assert_eq!(dev.stats().allocs, before);
}

#[test]
fn release_attempts_every_free_when_one_fails() {
    let (cell, dev) = sim(SvmPolicy::Always, Staging::Arena);
    let mut w = cell.lock().unwrap();
    let set = w.resident_open().unwrap();
    for name in ["a", "b", "c"] {
        w.resident_add(set, name, &geo(DType::U8, &[8]), In, &[0u8; 8])
            .unwrap();
    }
    dev.inject_fault(Op::Free, 2, None).unwrap();
    let errors = w.resident_release(set).unwrap();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].to_string().contains("tensor b"), "{}", errors[0]);
    assert_eq!(dev.stats().live_allocations, 1); // b, orphaned: close retries it
    w.close();
    assert_eq!(dev.stats().live_allocations, 0);
}

/// (task, kernel, scalars) of each task run, in order.
type Ran = Vec<(u64, u32, Vec<Value>)>;

/// The reference workload for single vs batched submits: y[i] = x[i] * a_i, in rows.
fn rows_run(batched: bool) -> (Vec<u8>, simpler_runtime::RunReport, Ran) {
    let (cell, _dev) = sim(SvmPolicy::Always, Staging::Arena);
    let rows = 64u64;
    let g = geo(DType::F32, &[rows, 8]);
    let s = sig(&[In, Out]);
    let k = sig(&[In, Out]);
    let args = [staged("x", g), staged("y", g)];
    let x: Vec<f32> = (0..rows * 8).map(|i| i as f32).collect();
    let seen = RefCell::new(Vec::new());
    let mut host = Host::new(vec![f32s(&x), vec![0; (rows * 32) as usize]], |run| {
        let o = orch(&cell, run);
        let (gx, gy) = (o.tensor(0).unwrap().geometry, o.tensor(1).unwrap().geometry);
        let view = |g: &Geometry, r: i64| g.view(&"t", &[1, 8], &[r, 0]).unwrap();
        if batched {
            let sx: Vec<u64> = (0..rows as i64).map(|r| view(&gx, r).offset()).collect();
            let sy: Vec<u64> = (0..rows as i64).map(|r| view(&gy, r).offset()).collect();
            let scal: Vec<Value> = (0..rows).map(|r| Value::Int(r as i64)).collect();
            o.submit_many(
                kernel(0, "scale", &k),
                &[
                    BatchSlot::Views {
                        arg: 0,
                        geometry: view(&gx, 0),
                        starts: &sx,
                    },
                    BatchSlot::Views {
                        arg: 1,
                        geometry: view(&gy, 0),
                        starts: &sy,
                    },
                ],
                &[
                    BatchScalar::PerTask(&scal),
                    BatchScalar::One(Value::Float(0.5)),
                ],
                None,
            )
            .unwrap();
        } else {
            for r in 0..rows as i64 {
                o.submit(
                    kernel(0, "scale", &k),
                    &[(0, view(&gx, r)), (1, view(&gy, r))],
                    &[Value::Int(r), Value::Float(0.5)],
                )
                .unwrap();
            }
        }
        Ok(())
    })
    .kernel(|call| {
        let Value::Int(a) = call.scalars[0] else {
            panic!()
        };
        seen.borrow_mut()
            .push((call.task, call.kernel, call.scalars.clone()));
        let xs = to_f32s(&window_bytes(&call.buffers[0]));
        let ys: Vec<f32> = xs.iter().map(|v| v * a as f32 * 0.5).collect();
        call.buffers[1]
            .mem
            .write(call.buffers[1].offset, &f32s(&ys))
            .unwrap();
        Ok(())
    });
    let r = go(&cell, "rows", &s, &args, &mut host).unwrap();
    (host.staged.pop().unwrap(), r, seen.take())
}

#[test]
fn batched_and_single_submits_give_identical_tasks_counters_and_results() {
    let (y1, r1, t1) = rows_run(false);
    let (y2, r2, t2) = rows_run(true);
    assert_eq!(y1, y2);
    assert_eq!(t1, t2);
    assert_eq!(r1.counters.tasks, 64);
    assert_eq!((r1.counters.submits, r2.counters.submits), (64, 1));
    let strip = |mut c: simpler_runtime::Counters| {
        c.submits = 0;
        c
    };
    assert_eq!(strip(r1.counters), strip(r2.counters));
    let want: Vec<f32> = (0..64 * 8)
        .map(|i| (i as f32) * ((i / 8) as f32) * 0.5)
        .collect();
    assert_eq!(to_f32s(&y1), want);
}

#[test]
fn batched_submit_errors_are_clear_and_leave_the_run_usable() {
    let (cell, _dev) = sim(SvmPolicy::Always, Staging::Arena);
    let g = geo(DType::F32, &[16, 4]);
    let s = sig(&[In, Out]);
    let k = sig(&[In, Out]);
    let typed = typed_sig(&[(In, Some(DType::I32)), (Out, None)]);
    let args = [staged("x", g), staged("y", g)];
    let errors = RefCell::new(Vec::new());
    let mut host = Host::new(vec![vec![0; 256], vec![0; 256]], |run| {
        let o = orch(&cell, run);
        let (gx, gy) = (o.tensor(0).unwrap().geometry, o.tensor(1).unwrap().geometry);
        let row = |g: &Geometry| g.view(&"t", &[1, 4], &[0, 0]).unwrap();
        let good: Vec<u64> = (0..16).map(|r| gy.offset() + r * 4).collect();
        let mut past = good.clone();
        past[9] += 4 * 16; // task 9's view starts after the argument
        let short = &good[..15];
        let mut e = errors.borrow_mut();
        let x_all = BatchSlot::One {
            arg: 0,
            geometry: gx,
        };
        // x whole, and a row of y per task starting at `starts`.
        let rows = |s: &simpler_runtime::Signature, starts: &[u64], scalars: &[BatchScalar]| {
            let y_rows = BatchSlot::Views {
                arg: 1,
                geometry: row(&gy),
                starts,
            };
            o.submit_many(kernel(0, "k", s), &[x_all, y_rows], scalars, None)
        };
        e.push(rows(&k, &past, &[]).unwrap_err());
        e.push(rows(&typed, &good, &[]).unwrap_err());
        let per: Vec<Value> = vec![Value::Int(1); 16];
        e.push(rows(&k, short, &[BatchScalar::PerTask(&per)]).unwrap_err());
        e.push(
            o.submit_many(kernel(0, "k", &k), &[x_all, x_all], &[], None)
                .unwrap_err(),
        );
        // A hazard: tasks write y; reading y afterwards is refused, naming the task.
        rows(&k, &good, &[]).unwrap();
        e.push(o.read(1, &gy, &[3, 1]).unwrap_err());
        // Reading x (which no task writes) is fine.
        assert_eq!(o.read(0, &gx, &[3, 1]).unwrap(), Value::Float(0.0));
        Ok(())
    })
    .kernel(|_| Ok(()));
    let r = go(&cell, "c", &s, &args, &mut host).unwrap();
    assert_eq!(r.counters.tasks, 16, "only the valid batch was recorded");
    let msgs: Vec<String> = errors.take().iter().map(|e| e.to_string()).collect();
    assert!(
        msgs[0].contains("view of task 9 runs past argument y"),
        "{}",
        msgs[0]
    );
    assert!(
        msgs[1].contains("tensor 'x' is float32, signature wants int32"),
        "{}",
        msgs[1]
    );
    assert!(
        msgs[2].contains("scalar 0 has 16 rows, expected 15"),
        "{}",
        msgs[2]
    );
    assert!(
        msgs[3].contains("no per-task tensor or scalar"),
        "{}",
        msgs[3]
    );
    assert!(msgs[4].contains("which task 3 (kernel "), "{}", msgs[4]);
}

#[test]
fn hazards_are_exact_for_interleaved_strided_views() {
    // Even and odd columns of one staged buffer: tasks write the odd ones; the orchestrator may
    // read (element by element or in bulk) the even ones, but not an odd one.
    let (cell, _dev) = sim(SvmPolicy::Always, Staging::Arena);
    let g = geo(DType::I32, &[4, 8]);
    let s = sig(&[InOut]);
    let k = sig(&[Out]);
    let args = [staged("b", g)];
    let mut host = Host::new(vec![vec![0; 128]], |run| {
        let o = orch(&cell, run);
        let gb = o.tensor(0).unwrap().geometry;
        let cols = |first: u64| {
            Geometry::new(
                &"c",
                DType::I32,
                &[4, 4],
                Some(&[8, 2]),
                gb.offset() + first,
            )
            .unwrap()
        };
        o.submit(kernel(0, "k", &k), &[(0, cols(1))], &[]).unwrap();
        assert!(o.read(0, &cols(0), &[2, 3]).is_ok());
        assert!(o.read_tensor(0, &cols(0)).is_ok());
        assert!(matches!(
            o.read(0, &cols(1), &[2, 3]),
            Err(Error::Hazard(_))
        ));
        assert!(matches!(o.read_tensor(0, &gb), Err(Error::Hazard(_))));
        assert!(matches!(
            o.write(0, &cols(0), &[0, 0], Value::Int(1)),
            Ok(())
        ));
        Ok(())
    })
    .kernel(|_| Ok(()));
    go(&cell, "c", &s, &args, &mut host).unwrap();
}

proptest! {
    #[test]
    fn release_is_lifo(n in 1usize..12) {
        let (cell, dev) = sim(SvmPolicy::Always, Staging::Arena);
        let mut w = cell.lock().unwrap();
        let set = w.resident_open().unwrap();
        let mut ptrs = vec![];
        for i in 0..n {
            let g = geo(DType::U8, &[8 + i as u64]);
            ptrs.push(w.resident_add(set, &format!("t{i}"), &g, Out, &vec![0u8; 8 + i]).unwrap().unwrap().ptr);
        }
        prop_assert!(w.resident_release(set).unwrap().is_empty());
        let frees: Vec<DevPtr> = dev.call_log().iter().filter(|c| c.op == Op::Free).map(|c| DevPtr(c.addr)).collect();
        ptrs.reverse();
        prop_assert_eq!(frees, ptrs);
    }
}

/// A task writes a resident tensor through an INOUT slot while the callable declares it IN:
/// its mirror (sim refusing every mapping) or its cache (a mapping read through a host copy)
/// still goes stale at the end of the run, so the next run's reads see the task's bytes.
#[test]
fn a_task_write_makes_the_copy_of_a_tensor_declared_in_stale() {
    for (svm, hint) in [
        (SvmPolicy::Never, ViewPolicy::Mirror),
        (SvmPolicy::Always, ViewPolicy::Cached),
    ] {
        let (cell, _dev) = sim(svm, Staging::Arena);
        let g = geo(DType::I32, &[4]);
        let buf = {
            let mut w = cell.lock().unwrap();
            let set = w.resident_open().unwrap();
            let b = w
                .resident_add(set, "x", &g, In, &[0u8; 16])
                .unwrap()
                .unwrap();
            w.hint_view(b, hint).unwrap();
            b
        };
        let declared = sig(&[In]);
        let writes = sig(&[InOut]);
        let args = [RunArgSpec {
            name: "x".into(),
            value: ArgValue::Device {
                buffer: buf,
                geometry: g,
            },
        }];
        for round in 0..3i64 {
            let mut host = Host::new(vec![], |run| {
                let o = orch(&cell, run);
                assert_eq!(o.read(0, &g, &[0]).unwrap(), Value::Int(round), "{hint:?}");
                o.submit(kernel(0, "bump", &writes), &[(0, g)], &[])
                    .unwrap();
                Ok(())
            })
            .kernel(|call| {
                let b = &call.buffers[0];
                b.mem
                    .write(b.offset, &((round + 1) as i32).to_le_bytes())
                    .unwrap();
                Ok(())
            });
            go(&cell, "declared_in", &declared, &args, &mut host).unwrap();
        }
        let w = cell.lock().unwrap();
        assert_eq!(w.host_view_info(buf).unwrap(), Some(hint.name()));
    }
}
