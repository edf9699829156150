"""A hypothesis state machine over Worker / ResidentTaskArgs / run, checked against a model.

Random sequences of malloc, copy_to, copy_from, free, resident add / release, runs of a small
callable (one device tensor — a user buffer or a resident tensor — read whole and written by the
orchestrator, a staged input, a staged output, a staged output no task writes, optionally a
scratch intermediate), runs with an
injected fault, and trims of the staging arena. The model holds every buffer's contents (fresh
allocations are poison on sim) and what should be live; after every step:

* live allocations = the caller's buffers + resident tensors + the arena + the scratch pool;
* live mappings = mapped host views; views never outnumber allocations;
* replaying the driver call log: every free matches a live allocation, no address is freed twice;

and the contents the device reports (copy_from, orchestrator reads) match the model; memory no
task wrote in a run (the unwritten staged output, a scratch tensor before its task) is poison, in
every run. Example and
step counts come from the hypothesis profile (tests/conftest.py, ``HYPOTHESIS_PROFILE``).
"""

from __future__ import annotations

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT
POISON = np.frombuffer(bytes([0xA5] * 4), np.int32)[0]
CODE = 507_333
SCRATCH_CHUNK = 1 << 20  # bytes of a scratch pool chunk (no other allocation here is that large)
SIZES = st.sampled_from([1, 3, 16, 100, 16384])  # int32 elements; 16384 = 64 KiB (mapped at svm=65536)
STAGED = st.sampled_from([1, 5, 64, 20000])


def _values(data, n):
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return np.random.default_rng(seed).integers(-1000, 1000, n, dtype=np.int32)


def _k_direct(dev, x, out):
    out[...] = x * 2 + dev[0]
    dev += 1


def _k_double(x, tmp):
    tmp[...] = x * 2


def _k_finish(tmp, dev, out):
    out[...] = tmp + dev[0]
    dev += 1


K_DIRECT = sp.Kernel(_k_direct, [INOUT, IN, OUT])
K_DOUBLE = sp.Kernel(_k_double, [IN, OUT])
K_FINISH = sp.Kernel(_k_finish, [IN, INOUT, OUT])


class WorkerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.w = None
        self.steps = 0
        self.buffers = {}  # key -> [Buffer, model int32 array]
        self.sets = []  # [ResidentTaskArgs, {name: [DeviceTensor, model int32 array]}]
        self.scratch = 0  # chunks in the scratch pool
        self.names = 0
        self.log_seen = 0
        self.log_live = {}
        self.log_freed = set()

    # -- set-up / teardown --
    @initialize(
        svm=st.sampled_from(["always", "never", "65536"]), staging=st.sampled_from(["arena", "fresh"])
    )
    def open(self, svm, staging):
        self.w = sp.Worker("sim", svm=svm, staging=staging)
        # Start with one buffer and one resident tensor, so every rule is enabled from step one.
        self.malloc(16)
        self.open_set()
        res, entries = self.sets[0]
        entries["t0"] = [res.add("t0", np.arange(16, dtype=np.int32), INOUT), np.arange(16, dtype=np.int32)]

    def teardown(self):
        if self.w is None:
            return
        event(f"invariant checks: {self.steps // 10 * 10}-{self.steps // 10 * 10 + 9}")
        for res, _ in self.sets:
            res.release()
        for buf, _ in self.buffers.values():
            self.w.free(buf)
        self.w.trim_staging()
        s = self.w.stats()
        assert (s["live_allocations"], s["live_mappings"]) == (0, 0)
        assert tuple(self.w.debug_state()["views"].values()) == (0, 0, 0)
        self.w.close()
        self.check_log()
        assert not self.log_live

    # -- buffers --
    @rule(n=SIZES)
    def malloc(self, n):
        buf = self.w.malloc(4 * n)
        self.buffers[buf.ptr] = [buf, np.full(n, POISON, np.int32)]

    @precondition(lambda self: self.buffers)
    @rule(data=st.data())
    def copy_to(self, data):
        buf, model = self.buffers[data.draw(st.sampled_from(sorted(self.buffers)), label="buffer")]
        off = data.draw(st.integers(0, model.size - 1), label="offset")
        vals = _values(data, data.draw(st.integers(1, model.size - off), label="count"))
        self.w.copy_to(buf, vals, offset=4 * off)
        model[off : off + vals.size] = vals

    @precondition(lambda self: self.buffers)
    @rule(data=st.data())
    def copy_from(self, data):
        buf, model = self.buffers[data.draw(st.sampled_from(sorted(self.buffers)), label="buffer")]
        got = np.empty_like(model)
        self.w.copy_from(got, buf)
        np.testing.assert_array_equal(got, model)

    @precondition(lambda self: self.buffers)
    @rule(data=st.data())
    def free(self, data):
        key = data.draw(st.sampled_from(sorted(self.buffers)), label="buffer")
        self.w.free(self.buffers.pop(key)[0])

    # -- resident sets --
    @precondition(lambda self: len(self.sets) < 4)
    @rule()
    def open_set(self):
        self.sets.append((sp.ResidentTaskArgs(self.w), {}))

    @precondition(lambda self: self.sets)
    @rule(data=st.data(), n=SIZES, direction=st.sampled_from([IN, OUT, INOUT]))
    def resident_add(self, data, n, direction):
        res, entries = data.draw(st.sampled_from(self.sets), label="set")
        self.names += 1
        name = f"t{self.names}"
        host = _values(data, n)
        t = res.add(name, host, direction)
        entries[name] = [t, np.full(n, POISON, np.int32) if direction is OUT else host.copy()]
        host[:] = 0  # the fixture was consumed: changing it changes nothing on the device

    @precondition(lambda self: any(e for _, e in self.sets))
    @rule(data=st.data())
    def resident_contents(self, data):
        _, entries = data.draw(st.sampled_from([s for s in self.sets if s[1]]), label="set")
        t, model = entries[data.draw(st.sampled_from(sorted(entries)), label="name")]
        got = np.empty_like(model)
        self.w.copy_from(got, t.buffer)
        np.testing.assert_array_equal(got, model)

    @precondition(lambda self: self.sets)
    @rule(data=st.data())
    def release(self, data):
        i = data.draw(st.integers(0, len(self.sets) - 1), label="set")
        res, _ = self.sets.pop(i)
        res.release()
        res.release()  # idempotent

    # -- runs --
    def _device_tensors(self):
        out = [(buf.tensor((m.size,), "int32"), m) for buf, m in self.buffers.values()]
        for _, entries in self.sets:
            out.extend((t, m) for t, m in entries.values())
        return out

    def _run(self, data, fault):
        cands = self._device_tensors()
        dev, model = cands[data.draw(st.integers(0, len(cands) - 1), label="device tensor")]
        m = data.draw(STAGED, label="staged elements")
        x = _values(data, m)
        x_before = x.copy()
        out = np.full(m, 7, np.int32)
        j = data.draw(st.integers(0, model.size - 1), label="write index")
        s = int(data.draw(st.integers(-1000, 1000), label="written value"))
        scratch = data.draw(st.booleans(), label="scratch")
        expect = model.copy()

        def orchestrate(o, d, xs, os_, spare):
            np.testing.assert_array_equal(o.read_tensor(d), expect)  # mapping or (refreshed) mirror
            assert o.get_tensor_data(d, j) == expect[j]
            o.set_tensor_data(d, j, s)
            if scratch:
                tmp = o.scratch([m], "int32", name="tmp")
                # Never written yet in this run, whatever an earlier run left in the pool.
                assert o.get_tensor_data(tmp, m - 1) == POISON
                o.submit(K_DOUBLE, xs, tmp)
                o.submit(K_FINISH, tmp, d, os_)
            else:
                o.submit(K_DIRECT, d, xs, os_)

        call = sp.Callable(orchestrate, [INOUT, IN, OUT, OUT], name="step")
        spare = np.full(m, 7, np.int32)  # a staged output no task writes
        log0 = len(self.w.call_log())
        if fault:
            op = data.draw(st.sampled_from(["alloc", "h2d", "d2h", "map", "memset"]), label="fault op")
            self.w.inject_fault(op, nth=data.draw(st.integers(1, 4), label="nth"), code=CODE)
        try:
            self.w.run(call, [dev, x, out, spare])
        except sp.DeviceError as e:
            assert fault and e.code == CODE, str(e)
            failed = True
        else:
            failed = False
        finally:
            self.w.clear_faults()
        new = self.w.call_log()[log0:]
        fired = any(c[3] == CODE for c in new)
        assert fired == failed, "an injected fault fired without an error (or the reverse)"
        event("run: failed on its injected fault" if failed else "run: succeeded")
        np.testing.assert_array_equal(x, x_before)  # a staged IN array is never written
        if any(c[0] == "alloc" and c[2] == SCRATCH_CHUNK and c[3] == 0 for c in new):
            self.scratch = 1
        if failed:
            # What the failed run left on the device is not modelled: read it back, then the next
            # run checks that its host view (mapping or mirror) agrees with those bytes.
            self.w.copy_from(model, dev.buffer)
            return
        model[j] = s
        np.testing.assert_array_equal(out, x * 2 + model[0])
        np.testing.assert_array_equal(spare, POISON)  # never-written memory shows, every run
        model += 1

    @precondition(lambda self: self._device_tensors())
    @rule(data=st.data())
    def run(self, data):
        self._run(data, fault=False)

    @precondition(lambda self: self._device_tensors())
    @rule(data=st.data())
    def run_with_a_fault(self, data):
        self._run(data, fault=True)

    @rule()
    def trim_staging(self):
        self.w.trim_staging()
        self.scratch = 0
        assert self.w.debug_state()["arena"] is None

    # -- invariants --
    def check_log(self):
        log = self.w.call_log()
        for op, addr, _n, code, _phase in log[self.log_seen :]:
            if code != 0:
                continue
            if op == "alloc":
                self.log_live[addr] = True
            elif op == "free":
                assert addr in self.log_live, f"free of {addr:#x}, which is not live"
                assert addr not in self.log_freed, f"{addr:#x} freed twice"
                del self.log_live[addr]
                self.log_freed.add(addr)
        self.log_seen = len(log)

    @invariant()
    def nothing_leaks(self):
        if self.w is None:
            return
        self.steps += 1
        s = self.w.stats()
        resident = sum(len(e) for _, e in self.sets)
        arena = 1 if self.w.debug_state()["arena"] else 0
        assert s["live_allocations"] == len(self.buffers) + resident + arena + self.scratch
        mapped, mirrored, refused = tuple(self.w.debug_state()["views"].values())
        assert mapped == s["live_mappings"]
        assert mapped + mirrored + refused <= s["live_allocations"]
        self.check_log()
        assert len(self.log_live) == s["live_allocations"]


TestWorkerMachine = WorkerMachine.TestCase
