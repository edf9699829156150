//! Resident sets as Python sees them: the entries (name, direction, device tensor) of one
//! runtime resident set, added one fixture at a time, released in one call that says how it
//! went. The ownership itself (allocation, LIFO release, refusal while bound to a run) is the
//! runtime's.

use std::sync::{Arc, Mutex, MutexGuard};

use numpy::{PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyKeyError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyWeakrefMethods, PyWeakrefReference};
use pyo3::{PyTraverseError, PyVisit};

use simpler_runtime::{Direction, Geometry, ViewPolicy, WorkerCell};

use crate::built::BuiltArgs;
use crate::cell::Shared;
use crate::convert::{self, Dir};
use crate::direction::ArgDirection;
use crate::errors::{done, state_err, to_py, type_err, type_name, value_err, PyResultExt};
use crate::handles::{self, Buffer, DeviceTensor};
use crate::logging;
use crate::runhost::{flat_bytes, named_values};
use crate::worker::PyWorker;

struct Entry {
    name: Arc<str>,
    dir: Direction,
    /// The host array itself, for a fixture without bytes (host-staged); `None` for a resident
    /// tensor (see `tensor`).
    host: Option<Py<PyAny>>,
    /// A resident tensor: held weakly, so that the set's own reference never keeps an export of
    /// it alive (a tensor whose `__cuda_array_interface__` was read exports its memory for its
    /// life); made again, equal, when the caller's object is gone.
    tensor: Option<HeldTensor>,
    resident: bool,
}

struct HeldTensor {
    weak: Py<PyWeakrefReference>,
    buffer: Py<Buffer>,
    buf: simpler_runtime::BufferRef,
    geometry: Geometry,
}

impl Entry {
    /// The entry's value: its device tensor (the caller's object while it lives), or the host
    /// array.
    fn value(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(h) = &self.host {
            return Ok(h.clone_ref(py));
        }
        let Some(t) = &self.tensor else {
            return Err(state_err("resident entry without a value"));
        };
        if let Some(live) = t.weak.bind(py).upgrade() {
            return Ok(live.unbind());
        }
        let again = DeviceTensor::from_parts(t.buffer.clone_ref(py), t.buf, t.geometry);
        Ok(Bound::new(py, again)?.into_any().unbind())
    }
}

/// The host storage of a fixture still alive: a later fixture overlapping it is refused.
struct Fixture {
    name: Arc<str>,
    /// A weak reference to the array that owns the storage.
    owner: Py<PyWeakrefReference>,
    start: u64,
    end: u64,
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    fixtures: Vec<Fixture>,
    released: bool,
}

/// Case-owned device buffers for resident tensor arguments (``ResidentTaskArgs``; see
/// ``docs/concepts.md``). ``ResidentSet(worker)`` opens an empty set on the worker.
#[pyclass(
    module = "simpler._core",
    name = "ResidentSet",
    subclass,
    frozen,
    weakref
)]
pub struct ResidentSet {
    cell: Arc<Shared>,
    set: u64,
    inner: Mutex<Inner>,
}

impl ResidentSet {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_open(&self, what: &str) -> PyResult<()> {
        if self.inner().released {
            return Err(state_err(format!(
                "ResidentTaskArgs.{what}: the set was released"
            )));
        }
        Ok(())
    }

    /// `(direction, value, resident)` of entry `name`, or a `KeyError` naming what there is.
    fn entry(&self, py: Python<'_>, name: &str) -> PyResult<(Direction, Py<PyAny>, bool)> {
        let inner = self.inner();
        match inner.entries.iter().find(|e| &*e.name == name) {
            Some(e) => Ok((e.dir, e.value(py)?, e.resident)),
            None => {
                let have: Vec<&str> = inner.entries.iter().map(|e| &*e.name).collect();
                Err(PyKeyError::new_err(format!(
                    "no resident argument named '{name}' (have: {})",
                    have.join(", ")
                )))
            }
        }
    }

    /// Refuses a fixture whose storage overlaps a still-alive earlier one's.
    fn check_overlap(
        &self,
        arr: &Bound<'_, PyUntypedArray>,
        what: &str,
    ) -> PyResult<Option<(Py<PyWeakrefReference>, u64, u64)>> {
        let nbytes = arr.len() as u64 * arr.dtype().itemsize() as u64;
        if nbytes == 0 {
            return Ok(None);
        }
        let start: u64 = arr
            .getattr("__array_interface__")?
            .get_item("data")?
            .get_item(0)?
            .extract()?;
        let end = start.checked_add(nbytes).ok_or_else(|| {
            value_err(format!(
                "{what}: host storage at {start:#x} + {nbytes} bytes wraps"
            ))
        })?;
        // Python work (the root's `base` chain, the weak reference) happens before the lock is
        // taken, and dead fixtures are dropped after it is released: nothing that can run Python
        // code (a `__del__` touching this set) runs under it.
        let mut root = arr.as_any().clone();
        loop {
            let base = root.getattr("base")?;
            if base.cast::<PyUntypedArray>().is_err() {
                break;
            }
            root = base;
        }
        let owner = PyWeakrefReference::new(&root)?.unbind();
        let py = arr.py();
        let (dead, overlap) = {
            let mut inner = self.inner();
            let (live, dead): (Vec<Fixture>, Vec<Fixture>) = std::mem::take(&mut inner.fixtures)
                .into_iter()
                .partition(|f| f.owner.bind(py).upgrade().is_some());
            inner.fixtures = live;
            let overlap = inner
                .fixtures
                .iter()
                .find(|f| start < f.end && f.start < end)
                .map(|f| f.name.clone());
            (dead, overlap)
        };
        drop(dead);
        if let Some(other) = overlap {
            return Err(value_err(format!(
                "{what}: its host storage overlaps resident fixture '{other}' (an aliased layout \
                 cannot be made resident faithfully)"
            )));
        }
        Ok(Some((owner, start, end)))
    }
}

/// `lazy` and `eager` (the worker's policy, established at the first access or now), then the
/// policies.
fn host_view_names() -> Vec<&'static str> {
    ["lazy", "eager"]
        .into_iter()
        .chain(ViewPolicy::ALL.iter().map(|p| p.name()))
        .collect()
}

#[pymethods]
impl ResidentSet {
    #[new]
    fn new(py: Python<'_>, worker: &Bound<'_, PyAny>) -> PyResult<Self> {
        let w = worker.cast::<PyWorker>().map_err(|_| {
            type_err(format!(
                "ResidentTaskArgs: expected a Worker, got {}",
                type_name(worker)
            ))
        })?;
        let cell = w.get().cell.clone();
        let set = done(py, cell.with(false, |w| w.resident_open()))?;
        Ok(ResidentSet {
            cell,
            set,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Never blocks: a set being changed on another thread is visited next time.
        if let Ok(inner) = self.inner.try_lock() {
            for e in &inner.entries {
                if let Some(h) = &e.host {
                    visit.call(h)?;
                }
                if let Some(t) = &e.tensor {
                    visit.call(&t.weak)?;
                    visit.call(&t.buffer)?;
                }
            }
            for f in &inner.fixtures {
                visit.call(&f.owner)?;
            }
        }
        Ok(())
    }

    /// Whether ``release`` ran.
    #[getter]
    fn released(&self) -> bool {
        self.inner().released
    }

    /// Every added name, in add order (zero-byte fixtures included).
    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner()
            .entries
            .iter()
            .map(|e| e.name.to_string())
            .collect()
    }

    /// The names that hold a device buffer, in add order.
    #[getter]
    fn resident_names(&self) -> Vec<String> {
        let inner = self.inner();
        inner
            .entries
            .iter()
            .filter(|e| e.resident)
            .map(|e| e.name.to_string())
            .collect()
    }

    /// The direction ``name`` was added with.
    fn direction<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = convert::arg_name(name, "ResidentTaskArgs.direction")?;
        ArgDirection::member(py, self.entry(py, &name)?.0)
    }

    /// The device tensor of ``name`` (the host array for a zero-byte fixture).
    fn __getitem__(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let name = &*name.str()?.to_cow()?.into_owned();
        self.check_open(&format!("['{name}']"))?;
        Ok(self.entry(py, name)?.1)
    }

    fn __contains__(&self, name: &Bound<'_, PyAny>) -> bool {
        let Ok(name) = name.cast::<PyString>() else {
            return false;
        };
        let Ok(name) = name.to_cow() else {
            return false;
        };
        self.inner().entries.iter().any(|e| *e.name == *name)
    }

    fn __len__(&self) -> usize {
        self.inner().entries.len()
    }

    fn __repr__(&self) -> String {
        let inner = self.inner();
        let names: Vec<&str> = inner.entries.iter().map(|e| &*e.name).collect();
        let state = if inner.released {
            "released".to_owned()
        } else {
            format!(
                "{} resident",
                inner.entries.iter().filter(|e| e.resident).count()
            )
        };
        format!("ResidentTaskArgs({names:?}, {state})")
    }

    /// Makes ``host`` resident under ``name``; returns its ``DeviceTensor``.
    ///
    /// ``host_view`` declares how the orchestrator reaches the tensor (``docs/host-views.md``):
    /// ``"mapping"``, ``"cached"`` (a mapping read through a host cache), ``"mirror"``, or
    /// ``"auto"`` / ``"lazy"`` (the worker's policy; the default). ``eager=True`` (or
    /// ``host_view="eager"``: the worker's policy, now) establishes the view when the tensor is
    /// added, so the first run that reads it pays nothing for it; otherwise it is established
    /// at the first access.
    ///
    /// Allocates ``host.nbytes``, uploads unless ``direction`` is OUT, keeps no reference to
    /// ``host``. A zero-byte fixture allocates nothing and stays host-staged: it is recorded and
    /// returned as is. Rejects duplicate names, non-numpy or non-contiguous arrays, unsupported
    /// dtypes, and storage that overlaps a still-alive earlier fixture. A failed upload frees
    /// what this call allocated.
    #[pyo3(signature = (name, host, direction=None, host_view=None, eager=None))]
    fn add<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        host: &Bound<'py, PyAny>,
        direction: Option<Dir>,
        host_view: Option<&Bound<'py, PyAny>>,
        eager: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let eager = match eager {
            Some(e) => e.is_truthy()?,
            None => false,
        };
        self.check_open("add")?;
        let name = convert::arg_name(name, "ResidentTaskArgs.add")?;
        let what = format!("resident tensor '{name}'");
        let arr = &convert::ndarray(host, &what)?;
        let fixture = self.check_overlap(arr, &what)?;
        let policies = host_view_names();
        let view = match host_view {
            None => "lazy".to_owned(),
            Some(v) => match v.extract::<String>() {
                Ok(s) if policies.contains(&s.as_str()) => s,
                _ => {
                    return Err(value_err(format!(
                        "{what}: host_view must be one of {}, not {}",
                        policies.join(", "),
                        v.repr()?
                    )))
                }
            },
        };
        let eager = eager || view == "eager";
        let dir = direction.map_or(Direction::In, |d| d.0);
        let geometry =
            convert::array_geometry(arr, &what)?.ok_or_else(|| handles::not_native(arr, &what))?;
        // The bytes, when the layout is one the runtime takes (it checks contiguity itself).
        let flat = flat_bytes(arr.as_any(), geometry.extent())?;
        let ro = flat.try_readonly()?;
        let bytes: &[u8] = if geometry.is_contiguous() {
            ro.as_slice()?
        } else {
            &[]
        };
        let set = self.set;
        let r = self
            .cell
            .with(true, |w| w.resident_add(set, &name, &geometry, dir, bytes));
        let added = done(py, r)?;
        drop(ro);
        let name: Arc<str> = Arc::from(name);
        let Some(buf) = added else {
            // No bytes: it stays host-staged.
            self.inner().entries.push(Entry {
                name,
                dir,
                host: Some(host.clone().unbind()),
                tensor: None,
                resident: false,
            });
            return Ok(host.clone().unbind());
        };
        // The rest of the add (the handle, a view hint, an eager view) either completes or is
        // rolled back: the allocation freed, the name free for a retry.
        let finish = || -> PyResult<Bound<'py, PyAny>> {
            let buffer = Bound::new(py, Buffer::new(self.cell.clone(), buf, geometry.nbytes()))?;
            let shape = geometry.shape().to_vec();
            let layout = Geometry::new(&what, geometry.dtype(), &shape, None, 0).py()?;
            let tensor = Bound::new(py, DeviceTensor::checked(&buffer, layout, &what)?)?;
            if let Some(p) = ViewPolicy::parse(&view).filter(|_| view != "auto") {
                done(py, self.cell.with(true, |w| w.hint_view(buf, p)))?;
            }
            if eager {
                done(py, self.cell.with(true, |w| w.establish_view(buf, &name)))?;
            }
            Ok(tensor.into_any())
        };
        let tensor = match finish() {
            Ok(t) => t,
            Err(e) => {
                let set = self.set;
                if let Err(undo) = self.cell.with(true, |w| w.resident_roll_back(set, &name)) {
                    log::error!("rollback of a failed add also failed: {undo}");
                }
                logging::flush(py);
                return Err(e);
            }
        };
        let held = {
            let t = tensor.cast::<DeviceTensor>()?.get();
            HeldTensor {
                weak: PyWeakrefReference::new(&tensor)?.unbind(),
                buffer: t.buffer.clone_ref(py),
                buf: t.buf,
                geometry: t.geometry,
            }
        };
        let mut inner = self.inner();
        inner.entries.push(Entry {
            name: name.clone(),
            dir,
            host: None,
            tensor: Some(held),
            resident: true,
        });
        if let Some((owner, start, end)) = fixture {
            inner.fixtures.push(Fixture {
                name,
                owner,
                start,
                end,
            });
        }
        drop(inner);
        Ok(tensor.unbind())
    }

    /// Every added tensor in add order, then ``scalars`` (values, or specs with a ``name`` and
    /// a ``value`` such as ``Scalar``).
    ///
    /// Raises ``ArgumentError`` when ``expected_count`` (the signature's tensor count) differs
    /// from the number of tensors added: a skipped fixture would shift every later argument.
    #[pyo3(signature = (expected_count=None, scalars=None))]
    fn build_args(
        &self,
        py: Python<'_>,
        expected_count: Option<&Bound<'_, PyAny>>,
        scalars: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<BuiltArgs> {
        self.check_open("build_args")?;
        let mut pairs: Vec<(Arc<str>, Py<PyAny>)> = {
            let inner = self.inner();
            inner
                .entries
                .iter()
                .map(|e| Ok((e.name.clone(), e.value(py)?)))
                .collect::<PyResult<_>>()?
        };
        if let Some(c) = expected_count {
            if c.is_instance_of::<pyo3::types::PyBool>() || !c.hasattr("__index__")? {
                return Err(type_err(format!(
                    "ResidentTaskArgs.build_args: expected_count must be an int, not {}",
                    c.repr()?
                )));
            }
            let n: i128 = c.call_method0("__index__")?.extract()?;
            if n != pairs.len() as i128 {
                let names: Vec<&str> = pairs.iter().map(|(n, _)| &**n).collect();
                return Err(value_err(format!(
                    "ResidentTaskArgs.build_args: expected {n} tensor arguments, have {} ({}); \
                     was a fixture (e.g. an empty one) skipped instead of added?",
                    pairs.len(),
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                )));
            }
        }
        if let Some(scalars) = scalars {
            for (i, s) in scalars.try_iter()?.enumerate() {
                let s = s?;
                // A spec (a `Scalar`) has a name and a value; anything else is a value, which
                // the run checks like every scalar.
                let spec = s
                    .getattr(intern!(py, "name"))
                    .and_then(|n| n.extract::<String>())
                    .and_then(|n| Ok((n, s.getattr(intern!(py, "value"))?)));
                match spec {
                    Ok((name, value)) => pairs.push((Arc::from(name), value.unbind())),
                    Err(_) => pairs.push((Arc::from(format!("scalar{i}")), s.unbind())),
                }
            }
        }
        Ok(BuiltArgs::from_pairs(pairs))
    }

    /// ``builder``'s arguments in order, with every resident one replaced by its device tensor.
    fn bind(&self, py: Python<'_>, builder: &Bound<'_, PyAny>) -> PyResult<BuiltArgs> {
        self.check_open("bind")?;
        let named = named_values(builder)?;
        let resident: Vec<Option<Py<PyAny>>> = {
            let inner = self.inner();
            named
                .iter()
                .map(|(n, _)| {
                    let e = inner.entries.iter().find(|e| e.name == *n && e.resident);
                    e.map(|e| e.value(py)).transpose()
                })
                .collect::<PyResult<_>>()?
        };
        let pairs = named
            .into_iter()
            .zip(resident)
            .map(|((n, v), r)| (n, r.unwrap_or_else(|| v.unbind())))
            .collect();
        Ok(BuiltArgs::from_pairs(pairs))
    }

    /// Reads resident tensors back into ``builder``'s arrays of the same names.
    ///
    /// ``names`` defaults to every resident OUT/INOUT tensor. A zero-byte fixture has nothing to
    /// read. The destination must be a writable C-contiguous array of the same shape and dtype.
    #[pyo3(signature = (builder, names=None))]
    fn copy_back(
        &self,
        py: Python<'_>,
        builder: &Bound<'_, PyAny>,
        names: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.check_open("copy_back")?;
        let names: Vec<String> = match names {
            None => {
                let inner = self.inner();
                inner
                    .entries
                    .iter()
                    .filter(|e| e.resident && e.dir.writes())
                    .map(|e| e.name.to_string())
                    .collect()
            }
            Some(n) if n.cast::<PyString>().is_ok() => vec![n.extract()?],
            Some(n) => n
                .try_iter()?
                .map(|x| x?.extract::<String>())
                .collect::<PyResult<_>>()?,
        };
        for name in names {
            let (_, value, resident) = self.entry(py, &name)?;
            if !resident {
                continue;
            }
            let t = value.bind(py).cast::<DeviceTensor>()?.get();
            let what = format!("copy_back '{name}'");
            let dst = builder.get_item(&name)?;
            let arr = &convert::ndarray(&dst, &what)?;
            let dtype = convert::array_dtype(&arr.dtype(), &what)?;
            let shape: Vec<u64> = arr.shape().iter().map(|&s| s as u64).collect();
            if shape != t.geometry.shape() || dtype != t.geometry.dtype() {
                return Err(value_err(format!(
                    "{what}: destination is {}{shape:?}, resident tensor is {}{:?}",
                    dtype.name(),
                    t.geometry.dtype().name(),
                    t.geometry.shape()
                )));
            }
            let zero = 0u64.into_pyobject(py)?;
            let src = handles::BufferArg {
                buffer: t.buffer.clone_ref(py),
                tensor: Some(t.geometry),
            };
            handles::copy_from(py, &self.cell, &dst, &src, zero.as_any())?;
        }
        Ok(())
    }

    /// Frees every buffer in LIFO order, attempting each even when one fails.
    ///
    /// Each failure is logged; after all were attempted the first is raised. Refused, with
    /// nothing freed and the set still usable, while one of its tensors is bound to the run in
    /// progress. Idempotent.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        if self.inner().released {
            return Ok(());
        }
        let set = self.set;
        let errors = done(py, self.cell.with(true, |w| w.resident_release(set)))?;
        let taken = {
            let mut inner = self.inner();
            inner.released = true;
            (
                std::mem::take(&mut inner.entries),
                std::mem::take(&mut inner.fixtures),
            )
        };
        drop(taken); // outside the lock: dropping a tensor or an array may run Python code
        let mut errors = errors.into_iter();
        match errors.next() {
            None => Ok(()),
            Some(first) => {
                let more = errors.count();
                let e = to_py(py, first);
                if more > 0 {
                    let note = format!("{more} more release failure(s) were logged");
                    let _ = e.value(py).call_method1("add_note", (note,));
                }
                Err(e)
            }
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases the set; after an error in the block, a failed release is logged instead of
    /// replacing that error.
    #[pyo3(signature = (*exc_info))]
    fn __exit__(&self, py: Python<'_>, exc_info: &Bound<'_, PyTuple>) -> PyResult<()> {
        let r = self.release(py);
        if exc_info.get_item(1).is_ok_and(|e| e.is_none()) {
            return r;
        }
        if let Err(e) = r {
            log::error!("release after an error also failed: {}", e.value(py));
            logging::flush(py);
        }
        Ok(())
    }
}
