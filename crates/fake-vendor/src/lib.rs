//! What the fake vendor libraries share (test infrastructure, never shipped).
//!
//! The fakes (`crates/fake-ascend`, `crates/fake-cuda`) stand in for vendor drivers in CI. They
//! are only useful if they are at least as strict as the real thing, so the pieces here model
//! what real drivers do that a friendly test double would not:
//! * [`Heap`] hands out device addresses the way a caching device allocator does: a freed range
//!   is handed out again to the next allocation of the same size class (address reuse), so a
//!   handle kept past `free` really does alias a newer allocation. Addresses are either in a
//!   distinct, non-canonical range (a caller that dereferences one crashes) or, in
//!   [`AddressMode::Host`], equal to the host memory backing them (as on devices whose mapped
//!   host address equals the device address).
//! * [`Injections`]: the `nth` next call of a named function returns a given code.
//! * [`CallLog`]: one text line per call, for tests to read back.
//!
//! And the scaffolding every fake has: its state behind one mutex, made from the environment on
//! first use ([`Shared`], [`FakeState`], which also reads and reports settings), the bodies of
//! the control exports both fakes have (`*_inject`, `*_call_log`), the calling thread's current
//! context ([`current_ctx`]) and the numbering of context handles ([`Handles`]).

use std::alloc::{self, Layout};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, CStr};
use std::sync::Mutex;

/// Host memory standing in for one device allocation.
pub struct Backing {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: `Backing` owns its block exclusively; the fakes touch it only under their state mutex
// (or callers reach it through a mapping, as they would reach a device's memory).
unsafe impl Send for Backing {}

impl Backing {
    /// `len` (> 0) bytes aligned to `align` (a power of two), every byte `fill`.
    pub fn new(len: usize, align: usize, fill: u8) -> Option<Backing> {
        let layout = Layout::from_size_align(len.max(1), align).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` is a fresh block of `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(ptr, fill, layout.size()) };
        Some(Backing { ptr, layout })
    }

    /// The host address of the block.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc::alloc` with exactly `layout` and is freed once, here.
        unsafe { alloc::dealloc(self.ptr, self.layout) };
    }
}

/// How device addresses relate to the host memory behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressMode {
    /// A distinct range starting at the given base; dereferencing an address faults.
    Distinct(u64),
    /// The device address is the host address of the backing memory.
    Host,
}

/// One live allocation.
pub struct Block<T> {
    pub size: u64,
    pub mem: Backing,
    /// What the fake records about the allocation (its device, its page size, ...).
    pub meta: T,
}

/// Device memory: allocation, address reuse after free, address translation.
pub struct Heap<T> {
    mode: AddressMode,
    /// Whether freed addresses are handed out again (the default: real allocators do).
    pub reuse: bool,
    next: u64,
    /// Freed ranges by (span, alignment), most recently freed last.
    free: BTreeMap<(u64, u64), Vec<u64>>,
    live: BTreeMap<u64, Block<T>>,
}

/// Unmapped gap left after each allocation in a distinct range.
const GAP: u64 = 4096;

impl<T> Heap<T> {
    /// An empty heap.
    pub fn new(mode: AddressMode) -> Heap<T> {
        let next = match mode {
            AddressMode::Distinct(base) => base,
            AddressMode::Host => 0,
        };
        Heap {
            mode,
            reuse: true,
            next,
            free: BTreeMap::new(),
            live: BTreeMap::new(),
        }
    }

    /// The address mode.
    pub fn mode(&self) -> AddressMode {
        self.mode
    }

    /// Changes the address mode; only while nothing is live.
    pub fn set_mode(&mut self, mode: AddressMode) -> bool {
        if !self.live.is_empty() {
            return false;
        }
        *self = Heap {
            reuse: self.reuse,
            ..Heap::new(mode)
        };
        true
    }

    /// Allocates `size` (> 0) bytes aligned to `align` (a power of two >= 4096), filled with
    /// `fill`. `None` when the size does not fit the address space or host memory runs out.
    pub fn alloc(&mut self, size: u64, align: u64, fill: u8, meta: T) -> Option<u64> {
        let len = usize::try_from(size).ok()?;
        let mem = Backing::new(len, usize::try_from(align).ok()?, fill)?;
        let addr = match self.mode {
            AddressMode::Host => mem.ptr() as u64,
            AddressMode::Distinct(_) => {
                let span = size.checked_add(align - 1)? / align * align;
                let recycled = if self.reuse {
                    self.free.get_mut(&(span, align)).and_then(Vec::pop)
                } else {
                    None
                };
                match recycled {
                    Some(a) => a,
                    None => {
                        let a = self.next.checked_add(align - 1)? / align * align;
                        self.next = a.checked_add(span)?.checked_add(GAP)?;
                        a
                    }
                }
            }
        };
        self.live.insert(addr, Block { size, mem, meta });
        Some(addr)
    }

    /// Removes the allocation at `addr` (its base) and returns it; its address becomes free for
    /// reuse unless `keep_address` (a free the fake refuses to honour fully, e.g. of memory that
    /// is still mapped: the range stays reserved so a stale host pointer never aliases).
    pub fn remove(&mut self, addr: u64, align: u64, keep_address: bool) -> Option<Block<T>> {
        let b = self.live.remove(&addr)?;
        if let (AddressMode::Distinct(_), false) = (self.mode, keep_address) {
            let span = b.size.div_ceil(align) * align;
            self.free.entry((span, align)).or_default().push(addr);
        }
        Some(b)
    }

    /// The allocation containing `[addr, addr + len)`: its base, the host address of `addr` and
    /// the block. `None` when no allocation contains the whole range (a zero-length range must
    /// still start inside one).
    pub fn translate(&self, addr: u64, len: u64) -> Option<(u64, *mut u8, &Block<T>)> {
        let (&base, b) = self.live.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        if addr >= base + b.size || end > base + b.size {
            return None;
        }
        // SAFETY: `addr - base < b.size`, so the offset stays inside the backing block.
        let host = unsafe { b.mem.ptr().add((addr - base) as usize) };
        Some((base, host, b))
    }

    /// Live allocations by base address.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &Block<T>)> {
        self.live.iter().map(|(&a, b)| (a, b))
    }

    /// The allocation starting at `addr`.
    pub fn get(&self, addr: u64) -> Option<&Block<T>> {
        self.live.get(&addr)
    }

    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether nothing is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

struct Injection {
    name: String,
    remaining: u32,
    code: c_int,
}

/// Pending injected failures: the `nth` next call of a named function returns a code.
#[derive(Default)]
pub struct Injections(Vec<Injection>);

impl Injections {
    /// Arms one; `false` when `nth` is 0.
    pub fn push(&mut self, name: &str, nth: u32, code: c_int) -> bool {
        if nth == 0 {
            return false;
        }
        self.0.push(Injection {
            name: name.to_string(),
            remaining: nth,
            code,
        });
        true
    }

    /// Parses `name:nth:code[,name:nth:code...]` (the `*_INJECT` variables); returns the items
    /// it could not parse.
    pub fn parse(&mut self, spec: &str) -> Vec<String> {
        let mut bad = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let parts: Vec<&str> = item.split(':').collect();
            let ok = match parts.as_slice() {
                [name, nth, code] => match (nth.parse::<u32>(), code.parse::<c_int>()) {
                    (Ok(n), Ok(c)) => self.push(name, n, c),
                    _ => false,
                },
                _ => false,
            };
            if !ok {
                bad.push(item.to_string());
            }
        }
        bad
    }

    /// Counts one call of `name`; returns the code when an injection fires. Each fires once.
    pub fn take(&mut self, name: &str) -> Option<c_int> {
        let mut fired = None;
        for inj in self.0.iter_mut().filter(|i| i.name == name) {
            inj.remaining -= 1;
            if inj.remaining == 0 && fired.is_none() {
                fired = Some(inj.code);
            }
        }
        self.0.retain(|i| i.remaining > 0);
        fired
    }

    /// [`Injections::take`], logging a fired injection in `log` as `name args -> code
    /// (injected)`.
    pub fn take_logged(&mut self, log: &mut CallLog, name: &str, args: &str) -> Option<c_int> {
        let code = self.take(name)?;
        log.line(&format!("{name} {args} -> {code} (injected)"));
        Some(code)
    }

    /// Drops every pending injection.
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// One text line per call: `name args -> code`.
#[derive(Default)]
pub struct CallLog(String);

impl CallLog {
    /// Appends a line.
    pub fn line(&mut self, s: &str) {
        self.0.push_str(s);
        self.0.push('\n');
    }

    /// Logs a call and passes its code on.
    pub fn ret(&mut self, name: &str, args: &str, code: c_int) -> c_int {
        self.line(&format!("{name} {args} -> {code}"));
        code
    }

    /// Forgets every line.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Copies up to `cap` bytes of the log into `buf` (not NUL-terminated) and returns the
    /// log's full length.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `cap` bytes (or null).
    pub unsafe fn copy_out(&self, buf: *mut u8, cap: usize) -> usize {
        let n = self.0.len().min(cap);
        if n > 0 && !buf.is_null() {
            // SAFETY: `buf` holds `cap >= n` bytes per the caller; the log holds `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.0.as_ptr(), buf, n) };
        }
        self.0.len()
    }
}

/// Parses a boolean switch (`1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`).
pub fn parse_flag(v: &str) -> Option<bool> {
    match v.trim() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

/// A NUL-terminated C string argument as text (`None` for null).
///
/// # Safety
/// `p` must be null or a valid NUL-terminated string.
pub unsafe fn c_text(p: *const c_char) -> Option<String> {
    // SAFETY: non-null and NUL-terminated per the caller.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A fake library's state (see [`Shared`]).
pub trait FakeState: Sized + Send + 'static {
    /// The library's name in its messages (`fake-cuda`); its call log writes it with `_` for
    /// `-` (`fake_cuda config error: ...`).
    const NAME: &'static str;

    /// The state of a fresh process: defaults, then the environment's settings.
    fn from_env() -> Self;

    /// Pending injected failures.
    fn injections(&mut self) -> &mut Injections;

    /// The call log.
    fn log(&mut self) -> &mut CallLog;

    /// Reports a setting `what` that is invalid, and ignored: on stderr and in the call log.
    fn config_error(&mut self, what: &str) {
        eprintln!("{}: ignoring invalid {what}", Self::NAME);
        let line = format!("{} config error: {what}", Self::NAME.replace('-', "_"));
        self.log().line(&line);
    }

    /// Environment variable `name` read with `parse`: `None` when it is unset, or set to a value
    /// `parse` rejects (reported with [`FakeState::config_error`] as `name="value"`).
    fn env<T>(&mut self, name: &str, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
        let v = std::env::var(name).ok()?;
        let parsed = parse(&v);
        if parsed.is_none() {
            self.config_error(&format!("{name}={v:?}"));
        }
        parsed
    }

    /// Arms the injections environment variable `name` lists (`name:nth:code[,...]`, see
    /// [`Injections::parse`]); each item it cannot parse is reported.
    fn inject_from_env(&mut self, name: &str) {
        let Ok(v) = std::env::var(name) else {
            return;
        };
        for item in self.injections().parse(&v) {
            self.config_error(&format!("{name} item {item:?}"));
        }
    }
}

/// A fake's state behind one mutex, made from the environment ([`FakeState::from_env`]) on
/// first use, so a whole test run can be configured through it.
pub struct Shared<S>(Mutex<Option<S>>);

impl<S: FakeState> Shared<S> {
    /// No state yet.
    pub const fn new() -> Shared<S> {
        Shared(Mutex::new(None))
    }

    /// Runs `f` on the state, under the lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        // A panic while holding the lock cannot cross the C boundary (it would abort); treat a
        // poisoned lock as usable anyway.
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(guard.get_or_insert_with(S::from_env))
    }

    /// The control export `int <fake>_inject(const char *name, uint32_t nth, int32_t code)`:
    /// makes the `nth` (>= 1) next call of function `name` return `code`. 0, or -1 when `name`
    /// is null or `nth` is 0.
    ///
    /// # Safety
    /// `name` must be null or a valid NUL-terminated string.
    pub unsafe fn inject(&self, name: *const c_char, nth: u32, code: i32) -> c_int {
        // SAFETY: forwarded caller guarantee.
        let Some(name) = (unsafe { c_text(name) }) else {
            return -1;
        };
        if self.with(|st| st.injections().push(&name, nth, code)) {
            0
        } else {
            -1
        }
    }

    /// The control export `size_t <fake>_call_log(char *buf, size_t cap)`: copies up to `cap`
    /// bytes of the call log into `buf` and returns the log's full length (see
    /// [`CallLog::copy_out`]).
    ///
    /// # Safety
    /// `buf` must be valid for writes of `cap` bytes (or null).
    pub unsafe fn copy_log(&self, buf: *mut c_char, cap: usize) -> usize {
        // SAFETY: forwarded caller guarantee on `buf`.
        self.with(|st| unsafe { st.log().copy_out(buf.cast::<u8>(), cap) })
    }
}

impl<S: FakeState> Default for Shared<S> {
    fn default() -> Self {
        Shared::new()
    }
}

thread_local! {
    /// The calling thread's current context handle (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's current context handle (0: none). Per thread, as in the vendors'
/// runtimes; each fake library has its own.
pub fn current_ctx() -> usize {
    CURRENT.with(Cell::get)
}

/// Makes `ctx` the calling thread's current context handle (0: none).
pub fn set_current_ctx(ctx: usize) {
    CURRENT.with(|c| c.set(ctx));
}

/// Opaque handles numbered from a base (never dereferenced): number `i` is
/// `base + i * stride`, the same handle every time (a device's context, reused after a reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handles {
    base: usize,
    stride: usize,
}

impl Handles {
    /// Handles from `base`, `stride` (> 0) apart.
    pub const fn new(base: usize, stride: usize) -> Handles {
        Handles { base, stride }
    }

    /// The handle of number `i`.
    pub fn handle(self, i: usize) -> usize {
        self.base + i * self.stride
    }

    /// The number whose handle `h` is, if it is one.
    pub fn number(self, h: usize) -> Option<usize> {
        let off = h.checked_sub(self.base)?;
        off.is_multiple_of(self.stride).then_some(off / self.stride)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_addresses_are_reused_by_the_same_size_class() {
        let mut h: Heap<()> = Heap::new(AddressMode::Distinct(0x1000_0000));
        let a = h.alloc(100, 4096, 0, ()).unwrap();
        let b = h.alloc(5000, 4096, 0, ()).unwrap();
        assert_ne!(a, b);
        h.remove(a, 4096, false).unwrap();
        assert_eq!(h.alloc(4000, 4096, 0, ()), Some(a), "same span: reused");
        h.remove(b, 4096, true).unwrap();
        assert_ne!(
            h.alloc(5000, 4096, 0, ()),
            Some(b),
            "kept address: not reused"
        );
        h.reuse = false;
        h.remove(a, 4096, false).unwrap();
        assert_ne!(h.alloc(100, 4096, 0, ()), Some(a));
        let huge = h.alloc(3 << 20, 2 << 20, 0, ()).unwrap();
        assert_eq!(huge % (2 << 20), 0);
        let (base, _, blk) = h.translate(huge + 10, 5).unwrap();
        assert_eq!((base, blk.size), (huge, 3 << 20));
        assert!(h.translate(huge + (3 << 20) - 1, 2).is_none());
    }

    #[test]
    fn host_mode_addresses_are_the_backing_memory() {
        let mut h: Heap<u8> = Heap::new(AddressMode::Host);
        let a = h.alloc(64, 4096, 7, 1).unwrap();
        let (_, host, _) = h.translate(a, 64).unwrap();
        assert_eq!(host as u64, a);
    }

    /// A fake with nothing but the shared scaffolding.
    #[derive(Default)]
    struct Toy {
        injections: Injections,
        log: CallLog,
    }

    impl FakeState for Toy {
        const NAME: &'static str = "fake-toy";

        fn from_env() -> Toy {
            let mut t = Toy::default();
            t.inject_from_env("FAKE_VENDOR_TEST_INJECT");
            t
        }

        fn injections(&mut self) -> &mut Injections {
            &mut self.injections
        }

        fn log(&mut self) -> &mut CallLog {
            &mut self.log
        }
    }

    static TOY: Shared<Toy> = Shared::new();

    #[test]
    fn settings_are_read_from_the_environment_and_bad_ones_reported() {
        std::env::set_var("FAKE_VENDOR_TEST_INJECT", "f:2:5, oops");
        std::env::set_var("FAKE_VENDOR_TEST_N", " 7 ");
        std::env::set_var("FAKE_VENDOR_TEST_BAD", "x");
        let parse = |v: &str| v.trim().parse::<u32>().ok();
        TOY.with(|t| {
            assert_eq!(t.env("FAKE_VENDOR_TEST_N", parse), Some(7));
            assert_eq!(t.env("FAKE_VENDOR_TEST_BAD", parse), None);
            assert_eq!(t.env("FAKE_VENDOR_TEST_UNSET", parse), None);
            assert_eq!(t.injections.take("f"), None);
        });
        let (other, name) = (c"g".as_ptr(), c"f".as_ptr());
        // SAFETY: null, or NUL-terminated literals.
        unsafe {
            assert_eq!(TOY.inject(std::ptr::null(), 1, 1), -1);
            assert_eq!(TOY.inject(other, 0, 1), -1);
            assert_eq!(TOY.inject(name, 3, 6), 0);
        }
        TOY.with(|t| assert_eq!(t.injections.take("f"), Some(5)));
        let log = "fake_toy config error: FAKE_VENDOR_TEST_INJECT item \"oops\"\n\
                   fake_toy config error: FAKE_VENDOR_TEST_BAD=\"x\"\n";
        let mut buf = [0u8; 256];
        // SAFETY: `buf` holds 256 bytes.
        let n = unsafe { TOY.copy_log(buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(std::str::from_utf8(&buf[..n]), Ok(log));
    }

    #[test]
    fn handles_number_back_and_flags_parse() {
        let h = Handles::new(0xC000, 16);
        assert_eq!(h.handle(3), 0xC030);
        assert_eq!(h.number(0xC030), Some(3));
        assert_eq!(h.number(0xC031), None);
        assert_eq!(h.number(0xB000), None);
        assert_eq!(parse_flag(" off "), Some(false));
        assert_eq!(parse_flag("yes"), Some(true));
        assert_eq!(parse_flag("2"), None);
    }

    #[test]
    fn injections_fire_once_on_the_nth_call() {
        let mut i = Injections::default();
        assert_eq!(i.parse("a:2:5, b:x:1 ,c:1"), ["b:x:1", "c:1"]);
        assert_eq!(i.take("a"), None);
        assert_eq!(i.take("a"), Some(5));
        assert_eq!(i.take("a"), None);
        let mut log = CallLog::default();
        assert!(i.push("b", 2, 7));
        assert_eq!(i.take_logged(&mut log, "b", "0x10 8"), None);
        assert_eq!(
            log.0, "",
            "a call that does not fire is the caller's to log"
        );
        assert_eq!(i.take_logged(&mut log, "b", "0x10 8"), Some(7));
        assert_eq!(log.0, "b 0x10 8 -> 7 (injected)\n");
    }
}
