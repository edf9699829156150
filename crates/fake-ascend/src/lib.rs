//! A fake Ascend vendor library, for tests only (never shipped): the `acl*` runtime, the older
//! `rt*` runtime and the HAL's `halHostRegister` / `halHostUnregister` / `halMemCtl`, with their
//! exact C signatures (the CANN headers `acl/acl_rt.h`, `runtime/rt.h`, `runtime/context.h` and
//! the driver's `ascend_hal.h`), backed by host memory.
//!
//! Tests symlink `libascendcl.so`, `libruntime.so` and `libascend_hal.so` to this one file, so the
//! three "libraries" share one instance and one state (the dynamic loader identifies a file by its
//! inode). A directory without `libascendcl.so` exercises a driver's `rt*` fallback.
//!
//! What it models, and why — a fake is only useful if it is at least as strict as the runtime:
//! * **ACL initialization is reference-counted.** `aclInit` adds a reference (answering
//!   REPEAT_INITIALIZE after the first), `aclFinalizeReference` removes one and finalizes at zero,
//!   and `aclFinalize` tears ACL down whatever the count: after it every `acl*` call of every user
//!   in the process fails with UNINITIALIZE.
//! * **Devices and contexts.** `aclrtSetDevice` / `rtSetDevice` add a reference to the device's
//!   default context and make it the calling thread's current context; `aclrtResetDevice` /
//!   `rtDeviceReset` remove one, and at zero the context is destroyed. As in the runtime, a
//!   device's default context object is reused: setting the device again after a reset gives the
//!   same handle back, alive again. The current context is
//!   per thread: a thread that never bound one has none, and memory calls then fail with
//!   CONTEXT_NULL (107002). `aclrtSetCurrentContext` / `rtCtxSetCurrent` bind an existing context
//!   without counting. Each allocation records the device of the context current when it was
//!   made; freeing, copying or setting it while another device's context is current fails
//!   (stricter than the runtime, on purpose: it means a driver lost track of its context).
//! * **Device ids.** Users name devices by user id; `ASCEND_RT_VISIBLE_DEVICES` renumbers them
//!   (read once, by the runtime's rules: entries up to the first bad or non-ascending one); the
//!   HAL and `aclrtGetLogicDevIdByUserDevId` speak logical ids.
//! * **HAL mappings.** `halHostRegister` wants a page-aligned device pointer (2 MiB for huge-page
//!   allocations) inside one allocation, refuses overlapping registrations (PARA_ERROR) and
//!   answers NOT_SUPPORT where the host cannot map the allocation's pages (map modes below).
//!   A registration is keyed by the `devid` it was made with, as in the driver: unregistering
//!   with another id answers NOT_EXIST and leaves the mapping registered (leaked). The host's
//!   mapping window (the BAR) can be given a budget in bytes (`FAKE_ASCEND_BAR`): a registration
//!   past it answers OUT_OF_MEMORY, the resource answer of the driver. A free of a still-mapped allocation is a violation: it is logged with
//!   `STILL-MAPPED`, succeeds, and keeps the memory (and its address) alive, so the stale host
//!   pointer stays harmless.
//! * **Sticky device errors.** A runtime call that answers a device-fault code (507010,
//!   507013-507018, 507053, 507054, 507899; here only by injection) poisons its device: every later runtime call on it answers that first
//!   code, until the device's last reference is given back (its teardown clears it).
//! * **Lifecycle costs.** Nothing sleeps, but the expensive lifecycle events are counted and
//!   priced (`fake_ascend_lifecycle`): initializing ACL (the first `aclInit`), opening a device
//!   (its first reference), tearing it down (its last reset) and finalizing ACL (the last
//!   `aclFinalizeReference`, or `aclFinalize`, which waits for the device log flush, up to
//!   `ASCEND_LOG_DEVICE_FLUSH_TIMEOUT` = 2000 ms by default). The prices are assumed orders of
//!   magnitude except the flush timeout (CANN's documented default); what a benchmark compares
//!   is how many of each event a workload causes.
//! * **Addresses.** Device addresses come from a distinct, non-canonical range
//!   (`0xa5c0_0000_0000_0000` upward), so a caller that dereferences one crashes, and a freed
//!   address is handed out again to the next allocation of the same size, as the runtime's
//!   allocator does. In `host` address mode a device address is the host address of its backing
//!   memory, so a mapping's host pointer equals the device address (as on A2/A3 hosts).
//!
//! Configuration, read from the environment on first use (so a whole pytest run can be
//! configured) and changeable through the exported control functions ([`control`]):
//! * `FAKE_ASCEND_MAP`: which `halHostRegister` calls succeed — `always` (default), `never`
//!   (NOT_SUPPORT), `min:<bytes>` (allocations smaller than that are refused with NOT_SUPPORT),
//!   `pages` (ordinary-page allocations are refused, huge-page ones granted, as on a 64 KiB-page
//!   host; an allocation is huge-page when its policy is huge-only, or huge-first and larger than
//!   1 MiB), `stubnull` (return 0 and leave the out pointer untouched, like the toolkit's stub).
//! * `FAKE_ASCEND_DEVICES`: number of logical devices (default 8).
//! * `ASCEND_RT_VISIBLE_DEVICES`: the runtime's renumbering of user ids.
//! * `FAKE_ASCEND_REUSE` (default on): `0` stops freed addresses from being reused.
//! * `FAKE_ASCEND_ADDRESSES`: `distinct` (default) or `host`.
//! * `FAKE_ASCEND_INJECT=name:nth:code[,name:nth:code...]`: the `nth` next call of the named
//!   function returns `code` without doing anything (a 507xxx code on a runtime call also
//!   poisons the current device, see above).
//! * `FAKE_ASCEND_BAR`: bytes the HAL can map at once (default: unlimited).

use std::collections::BTreeMap;
use std::ffi::c_int;

use fake_vendor::{
    current_ctx, parse_flag, set_current_ctx, AddressMode, Backing, CallLog, FakeState, Handles,
    Heap, Injections, Shared,
};

pub mod control;
mod device;
pub mod hal;
pub mod runtime;

/// First device address handed out: non-canonical on x86-64 and outside aarch64 user space.
const DEV_BASE: u64 = 0xa5c0_0000_0000_0000;
/// Page size of ordinary device memory, and the alignment of every allocation.
const PAGE: u64 = 4096;
/// Alignment of huge-page allocations (a 2 MiB chunk).
const HUGE_PAGE: u64 = 2 << 20;
/// Huge-page-first allocations larger than this get huge pages (as the CANN runtime does).
const HUGE_THRESHOLD: u64 = 1 << 20;
/// Byte written into fresh allocations (device memory is not zeroed).
const FILL: u8 = 0xCD;
/// Default context handles: device `d`'s is number `d`, the same object again after a reset
/// (the runtime reuses it). Opaque handles, never dereferenced.
const CONTEXTS: Handles = Handles::new(0xC7A0_0000, 16);

/// Modeled lifecycle costs, in nanoseconds (see the module docs): the first `aclInit`, a
/// device's first reference, its last reset, and the finalize at the last ACL reference (the
/// device log flush wait, `ASCEND_LOG_DEVICE_FLUSH_TIMEOUT`'s default).
const ACL_INIT_NS: u64 = 100_000_000;
const DEVICE_OPEN_NS: u64 = 500_000_000;
const DEVICE_RESET_NS: u64 = 100_000_000;
const FINALIZE_NS: u64 = 2_000_000_000;

/// Lifecycle events (see [`Lifecycle`]).
#[derive(Debug, Clone, Copy, Default)]
struct Lifecycle {
    acl_inits: u64,
    device_opens: u64,
    device_resets: u64,
    finalizes: u64,
}

impl Lifecycle {
    /// The modeled cost of the events so far.
    fn ns(&self) -> u64 {
        self.acl_inits * ACL_INIT_NS
            + self.device_opens * DEVICE_OPEN_NS
            + self.device_resets * DEVICE_RESET_NS
            + self.finalizes * FINALIZE_NS
    }
}

/// Whether a runtime code is a device fault that poisons the device (the 507xxx device-fault
/// codes of `acl/error_codes/rt_error_codes.h`: lost heartbeat, DMA, AI Core and AI CPU
/// timeouts and exceptions, device memory and ECC errors, the driver's internal error; not the
/// generic 507000 internal error).
fn is_sticky(code: c_int) -> bool {
    matches!(
        code,
        507_010 | 507_013..=507_018 | 507_053 | 507_054 | 507_899
    )
}

const ACL_SUCCESS: c_int = 0;
const ACL_ERROR_INVALID_PARAM: c_int = 100_000;
const ACL_ERROR_UNINITIALIZE: c_int = 100_001;
const ACL_ERROR_REPEAT_INITIALIZE: c_int = 100_002;
const ACL_ERROR_REPEAT_FINALIZE: c_int = 100_037;
const ACL_ERROR_RT_PARAM_INVALID: c_int = 107_000;
const ACL_ERROR_RT_INVALID_DEVICEID: c_int = 107_001;
const ACL_ERROR_RT_CONTEXT_NULL: c_int = 107_002;
const ACL_ERROR_RT_MEMORY_ALLOCATION: c_int = 207_001;

const DRV_ERROR_INVALID_DEVICE: c_int = 2;
const DRV_ERROR_INVALID_VALUE: c_int = 3;
const DRV_ERROR_OUT_OF_MEMORY: c_int = 6;
const DRV_ERROR_PARA_ERROR: c_int = 8;
const DRV_ERROR_NOT_EXIST: c_int = 11;
const DRV_ERROR_NOT_SUPPORT: c_int = 0xfffe;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapMode {
    Always,
    Never,
    Min(u64),
    Pages,
    StubNull,
}

fn parse_map(s: &str) -> Option<MapMode> {
    match s.trim() {
        "always" => Some(MapMode::Always),
        "never" => Some(MapMode::Never),
        "pages" => Some(MapMode::Pages),
        "stubnull" => Some(MapMode::StubNull),
        other => other
            .strip_prefix("min:")
            .and_then(|n| n.trim().parse().ok())
            .map(MapMode::Min),
    }
}

fn parse_addresses(s: &str) -> Option<AddressMode> {
    match s.trim() {
        "distinct" => Some(AddressMode::Distinct(DEV_BASE)),
        "host" => Some(AddressMode::Host),
        _ => None,
    }
}

/// The user → logical renumbering of `ASCEND_RT_VISIBLE_DEVICES`, read the way the runtime does:
/// each comma-separated entry is the number its leading digits spell (what follows them is
/// ignored: "5x" is 5), up to the first entry that does not start with a digit or is past the
/// device count; a descending or repeated entry makes the whole variable invalid (no device
/// visible).
fn parse_visible(list: &str, devices: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = Vec::new();
    for item in list.split(',') {
        let digits = item.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            break;
        }
        match item[..digits].parse::<u32>() {
            Ok(id) if id < devices => {
                if ids.contains(&id) || ids.last().is_some_and(|&l| id < l) {
                    return Vec::new();
                }
                ids.push(id);
            }
            _ => break,
        }
    }
    ids
}

/// The handle of logical device `dev`'s default context.
fn ctx_of(dev: u32) -> usize {
    CONTEXTS.handle(dev as usize)
}

/// What the fake records about an allocation.
struct Meta {
    /// Logical device of the context current at allocation.
    device: u32,
    huge: bool,
}

struct Mapping {
    size: u64,
    /// The `devid` the registration was made with (its key in the driver).
    devid: u32,
}

#[derive(Debug, Clone, Copy)]
enum HugePolicy {
    HugeFirst,
    HugeOnly,
    NormalOnly,
}

struct State {
    map_mode: MapMode,
    devices: u32,
    /// User id -> logical id (`None`: identity).
    visible: Option<Vec<u32>>,
    heap: Heap<Meta>,
    mappings: BTreeMap<u64, Mapping>,
    /// Memory of allocations freed while still mapped: kept so the stale host pointer stays valid.
    leaked: Vec<Backing>,
    injections: Injections,
    log: CallLog,
    violations: u64,
    /// `aclInit` references (0: not initialized).
    acl_refs: u64,
    /// Device references (set minus reset) by logical device; a device's context is alive
    /// while its count is above zero.
    device_refs: BTreeMap<u32, u64>,
    /// The first device fault of each poisoned device (cleared by its teardown).
    poisoned: BTreeMap<u32, c_int>,
    /// Bytes the HAL may map at once (`None`: unlimited).
    bar_budget: Option<u64>,
    lifecycle: Lifecycle,
    /// Allocations the runtime freed because their device's last reference was given back
    /// while they were live (a driver that frees before it resets leaves this at 0).
    reset_freed: u64,
}

static STATE: Shared<State> = Shared::new();

impl FakeState for State {
    const NAME: &'static str = "fake-ascend";

    fn from_env() -> State {
        let mut st = State {
            map_mode: MapMode::Always,
            devices: 8,
            visible: None,
            heap: Heap::new(AddressMode::Distinct(DEV_BASE)),
            mappings: BTreeMap::new(),
            leaked: Vec::new(),
            injections: Injections::default(),
            log: CallLog::default(),
            violations: 0,
            acl_refs: 0,
            device_refs: BTreeMap::new(),
            poisoned: BTreeMap::new(),
            bar_budget: None,
            lifecycle: Lifecycle::default(),
            reset_freed: 0,
        };
        st.apply_env();
        st
    }

    fn injections(&mut self) -> &mut Injections {
        &mut self.injections
    }

    fn log(&mut self) -> &mut CallLog {
        &mut self.log
    }
}

impl State {
    fn apply_env(&mut self) {
        self.map_mode = MapMode::Always;
        self.devices = 8;
        self.heap.reuse = true;
        if let Some(m) = self.env("FAKE_ASCEND_MAP", parse_map) {
            self.map_mode = m;
        }
        if let Some(n) = self.env("FAKE_ASCEND_DEVICES", |v| v.trim().parse().ok()) {
            self.devices = n;
        }
        self.bar_budget = None;
        if let Some(n) = self.env("FAKE_ASCEND_BAR", |v| v.trim().parse().ok()) {
            self.bar_budget = Some(n);
        }
        let devices = self.devices;
        self.visible = std::env::var("ASCEND_RT_VISIBLE_DEVICES")
            .ok()
            .map(|v| parse_visible(&v, devices));
        if let Some(on) = self.env("FAKE_ASCEND_REUSE", parse_flag) {
            self.heap.reuse = on;
        }
        if let Some(m) = self.env("FAKE_ASCEND_ADDRESSES", parse_addresses) {
            if m != self.heap.mode() && !self.heap.set_mode(m) {
                self.config_error("FAKE_ASCEND_ADDRESSES with live allocations");
            }
        }
        self.inject_from_env("FAKE_ASCEND_INJECT");
    }

    /// Logs a call and returns its code.
    fn ret(&mut self, name: &str, args: &str, code: c_int) -> c_int {
        self.log.ret(name, args, code)
    }

    /// An injected failure for this call of `name`, if one is due (logged). A device fault
    /// (507xxx) poisons the calling thread's current device.
    fn injected(&mut self, name: &str, args: &str) -> Option<c_int> {
        let code = self.injections.take_logged(&mut self.log, name, args)?;
        if is_sticky(code) {
            if let Ok(dev) = self.current_device() {
                self.poisoned.entry(dev).or_insert(code);
                self.log
                    .line(&format!("fake_ascend fault {code} poisons device {dev}"));
            }
        }
        Some(code)
    }

    /// The current device, unless it is poisoned (then its first fault): the gate of every
    /// runtime call that works on the device.
    fn usable_device(&self) -> Result<u32, c_int> {
        let dev = self.current_device()?;
        match self.poisoned.get(&dev) {
            Some(&code) => Err(code),
            None => Ok(dev),
        }
    }

    /// Total bytes mapped now.
    fn mapped_bytes(&self) -> u64 {
        self.mappings.values().map(|m| m.size).sum()
    }

    /// The logical id of user device `user`, if it is visible and exists.
    fn logical(&self, user: i32) -> Option<u32> {
        let user = u32::try_from(user).ok()?;
        let id = match &self.visible {
            None => user,
            Some(ids) => *ids.get(user as usize)?,
        };
        (id < self.devices).then_some(id)
    }

    /// The logical device whose context `ctx` is, while that context is alive.
    fn live_context(&self, ctx: usize) -> Option<u32> {
        let dev = u32::try_from(CONTEXTS.number(ctx)?).ok()?;
        let alive = self.device_refs.get(&dev).copied().unwrap_or(0) > 0;
        alive.then_some(dev)
    }

    /// The device of the calling thread's current context, or CONTEXT_NULL.
    fn current_device(&self) -> Result<u32, c_int> {
        self.live_context(current_ctx())
            .ok_or(ACL_ERROR_RT_CONTEXT_NULL)
    }

    /// `[addr, addr + len)` inside one live allocation of device `dev`: the host address of
    /// `addr`. `Err` carries a log suffix (a wrong-device access is counted as a violation).
    fn device_range(&mut self, addr: u64, len: u64, dev: u32) -> Result<*mut u8, String> {
        let Some((_, host, block)) = self.heap.translate(addr, len) else {
            return Err(String::new());
        };
        if block.meta.device != dev {
            let owner = block.meta.device;
            self.violations += 1;
            return Err(format!(
                " WRONG-DEVICE(alloc dev={owner}, current dev={dev})"
            ));
        }
        Ok(host)
    }
}

/// Runs `f` on the fake's state (made from the environment on first use), under its lock.
fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(parse_map("always"), Some(MapMode::Always));
        assert_eq!(parse_map("min:4096"), Some(MapMode::Min(4096)));
        assert_eq!(parse_map("stubnull"), Some(MapMode::StubNull));
        assert_eq!(parse_map("pages"), Some(MapMode::Pages));
        assert_eq!(parse_map("min:x"), None);
        assert_eq!(parse_map("sometimes"), None);
        assert_eq!(parse_visible("4,5,x,7", 8), [4, 5]);
        assert_eq!(parse_visible("4,5,9,7", 8), [4, 5]);
        assert!(parse_visible("2,5,3", 8).is_empty());
        assert!(parse_visible("4, 5", 8) == [4]);
        assert_eq!(
            parse_visible("4,5x", 8),
            [4, 5],
            "trailing characters are ignored"
        );
        assert!(parse_visible("", 8).is_empty());
        assert_eq!(parse_addresses("host"), Some(AddressMode::Host));
    }
}
