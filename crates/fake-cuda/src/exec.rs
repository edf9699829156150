//! Streams and events, and the execution of device work.
//!
//! Every stream has a FIFO queue of operations. A background thread runs them in order; it is
//! started when the queue goes from idle to busy and sleeps the launch latency whenever work
//! arrives on an idle queue. Once the queue is empty it stays for [`LINGER`], looking for more
//! work, and then ends: a stream fed round after round keeps its thread (queueing work costs
//! what a driver's call does, not a thread's start), and a fake left idle soon has no threads of
//! its own. Nothing holds the process open at exit (an exiting process ends a lingering thread,
//! which owns nothing and runs no code of ours but a wait), and the library is never unloaded
//! while one waits (it is opened once per process and never closed, by the driver's loader as by
//! ctypes). It is a plain, detached pthread, so a host kernel ended by `pthread_exit` (a Python
//! callback while the interpreter finalizes) ends just that thread instead of aborting the
//! process (see `spawn_executor`).
//!
//! The built-in streams are queues too, as on a GPU, made on first use by [`Exec::resolve`] and
//! never handed out as handles (nor counted as live streams): `0` and `CU_STREAM_LEGACY` name
//! the *legacy* default stream of the calling thread's current device, `CU_STREAM_PER_THREAD`
//! the per-thread default stream of the calling thread and that device (a blocking stream,
//! dropped once idle after its thread ended).
//!
//! Legacy synchronization (CUDA Driver API, "Stream synchronization behavior"): an operation
//! queued on the legacy stream first waits for the work already queued on the device's
//! *blocking* streams (flags 0, the per-thread default streams included); an operation queued on
//! a blocking stream first waits for the legacy stream's work queued before it. Streams created
//! with `CU_STREAM_NON_BLOCKING` never synchronize with the legacy stream. [`Exec::enqueue`]
//! queues these implicit waits as `Wait` operations in front of the operation.
//!
//! Locking: the queues live under their own mutex (`EXEC`), with one condition variable that is
//! notified on every change. A thread may take `EXEC` while holding the state mutex, never the
//! other way round; nothing blocks (waits for a queue, runs a host kernel) holding the state
//! mutex, and host kernels run with no lock held.
//!
//! Progress is counted per stream: `enq` operations were ever queued, `done` of them have
//! finished (or were discarded after a fault); the stream is idle when they are equal. An event
//! records a point `(stream, enq)`, complete once `done` reaches it or the stream is gone. A
//! timing event's recording also queues a marker that stamps the host's monotonic clock when
//! the stream reaches it.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_uint, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{
    with_state, CUdevice, CUresult, HostKernel, CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
};

/// `CU_STREAM_LEGACY`.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;

/// Whether `h` is a built-in stream handle (`0`, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`).
pub fn builtin(h: usize) -> bool {
    h <= CU_STREAM_PER_THREAD
}

/// Whether `h` names the legacy default stream.
pub fn legacy(h: usize) -> bool {
    h == 0 || h == CU_STREAM_LEGACY
}

/// Where host-to-device bytes come from when the copy runs.
pub enum Source {
    /// A host address read when the copy runs: a registered (pinned) range, as DMA reads it, or
    /// the buffer of a synchronous call, which waits for the copy.
    Host(usize),
    /// Bytes copied out of pageable memory at call time (staged).
    Copied(Vec<u8>),
}

/// A kernel launch, its parameter values copied at call time.
#[derive(Clone)]
pub struct Launch {
    pub entry: CString,
    pub params: Vec<u64>,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
}

/// What an operation does.
pub enum Work {
    HtoD {
        dst: u64,
        src: Source,
        n: usize,
    },
    /// `dst` is the caller's host address.
    DtoH {
        dst: usize,
        src: u64,
        n: usize,
    },
    Memset {
        dst: u64,
        value: u8,
        n: usize,
    },
    Launch(Launch),
    /// A graph launch: the captured launches, run in order (`api::graph`); the first fault
    /// stops it.
    Graph(std::sync::Arc<Vec<Launch>>),
    /// Waits until the point is complete.
    Wait(Point),
    /// A timing event's marker: stamps the event's `records`-th recording with the time the
    /// stream reached it.
    Stamp {
        event: usize,
        records: u64,
    },
}

/// One queued operation of device `dev`; `what` names it in fault lines of the log.
pub struct Op {
    pub dev: CUdevice,
    pub what: String,
    pub work: Work,
}

/// A position in a stream: complete once `seq` of its operations are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub stream: usize,
    pub seq: u64,
}

/// What made a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cuStreamCreate`: the only kind whose handle callers hold.
    Created,
    /// The legacy default stream of a device (`0`, `CU_STREAM_LEGACY`).
    Legacy,
    /// The per-thread default stream of a thread and device (`CU_STREAM_PER_THREAD`).
    PerThread,
}

pub struct Stream {
    pub dev: CUdevice,
    pub flags: c_uint,
    pub kind: Kind,
    ops: VecDeque<Op>,
    enq: u64,
    done: u64,
    /// A thread is running this queue.
    worker: bool,
    /// `cuStreamDestroy_v2` is draining it: no new work, the handle is invalid.
    pub destroyed: bool,
    /// Runs nothing while set (`fake_cuda_hold_stream`).
    pub held: bool,
    /// A per-thread stream whose thread ended: dropped once idle.
    orphan: bool,
}

impl Stream {
    pub fn idle(&self) -> bool {
        self.done == self.enq
    }

    /// Whether the stream synchronizes with the legacy stream (flags 0).
    pub fn blocking(&self) -> bool {
        self.flags & CU_STREAM_NON_BLOCKING == 0
    }
}

pub struct Event {
    pub dev: CUdevice,
    /// Made without `CU_EVENT_DISABLE_TIMING`: each recording queues a time stamp.
    pub timing: bool,
    /// The last recorded point; `None` while never recorded.
    pub point: Option<Point>,
    /// Number of recordings so far (a marker stamps only the recording that queued it).
    records: u64,
    /// When the stream reached the last recording's marker (timing events).
    pub stamp: Option<Instant>,
}

impl Event {
    pub fn new(dev: CUdevice, timing: bool) -> Event {
        Event {
            dev,
            timing,
            point: None,
            records: 0,
            stamp: None,
        }
    }
}

pub struct Exec {
    pub streams: BTreeMap<usize, Stream>,
    pub events: BTreeMap<usize, Event>,
    /// Created streams run nothing while set (`fake_cuda_hold_streams`).
    pub held: bool,
    latency: Duration,
    /// The internal streams behind the built-in handles, by (thread key, device); key 0 is the
    /// device's legacy stream.
    builtin: BTreeMap<(u64, CUdevice), usize>,
}

static EXEC: Mutex<Exec> = Mutex::new(Exec {
    streams: BTreeMap::new(),
    events: BTreeMap::new(),
    held: false,
    latency: Duration::from_micros(crate::DEFAULT_LATENCY_US),
    builtin: BTreeMap::new(),
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// Whether this thread is a stream's executor.
    static EXECUTOR: Cell<bool> = const { Cell::new(false) };
    /// This thread's key for its per-thread default streams.
    static THREAD: ThreadKey = ThreadKey(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
}

/// Thread keys; 0 is the legacy stream's.
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// A thread's key; when the thread ends, its per-thread streams are dropped once idle.
struct ThreadKey(u64);

impl Drop for ThreadKey {
    fn drop(&mut self) {
        lock().orphan_thread(self.0);
        notify();
    }
}

/// Whether the calling thread is a stream's executor (i.e. inside a host kernel).
pub fn on_executor() -> bool {
    EXECUTOR.with(Cell::get)
}

/// The queues. Callers may hold the state mutex; must not take it while holding this.
pub fn lock() -> MutexGuard<'static, Exec> {
    EXEC.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn set_latency_us(us: u64) {
    lock().latency = Duration::from_micros(us);
}

/// Wakes every waiter (after a change made under [`lock`]).
pub fn notify() {
    CHANGED.notify_all();
}

impl Exec {
    /// A live (not destroyed) stream made by `cuStreamCreate`.
    pub fn stream(&self, h: usize) -> Option<&Stream> {
        self.streams
            .get(&h)
            .filter(|s| s.kind == Kind::Created && !s.destroyed)
    }

    fn new_stream(&mut self, dev: CUdevice, flags: c_uint, kind: Kind) -> usize {
        let h = crate::new_handle(crate::STREAM_BASE);
        let s = Stream {
            dev,
            flags,
            kind,
            ops: VecDeque::new(),
            enq: 0,
            done: 0,
            worker: false,
            destroyed: false,
            held: false,
            orphan: false,
        };
        self.streams.insert(h, s);
        h
    }

    pub fn create_stream(&mut self, dev: CUdevice, flags: c_uint) -> usize {
        self.new_stream(dev, flags, Kind::Created)
    }

    /// The stream `h` stands for on the calling thread, with device `dev` current: a built-in
    /// handle's internal stream (made on first use), any other handle itself.
    pub fn resolve(&mut self, h: usize, dev: CUdevice) -> usize {
        let (key, kind) = if legacy(h) {
            (0, Kind::Legacy)
        } else if h == CU_STREAM_PER_THREAD {
            // A call from a thread-local destructor after this thread's key is gone gets a
            // stream of its own, never dropped (nothing else is left to call from there).
            let key = THREAD
                .try_with(|k| k.0)
                .unwrap_or_else(|_| NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
            (key, Kind::PerThread)
        } else {
            return h;
        };
        if let Some(&s) = self.builtin.get(&(key, dev)) {
            if self.streams.contains_key(&s) {
                return s;
            }
        }
        let s = self.new_stream(dev, 0, kind);
        self.builtin.insert((key, dev), s);
        s
    }

    /// Number of streams made by `cuStreamCreate` and not yet destroyed.
    pub fn created(&self) -> usize {
        self.streams
            .values()
            .filter(|s| s.kind == Kind::Created)
            .count()
    }

    /// The thread of key `key` ended: its per-thread streams are dropped (now, or once idle).
    fn orphan_thread(&mut self, key: u64) {
        let mine: Vec<((u64, CUdevice), usize)> = self
            .builtin
            .iter()
            .filter(|((k, _), _)| *k == key)
            .map(|(&k, &h)| (k, h))
            .collect();
        for (k, h) in mine {
            self.builtin.remove(&k);
            if let Some(s) = self.streams.get_mut(&h) {
                s.orphan = true;
                if s.idle() && !s.worker {
                    self.streams.remove(&h);
                }
            }
        }
    }

    /// The points that legacy synchronization makes an operation queued now on stream `h` wait
    /// for: on the legacy stream, the pending work of the device's other blocking streams; on
    /// another blocking stream, the legacy stream's pending work; nothing on a non-blocking one.
    fn implicit_waits(&self, h: usize) -> Vec<Point> {
        let Some(s) = self.streams.get(&h).filter(|s| s.blocking()) else {
            return Vec::new();
        };
        let on_legacy = s.kind == Kind::Legacy;
        self.streams
            .iter()
            .filter(|(&k, t)| k != h && t.dev == s.dev && t.blocking() && !t.idle())
            .filter(|(_, t)| (t.kind == Kind::Legacy) != on_legacy)
            .map(|(&k, t)| Point {
                stream: k,
                seq: t.enq,
            })
            .collect()
    }

    /// Queues on live stream `h` the implicit waits an operation of `dev` queued now needs.
    fn barrier(&mut self, h: usize, dev: CUdevice) -> Result<(), CUresult> {
        for p in self.implicit_waits(h) {
            let op = Op {
                dev,
                what: format!("implicit wait for stream {:#x}", p.stream),
                work: Work::Wait(p),
            };
            self.push(h, op)?;
        }
        Ok(())
    }

    /// Queues `op` on live stream `h` (after the implicit waits of legacy synchronization),
    /// starting its thread if it has none.
    pub fn enqueue(&mut self, h: usize, op: Op) -> Result<(), CUresult> {
        self.barrier(h, op.dev)?;
        self.push(h, op)
    }

    /// Queues `op` on live stream `h` as it is, starting its thread if it has none.
    fn push(&mut self, h: usize, op: Op) -> Result<(), CUresult> {
        let Some(s) = self.streams.get_mut(&h).filter(|s| !s.destroyed) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        s.ops.push_back(op);
        s.enq += 1;
        if !s.worker {
            if !spawn_executor(h) {
                s.ops.pop_back();
                s.enq -= 1;
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            s.worker = true;
        }
        notify();
        Ok(())
    }

    /// Records event `e` (of device `dev`) on live stream `h`: the event then stands for the
    /// stream's work queued so far, the implicit waits of legacy synchronization included; a
    /// timing event's recording queues its time-stamp marker.
    pub fn record(&mut self, e: usize, h: usize, dev: CUdevice) -> Result<(), CUresult> {
        let Some(ev) = self.events.get_mut(&e) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        ev.records += 1;
        ev.stamp = None;
        let (timing, records) = (ev.timing, ev.records);
        self.barrier(h, dev)?;
        if timing {
            let op = Op {
                dev,
                what: format!("cuEventRecord {e:#x} (time stamp)"),
                work: Work::Stamp { event: e, records },
            };
            self.push(h, op)?;
        }
        let point = self.point_of(h);
        if let Some(ev) = self.events.get_mut(&e) {
            ev.point = Some(point);
        }
        Ok(())
    }

    /// The point just past the work queued so far on stream `h`.
    pub fn point_of(&self, h: usize) -> Point {
        let seq = self.streams.get(&h).map_or(0, |s| s.enq);
        Point { stream: h, seq }
    }

    pub fn complete(&self, p: Point) -> bool {
        self.streams.get(&p.stream).is_none_or(|s| s.done >= p.seq)
    }

    /// Whether every stream of `dev` (only its blocking ones with `blocking_only`, the legacy
    /// and per-thread streams included; every stream of every device with `dev` `None`) is
    /// idle.
    pub fn idle(&self, dev: Option<CUdevice>, blocking_only: bool) -> bool {
        self.streams
            .values()
            .filter(|s| dev.is_none_or(|d| s.dev == d))
            .filter(|s| !blocking_only || s.blocking())
            .all(Stream::idle)
    }

    /// Releases every hold (`fake_cuda_hold_streams` and `fake_cuda_hold_stream`).
    pub fn release_holds(&mut self) {
        self.held = false;
        for s in self.streams.values_mut() {
            s.held = false;
        }
    }

    /// Drops every queued operation of `dev`'s streams (counted as done); returns how many.
    fn discard(&mut self, dev: CUdevice) -> usize {
        let mut n = 0;
        for s in self.streams.values_mut().filter(|s| s.dev == dev) {
            n += s.ops.len();
            s.done += s.ops.len() as u64;
            s.ops.clear();
        }
        n
    }
}

/// Blocks until `ready` holds. No lock may be held by the caller.
fn wait_until(ready: impl Fn(&Exec) -> bool) {
    let mut ex = lock();
    while !ready(&ex) {
        ex = CHANGED.wait(ex).unwrap_or_else(|e| e.into_inner());
    }
}

/// Blocks until stream `h` is idle (or gone). Returns at once on an executor thread, whose
/// driver calls are refused anyway (so a host kernel cannot deadlock the fake).
pub fn wait_stream(h: usize) {
    if !on_executor() {
        wait_until(|ex| ex.streams.get(&h).is_none_or(Stream::idle));
    }
}

/// Blocks until the streams of `dev` (see [`Exec::idle`]) are idle; as [`wait_stream`].
pub fn wait_device(dev: Option<CUdevice>, blocking_only: bool) {
    if !on_executor() {
        wait_until(|ex| ex.idle(dev, blocking_only));
    }
}

/// Blocks until `p` is complete; as [`wait_stream`].
pub fn wait_point(p: Point) {
    if !on_executor() {
        wait_until(|ex| ex.complete(p));
    }
}

/// Starts a detached executor thread for stream `h`; `false` when the system refuses.
///
/// A plain pthread rather than a `std::thread`: a host kernel may be a Python ctypes callback,
/// and Python (before 3.14) ends a thread that wants the GIL while the interpreter finalizes
/// with `pthread_exit`, a forced unwind. A `std::thread` would catch that at its top and abort
/// the whole process at exit; on a plain thread it unwinds to the thread's start, through
/// frames of the fake that own nothing while a host kernel runs ([`worker`] to
/// [`call_kernel`] hold only raw pointers and plain values), and just ends the thread.
fn spawn_executor(h: usize) -> bool {
    extern "C" {
        fn pthread_create(
            thread: *mut std::ffi::c_ulong,
            attr: *const c_void,
            start: extern "C-unwind" fn(*mut c_void) -> *mut c_void,
            arg: *mut c_void,
        ) -> std::ffi::c_int;
        fn pthread_detach(thread: std::ffi::c_ulong) -> std::ffi::c_int;
    }
    let mut t: std::ffi::c_ulong = 0;
    // SAFETY: `t` is a valid out pointer, a null `attr` asks for the defaults, and
    // `executor_start` takes the stream handle smuggled in `arg` (no pointer is dereferenced).
    let rc = unsafe { pthread_create(&mut t, std::ptr::null(), executor_start, h as *mut c_void) };
    if rc != 0 {
        return false;
    }
    // SAFETY: `t` is the thread just created, detached once (it is never joined).
    unsafe { pthread_detach(t) };
    true
}

/// The start routine of an executor thread: `arg` is the stream handle.
extern "C-unwind" fn executor_start(arg: *mut c_void) -> *mut c_void {
    worker(arg as usize);
    std::ptr::null_mut()
}

/// How long an executor thread keeps looking at its empty queue for more work before it ends.
pub const LINGER: Duration = Duration::from_millis(20);

/// How often a lingering executor looks at its queue, at least: it polls rather than waits to
/// be woken, so queueing work on a stream costs no thread wake-up (a system call, tens of
/// microseconds on a loaded machine), as a driver's queueing costs no system call.
const POLL: Duration = Duration::from_micros(50);

/// The executor of stream `h`: after the launch latency, runs its queue until it is empty, then
/// lingers for more work (which it runs after the latency again) until [`linger`] says to end.
fn worker(h: usize) {
    EXECUTOR.with(|c| c.set(true));
    loop {
        let latency = lock().latency;
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        while let Some(job) = next_job(h) {
            run_job(job);
            if let Some(s) = lock().streams.get_mut(&h) {
                s.done += 1;
            }
            notify();
        }
        if !linger(h) {
            return;
        }
    }
}

/// Looks at the empty queue of stream `h` every launch latency (or [`POLL`], if longer) for up to
/// [`LINGER`]: `true` once work is queued (it then waits the latency, as on a thread just
/// started); `false` when the thread is to end, with the stream marked as having no thread (or
/// dropped, when it is an orphaned per-thread stream): the time ran out, or the stream is gone,
/// destroyed or orphaned.
fn linger(h: usize) -> bool {
    let start = Instant::now();
    loop {
        let poll = {
            let mut ex = lock();
            let poll = ex.latency.max(POLL);
            let Some(s) = ex.streams.get_mut(&h) else {
                return false;
            };
            if !s.ops.is_empty() {
                return true;
            }
            if s.destroyed || s.orphan || start.elapsed() >= LINGER {
                s.worker = false;
                if s.orphan && s.idle() {
                    ex.streams.remove(&h);
                }
                return false;
            }
            poll
        };
        std::thread::sleep(poll);
    }
}

/// The next operation of stream `h` once it is not held (boxed and leaked, so no frame owns it
/// while it runs), or `None` when the queue is empty (or the stream is gone).
fn next_job(h: usize) -> Option<*mut Op> {
    let mut ex = lock();
    loop {
        let all_held = ex.held;
        let s = ex.streams.get_mut(&h)?;
        if s.ops.is_empty() {
            return None;
        }
        let held = s.held || (all_held && s.kind == Kind::Created);
        if !held {
            if let Some(op) = s.ops.pop_front() {
                return Some(Box::into_raw(Box::new(op)));
            }
        }
        ex = CHANGED.wait(ex).unwrap_or_else(|e| e.into_inner());
    }
}

/// Runs and frees `job` (from [`next_job`]); a fault poisons the device.
fn run_job(job: *mut Op) {
    // SAFETY: `job` is a live box from `next_job`, freed below and nowhere else.
    let (dev, launch, graph) = unsafe {
        match &(*job).work {
            Work::Launch(l) => ((*job).dev, Some(ptr::from_ref(l)), None),
            Work::Graph(ls) => ((*job).dev, None, Some((ls.as_ptr(), ls.len()))),
            _ => ((*job).dev, None, None),
        }
    };
    if let Some((first, n)) = graph {
        for i in 0..n {
            // SAFETY: `first` points at the `n` launches of the graph the live job holds.
            let code = call_kernel(unsafe { first.add(i) });
            if code != CUDA_SUCCESS {
                // SAFETY: as above; `job` is not used again.
                let op = unsafe { Box::from_raw(job) };
                fault(dev, code, &op.what);
                return;
            }
        }
        // SAFETY: as above; `job` is not used again.
        drop(unsafe { Box::from_raw(job) });
        return;
    }
    let Some(l) = launch else {
        // SAFETY: as above; `job` is not used again.
        let op = unsafe { Box::from_raw(job) };
        run(*op);
        return;
    };
    // Nothing owned lives in this frame (or `call_kernel`'s) while the host kernel runs.
    let code = call_kernel(l);
    // SAFETY: as above; `job` is not used again.
    let op = unsafe { Box::from_raw(job) };
    if code != CUDA_SUCCESS {
        fault(dev, code, &op.what);
    }
}

/// Runs `op` on its stream's thread with no lock held; a fault poisons the device. (Launches
/// go through [`run_job`], which owns nothing while the host kernel runs.)
fn run(op: Op) {
    let dev = op.dev;
    let code = match op.work {
        Work::HtoD { dst, src, n } => {
            let from = match &src {
                Source::Host(p) => *p as *const u8,
                Source::Copied(v) => v.as_ptr(),
            };
            in_chunks(dst, n, dev, |to, at, len| {
                // SAFETY: `to` has `len` bytes of a live backing block behind it (checked under
                // the lock `in_chunks` holds); `from` is the fake's own `n`-byte copy, or a host
                // range the caller vouched for at call time (valid until the copy ran: a pinned
                // range, as for DMA, or the buffer of a synchronous call that waits for this
                // copy), and `at + len <= n`.
                unsafe { std::ptr::copy_nonoverlapping(from.add(at), to, len) };
            })
        }
        Work::DtoH { dst, src, n } => in_chunks(src, n, dev, |from, at, len| {
            // SAFETY: `from` has `len` bytes of a live backing block behind it (checked under
            // the lock `in_chunks` holds); `dst` was valid for `n` bytes per the enqueuing
            // caller, who must keep it so until the copy ran (a synchronous call waits for it),
            // and `at + len <= n`.
            unsafe { std::ptr::copy_nonoverlapping(from, (dst as *mut u8).add(at), len) };
        }),
        Work::Memset { dst, value, n } => in_chunks(dst, n, dev, |to, _, len| {
            // SAFETY: `to` has `len` bytes of a live backing block behind it (checked under the
            // lock `in_chunks` holds).
            unsafe { std::ptr::write_bytes(to, value, len) };
        }),
        Work::Launch(ref l) => call_kernel(l),
        Work::Graph(ref ls) => ls
            .iter()
            .map(|l| call_kernel(ptr::from_ref(l)))
            .find(|&c| c != CUDA_SUCCESS)
            .unwrap_or(CUDA_SUCCESS),
        Work::Wait(p) => {
            wait_until(|ex| ex.complete(p));
            CUDA_SUCCESS
        }
        Work::Stamp { event, records } => {
            let now = Instant::now();
            if let Some(ev) = lock()
                .events
                .get_mut(&event)
                .filter(|ev| ev.records == records)
            {
                ev.stamp = Some(now);
            }
            CUDA_SUCCESS
        }
    };
    if code != CUDA_SUCCESS {
        fault(dev, code, &op.what);
    }
}

/// The most bytes a copy or memset moves under one hold of the state lock: host calls made
/// while the stream works (a launch, a graph launch) wait for one chunk, not for the whole copy,
/// as they would not wait for a copy engine at all.
const CHUNK: usize = 16 << 10;

/// Runs `f(device pointer, offset, length)` over the `n` bytes of device memory at `addr`, a
/// chunk at a time, each translated and run under the state lock (so memory freed meanwhile is
/// an illegal address, never a dangling pointer); `CUDA_ERROR_ILLEGAL_ADDRESS` at the first chunk
/// that is not live memory of `dev`.
fn in_chunks(
    addr: u64,
    n: usize,
    dev: CUdevice,
    mut f: impl FnMut(*mut u8, usize, usize),
) -> CUresult {
    let mut at = 0;
    loop {
        let len = CHUNK.min(n - at);
        let ok = with_state(|st| {
            let Ok(p) = st.device_range(addr + at as u64, len as u64, dev) else {
                return false;
            };
            if len > 0 {
                f(p, at, len);
            }
            true
        });
        if !ok {
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        at += len;
        if at >= n {
            return CUDA_SUCCESS;
        }
        // A caller waiting for the lock takes it now (the lock is not fair).
        std::thread::yield_now();
    }
}

/// The host implementation registered for `l`'s entry.
fn kernel_of(l: &Launch) -> Option<(HostKernel, usize)> {
    let name = l.entry.to_string_lossy();
    let found = with_state(|st| st.kernels.get(name.as_ref()).copied());
    if found.is_none() {
        with_state(|st| {
            st.log.line(&format!(
                "fake_cuda exec {name}: no host implementation registered"
            ))
        });
    }
    found
}

/// Calls the host implementation of `l`'s entry; its result as a `CUresult`
/// (`CUDA_ERROR_LAUNCH_FAILED` without one). Holds no lock and owns nothing during the call.
fn call_kernel(l: *const Launch) -> CUresult {
    // SAFETY: `l` points at a launch its caller keeps alive for this call.
    let l = unsafe { &*l };
    let Some((f, user)) = kernel_of(l) else {
        return CUDA_ERROR_LAUNCH_FAILED;
    };
    let n = c_uint::try_from(l.params.len()).unwrap_or(c_uint::MAX);
    // SAFETY: `f` was registered as a `fake_cuda_host_kernel`; every pointer passed points at
    // data of `l`, alive for the call; no lock of the fake is held, so the function may call
    // `fake_cuda_translate` (or any control).
    let rc = unsafe {
        f(
            user as *mut c_void,
            l.entry.as_ptr(),
            l.params.as_ptr(),
            n,
            l.grid.as_ptr(),
            l.block.as_ptr(),
            l.shared,
        )
    };
    match rc {
        0 => CUDA_SUCCESS,
        CUDA_ERROR_ILLEGAL_ADDRESS => CUDA_ERROR_ILLEGAL_ADDRESS,
        _ => CUDA_ERROR_LAUNCH_FAILED,
    }
}

/// A device fault of `dev`: poisons its primary context (the first fault's code sticks; none
/// while the context is not retained), discards the work queued on its streams, logs it.
fn fault(dev: CUdevice, code: CUresult, what: &str) {
    with_state(|st| {
        let alive = st.retain_count(dev) > 0;
        if alive {
            st.poison.entry(dev).or_insert(code);
        }
        let discarded = lock().discard(dev);
        let note = if alive { "" } else { " (context gone)" };
        st.log.line(&format!(
            "fake_cuda fault dev={dev} {what} -> {code}{note}; {discarded} queued ops discarded"
        ));
    });
    notify();
}
