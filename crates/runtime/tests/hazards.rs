//! The hazard index against a brute-force model: random single and batched submits (reading or
//! writing strided views, ascending or not, and often the views of the submit before them again,
//! read where they were written or written where they were read), then random orchestrator reads
//! and writes, and a read and a write of every task view. An access is refused exactly when one of its bytes belongs to an element of a task
//! tensor that writes it (a read) or that touches it at all (a write).

mod common;

use std::collections::BTreeSet;

use common::*;
use proptest::prelude::*;
use simpler_driver::sim::SvmPolicy;
use simpler_runtime::{BatchSlot, DType, Direction, Error, Geometry, Staging, Value};

const N: u64 = 96; // int32 elements of the argument

#[derive(Debug, Clone)]
struct View {
    len: u64,
    stride: u64,
    start: u64,
}

fn view() -> impl Strategy<Value = View> {
    (1u64..6, 1u64..4, 0u64..N).prop_filter_map("fits", |(len, stride, start)| {
        ((len - 1) * stride + start < N).then_some(View { len, stride, start })
    })
}

#[derive(Debug, Clone)]
enum Submit {
    One {
        v: View,
        writes: bool,
    },
    Many {
        layout: (u64, u64),
        starts: Vec<u64>,
        writes: bool,
    },
    /// The views of the submit before it (a view of its own for the first), read or written.
    Again {
        writes: bool,
    },
}

fn submit() -> impl Strategy<Value = Submit> {
    let one = (view(), any::<bool>()).prop_map(|(v, writes)| Submit::One { v, writes });
    let many = (
        (1u64..4, 1u64..3),
        prop::collection::vec(0u64..N, 1..12),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|((len, stride), mut starts, sorted, writes)| {
            starts.retain(|&s| (len - 1) * stride + s < N);
            if starts.is_empty() {
                starts.push(0);
            }
            if sorted {
                starts.sort_unstable();
            }
            Submit::Many {
                layout: (len, stride),
                starts,
                writes,
            }
        });
    let again = any::<bool>().prop_map(|writes| Submit::Again { writes });
    prop_oneof![2 => one, 2 => many, 1 => again]
}

/// `sub` with its views, and whether it writes: an `Again` takes the views of `prev`.
fn resolve(sub: &Submit, prev: Option<&Submit>) -> Submit {
    match (sub, prev) {
        (Submit::Again { writes }, Some(Submit::One { v, .. })) => Submit::One {
            v: v.clone(),
            writes: *writes,
        },
        (Submit::Again { writes }, Some(Submit::Many { layout, starts, .. })) => Submit::Many {
            layout: *layout,
            starts: starts.clone(),
            writes: *writes,
        },
        (Submit::Again { writes }, _) => Submit::One {
            v: View {
                len: 4,
                stride: 1,
                start: 8,
            },
            writes: *writes,
        },
        (other, _) => other.clone(),
    }
}

fn bytes(len: u64, stride: u64, start: u64) -> BTreeSet<u64> {
    (0..len)
        .flat_map(|i| (0..4).map(move |b| (start + i * stride) * 4 + b))
        .collect()
}

fn geometry(len: u64, stride: u64, start: u64) -> Geometry {
    Geometry::new(&"v", DType::I32, &[len], Some(&[stride]), start).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn refusals_match_the_byte_model(
        submits in prop::collection::vec(submit(), 1..6),
        accesses in prop::collection::vec((view(), any::<bool>()), 1..12),
    ) {
        let (cell, _dev) = sim(SvmPolicy::Always, Staging::Arena);
        let s = sig(&[Direction::InOut]);
        let reader = sig(&[Direction::In]);
        let writer = sig(&[Direction::Out]);
        let args = [staged("a", geo(DType::I32, &[N]))];
        let failures = std::cell::RefCell::new(Vec::<String>::new());
        let mut host = Host::new(vec![vec![0u8; (N * 4) as usize]], |run| {
            let o = orch(&cell, run);
            let base = o.tensor(0).unwrap().geometry.offset(); // the arena slice's first element
            let (mut written, mut touched) = (BTreeSet::new(), BTreeSet::new());
            let mut prev: Option<Submit> = None;
            // Every task view, read and written by the orchestrator after the random accesses.
            let mut own: Vec<(View, bool)> = Vec::new();
            for sub in &submits {
                let sub = resolve(sub, prev.as_ref());
                let (k, w) = match &sub {
                    Submit::One { writes, .. } | Submit::Many { writes, .. } => {
                        (if *writes { &writer } else { &reader }, *writes)
                    }
                    Submit::Again { .. } => unreachable!("resolved above"),
                };
                let b = match &sub {
                    Submit::One { v, .. } => {
                        own.extend([(v.clone(), false), (v.clone(), true)]);
                        o.submit(kernel(0, "k", k), &[(0, geometry(v.len, v.stride, base + v.start))], &[]).unwrap();
                        bytes(v.len, v.stride, v.start)
                    }
                    Submit::Many { layout: (len, stride), starts, .. } => {
                        for &start in starts {
                            let v = View { len: *len, stride: *stride, start };
                            own.extend([(v.clone(), false), (v, true)]);
                        }
                        let abs: Vec<u64> = starts.iter().map(|&s| base + s).collect();
                        let slot = BatchSlot::Views { arg: 0, geometry: geometry(*len, *stride, base), starts: &abs };
                        o.submit_many(kernel(0, "k", k), &[slot], &[], None).unwrap();
                        starts.iter().flat_map(|&st| bytes(*len, *stride, st)).collect()
                    }
                    Submit::Again { .. } => unreachable!("resolved above"),
                };
                prev = Some(sub.clone());
                if w {
                    written.extend(b.iter().copied());
                }
                touched.extend(b);
            }
            for (v, write) in accesses.iter().chain(&own) {
                let g = geometry(v.len, v.stride, base + v.start);
                let got = if *write {
                    o.write(0, &g, &[0], Value::Int(1)).err()
                        .or_else(|| if v.len > 1 { o.write(0, &g, &[(v.len - 1) as i64], Value::Int(1)).err() } else { None })
                } else {
                    o.read_tensor(0, &g).err()
                };
                let refused = match got {
                    None => false,
                    Some(Error::Hazard(_)) => true,
                    Some(e) => {
                        failures.borrow_mut().push(format!("{v:?} write={write}: an error that is not a hazard: {e}"));
                        continue;
                    }
                };
                // A write is checked element by element: it is refused when either written
                // element is; compare with the model for those elements only. A read is refused
                // when any of its bytes was written by a task.
                let want = if *write {
                    let mut els = bytes(1, 1, v.start);
                    if v.len > 1 {
                        els.extend(bytes(1, 1, v.start + (v.len - 1) * v.stride));
                    }
                    !els.is_disjoint(&touched)
                } else {
                    !bytes(v.len, v.stride, v.start).is_disjoint(&written)
                };
                if refused != want {
                    failures.borrow_mut().push(format!("{v:?} write={write}: refused={refused}, model says {want}"));
                }
            }
            Ok(())
        })
        .kernel(|_| Ok(()));
        go(&cell, "c", &s, &args, &mut host).unwrap();
        drop(host);
        let f = failures.take();
        prop_assert!(f.is_empty(), "{:?}", f);
    }
}
