//! Streams and events, and the execution of device work.
//!
//! Every stream has a FIFO queue of operations. A background thread runs them in order; it is
//! started when the queue goes from idle to busy and sleeps the launch latency whenever work
//! arrives on an idle queue (`executor.rs`). Once the queue is empty it stays 20 ms, looking for
//! more work, and then ends: a stream fed round after round keeps its thread (queueing work costs
//! what a driver's call does, not a thread's start), and a fake left idle soon has no threads of
//! its own. Nothing holds the process open at exit (an exiting process ends a lingering thread,
//! which owns nothing and runs no code of ours but a wait), and the library is never unloaded
//! while one waits (it is opened once per process and never closed, by the driver's loader as by
//! ctypes). It is a plain, detached pthread, so a host kernel ended by `pthread_exit` (a Python
//! callback while the interpreter finalizes) ends just that thread instead of aborting the
//! process (see `executor::spawn`).
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
use std::ffi::{c_uint, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{CUdevice, CUresult, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_OUT_OF_MEMORY};

mod executor;

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
            if !executor::spawn(h) {
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
