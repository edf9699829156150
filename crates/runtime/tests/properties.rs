//! Accessor containment: an orchestrator read or write succeeds exactly when the element
//! it names lies inside the accessed argument's byte extent, touches exactly that element, and
//! never reaches other bytes of the allocation (or any other allocation).
//!
//! Every element of the allocation holds its own element position, so a read tells which address
//! it reached. Probes are random views of the argument with random (often invalid) indices, and
//! random geometries that were never derived from the argument at all (a forged handle). The
//! expected outcome is computed independently in i128 arithmetic; the device bytes are compared
//! with a model after every case. Run over resident (device) and staged arguments, through a
//! mapping (`svm=always`) and through a mirror / staged copy (`svm=never`).

mod common;

use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use simpler_driver::sim::{SimDevice, SvmPolicy};
use simpler_driver::{DevPtr, Device};
use simpler_runtime::{ArgValue, DType, Direction, Error, Geometry, RunArgSpec, Staging, Value};

const ES: u64 = 4; // int32 elements

#[derive(Debug, Clone)]
struct Layout {
    shape: Vec<u64>,
    strides: Vec<u64>,
    offset: u64,
    /// Elements of the allocation after the argument's last element.
    pad: u64,
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        prop::collection::vec((1u64..5, 1u64..7), 1..4),
        0u64..6,
        0u64..9,
    )
        .prop_map(|(dims, offset, pad)| Layout {
            shape: dims.iter().map(|d| d.0).collect(),
            strides: dims.iter().map(|d| d.1).collect(),
            offset,
            pad,
        })
}

#[derive(Debug, Clone)]
enum Probe {
    /// `arg.view(shape, offsets)` then element `index` of the view.
    View {
        shape: Vec<i64>,
        offsets: Vec<i64>,
        index: Vec<i64>,
        write: bool,
    },
    /// A geometry never derived from the argument, with element `index`.
    Forged {
        shape: Vec<u64>,
        strides: Vec<u64>,
        offset: u64,
        index: Vec<i64>,
        write: bool,
    },
}

fn probe() -> impl Strategy<Value = Probe> {
    let view = (
        prop::collection::vec((-1i64..7, -1i64..7, -1i64..7), 1..4),
        any::<bool>(),
    )
        .prop_map(|(d, write)| Probe::View {
            shape: d.iter().map(|x| x.0).collect(),
            offsets: d.iter().map(|x| x.1).collect(),
            index: d.iter().map(|x| x.2).collect(),
            write,
        });
    let forged = (
        prop::collection::vec((1u64..6, 0u64..9, -1i64..6), 1..4),
        0u64..80,
        any::<bool>(),
    )
        .prop_map(|(d, offset, write)| Probe::Forged {
            shape: d.iter().map(|x| x.0).collect(),
            strides: d.iter().map(|x| x.1).collect(),
            offset,
            index: d.iter().map(|x| x.2).collect(),
            write,
        });
    prop_oneof![view, forged]
}

fn i32s(v: impl IntoIterator<Item = i32>) -> Vec<u8> {
    v.into_iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_all(dev: &SimDevice, ptr: DevPtr, elems: u64) -> Vec<i32> {
    let mut b = vec![0u8; (elems * ES) as usize];
    dev.copy_d2h(&mut b, ptr).unwrap();
    b.chunks(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The element (of the allocation) a probe names, if the probe is valid for its own geometry.
fn expected_elem(arg: &Geometry, p: &Probe) -> Option<i128> {
    match p {
        Probe::View {
            shape,
            offsets,
            index,
            ..
        } => {
            let nd = arg.ndim();
            if shape.len() != nd || offsets.len() != nd || index.len() != nd {
                return None;
            }
            let mut e = arg.offset() as i128;
            for d in 0..nd {
                let (n, o, i) = (shape[d], offsets[d], index[d]);
                if n < 0 || o < 0 || n + o > arg.shape()[d] as i64 || i < 0 || i >= n {
                    return None;
                }
                e += (o + i) as i128 * arg.strides()[d] as i128;
            }
            Some(e)
        }
        Probe::Forged {
            shape,
            strides,
            offset,
            index,
            ..
        } => {
            let mut e = *offset as i128;
            for d in 0..shape.len() {
                let i = index[d];
                if i < 0 || i as u64 >= shape[d] {
                    return None;
                }
                e += i as i128 * strides[d] as i128;
            }
            Some(e)
        }
    }
}

/// Runs one case: binds an argument with layout `l` (resident or staged) in a run whose
/// orchestration applies every probe; checks each outcome and the device bytes against a model.
fn check(
    l: &Layout,
    probes: &[Probe],
    resident: bool,
    svm: SvmPolicy,
) -> Result<(), TestCaseError> {
    let (cell, dev) = sim(svm, Staging::Arena);
    let g0 = Geometry::new(
        &"a",
        DType::I32,
        &l.shape,
        Some(&l.strides),
        if resident { l.offset } else { 0 },
    )
    .unwrap();
    let (args, staged_bytes, buf) = if resident {
        let elems = g0.end_byte() / ES + l.pad;
        let mut w = cell.lock().unwrap();
        let b = w.malloc(elems * ES).unwrap();
        w.copy_to(b, 0, &i32s(0..elems as i32)).unwrap();
        let spec = RunArgSpec {
            name: "a".into(),
            value: ArgValue::Device {
                buffer: b,
                geometry: g0,
            },
        };
        (vec![spec], vec![], Some((b.ptr, elems)))
    } else {
        // The only staged tensor: its slice starts at byte 0 of the arena.
        (
            vec![staged("a", g0)],
            vec![i32s(0..(g0.extent() / ES) as i32)],
            None,
        )
    };
    let s = sig(&[Direction::InOut]);
    let failures = std::cell::RefCell::new(Vec::<String>::new());
    let device = std::cell::RefCell::new(None);
    let mut host = Host::new(staged_bytes, |run| {
        let o = orch(&cell, run);
        let arg = o.tensor(0).unwrap().geometry;
        let (alloc, alloc_elems) = buf.unwrap_or_else(|| {
            let (p, cap) = cell.lock().unwrap().arena().unwrap();
            (p, cap / ES)
        });
        let span = (
            arg.start_byte() as i128,
            (arg.start_byte() + arg.extent()) as i128,
        );
        let mut model: HashMap<i128, i32> = HashMap::new();
        let before = read_all(&dev, alloc, alloc_elems);
        let fail = |m: String| failures.borrow_mut().push(m);
        for (k, p) in probes.iter().enumerate() {
            let (geometry, index, write) = match p {
                Probe::View {
                    shape,
                    offsets,
                    index,
                    write,
                } => match arg.view(&"a", shape, offsets) {
                    Ok(v) => (v, index.clone(), *write),
                    Err(e) => {
                        if expected_elem(&arg, p).is_some() {
                            fail(format!("view refused: {e}"));
                        }
                        continue;
                    }
                },
                Probe::Forged {
                    shape,
                    strides,
                    offset,
                    index,
                    write,
                } => match Geometry::new(&"a", DType::I32, shape, Some(strides), *offset) {
                    Ok(g) => (g, index.clone(), *write),
                    Err(_) => continue,
                },
            };
            let want = expected_elem(&arg, p);
            let inside =
                want.is_some_and(|e| e * ES as i128 >= span.0 && (e + 1) * ES as i128 <= span.1);
            let value = -(k as i32) - 2; // never an element position
            let r = if write {
                o.write(0, &geometry, &index, Value::Int(value as i64))
                    .map(|()| None)
            } else {
                o.read(0, &geometry, &index).map(Some)
            };
            match r {
                Ok(got) => {
                    if !inside {
                        fail(format!("probe {p:?} succeeded outside the extent {span:?}"));
                        continue;
                    }
                    let e = want.expect("inside");
                    if let Some(v) = got {
                        let have = model.get(&e).copied().unwrap_or(before[e as usize]);
                        if v != Value::Int(have as i64) {
                            fail(format!("probe {p:?} read {v:?}, model has {have}"));
                        }
                    } else {
                        model.insert(e, value);
                    }
                }
                Err(e) => {
                    if inside {
                        fail(format!("probe {p:?} inside the extent was refused: {e}"));
                    }
                    if !matches!(e, Error::Value(_) | Error::NoHostView { .. }) {
                        fail(format!("unexpected error kind: {e}"));
                    }
                }
            }
        }
        *device.borrow_mut() = Some((alloc, alloc_elems, before, model));
        Ok(())
    });
    go(&cell, "probe", &s, &args, &mut host).unwrap();
    drop(host);
    let failures = failures.take();
    prop_assert!(failures.is_empty(), "{:?}", failures);
    // Exactly the written elements changed, on the device (read before close frees it).
    let (alloc, alloc_elems, before, model) = device.take().unwrap();
    let after = read_all(&dev, alloc, alloc_elems);
    for (i, (&b, &a)) in before.iter().zip(&after).enumerate() {
        let want = model.get(&(i as i128)).copied().unwrap_or(b);
        prop_assert_eq!(a, want, "element {} of the allocation", i);
    }
    let s = cell.lock().unwrap().close();
    prop_assert!(s.errors.is_empty());
    prop_assert_eq!(dev.stats().live_allocations, 0);
    Ok(())
}

proptest! {
    #[test]
    fn resident_accesses_stay_inside_their_extent_mapped(l in layout(), probes in prop::collection::vec(probe(), 1..24)) {
        check(&l, &probes, true, SvmPolicy::Always)?;
    }

    #[test]
    fn resident_accesses_stay_inside_their_extent_mirrored(l in layout(), probes in prop::collection::vec(probe(), 1..24)) {
        check(&l, &probes, true, SvmPolicy::Never)?;
    }

    #[test]
    fn staged_accesses_stay_inside_their_extent_mapped(l in layout(), probes in prop::collection::vec(probe(), 1..24)) {
        check(&l, &probes, false, SvmPolicy::Always)?;
    }

    #[test]
    fn staged_accesses_stay_inside_their_extent_copied(l in layout(), probes in prop::collection::vec(probe(), 1..24)) {
        check(&l, &probes, false, SvmPolicy::Never)?;
    }
}
