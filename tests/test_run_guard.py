"""The run cycle always finishes: whatever is raised where, the run is cleaned up and the worker
is free for the next one; and the worker lock never deadlocks against the GIL.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from _signals import ExternalSigint, interrupt_main_when

import simpler as sp

IN, OUT = sp.IN, sp.OUT


def _copy(x, y):
    y[...] = x


COPY = sp.Kernel(_copy, [IN, OUT])


def _orch_copy(o, x, y):
    o.submit(COPY, x, y)


def _works(w):
    """The worker runs a clean case correctly."""
    x = np.arange(32, dtype=np.float32)
    y = np.zeros_like(x)
    r = w.run(sp.Callable(_orch_copy, [IN, OUT]), [x, y])
    np.testing.assert_array_equal(y, x)
    assert r.ok


def _settled(w):
    s = w.stats()
    return s["live_allocations"], s["live_mappings"]


@pytest.mark.parametrize("where", ["orchestration", "kernel"])
def test_keyboard_interrupt_raised_in_a_run_leaves_the_worker_usable(where):
    def orch(o, x, y):
        if where == "orchestration":
            raise KeyboardInterrupt
        o.submit(sp.Kernel(lambda x, y: (_ for _ in ()).throw(KeyboardInterrupt), [IN, OUT]), x, y)

    with sp.Worker("sim", staging="fresh") as w:
        y = np.full(64, -1.0, np.float32)
        with pytest.raises(KeyboardInterrupt) as ei:
            w.run(sp.Callable(orch, [IN, OUT]), [np.ones(64, np.float32), y])
        if where == "kernel":
            assert any("in task 0 (kernel <lambda>)" in n for n in ei.value.__notes__)
        np.testing.assert_array_equal(y, -1.0)  # copy back was skipped
        assert _settled(w) == (0, 0)  # the fresh staging buffers were freed
        _works(w)


def test_sigint_during_a_large_bind_ends_the_run_and_leaves_the_worker_usable():
    """Ctrl+C while the native bind copies 512 MiB: the interrupt surfaces when bind returns,
    before the orchestration starts, and the run is cleaned up."""
    big = np.ones(128 << 20, np.float32)  # 512 MiB
    called = []

    def orch(o, x):
        called.append(True)

    with sp.Worker("sim", staging="fresh", poison=False) as w:
        for _attempt in range(5):
            started = threading.Event()
            # Sent just after the run starts; the block never lets it land outside this test.
            with interrupt_main_when(started.is_set) as ctrl_c:
                try:
                    started.set()
                    w.run(sp.Callable(orch, [IN]), [big])
                except KeyboardInterrupt:
                    pass
            if ctrl_c.interrupted and not called:
                break  # the interrupt landed in bind (else it came after the run: try again)
            called.clear()
        assert ctrl_c.interrupted and not called, "the interrupt never landed during bind"
        assert _settled(w) == (0, 0)  # the 512 MiB fresh staging buffer was freed
        _works(w)


def test_ctrl_c_during_a_huge_submit_many_is_answered_within_a_chunk():
    """A batch of 30 million tasks takes most of a second to record; Ctrl+C during it ends the
    call within a chunk of tasks (well before the batch's end), and the run is cleaned up."""
    n = 30_000_000
    per_task = np.arange(n, dtype=np.int64)
    k = sp.Kernel(lambda x, s: None, [IN], name="k")
    x = np.zeros(4, np.float32)
    timing = {}

    def orch(o, t, sig=None):
        if sig is not None:
            sig.start()
        start = time.perf_counter()
        try:
            o.submit_many(k, t, per_task)
        finally:
            timing["took"] = time.perf_counter() - start
        timing["completed"] = True

    with sp.Worker("sim") as w:
        # The whole batch, uninterrupted, in this process and on this machine's load.
        w.run(sp.Callable(orch, [IN]), [x])
        full = timing.pop("took")
        for _attempt in range(3):
            timing.clear()
            # A real Ctrl+C comes from outside the interpreter (a Python thread could not run
            # while the native call holds the GIL): another process sends it.
            with ExternalSigint(delay=0.1) as sig:
                try:
                    w.run(sp.Callable(lambda o, t: orch(o, t, sig), [IN]), [x])
                except KeyboardInterrupt:
                    pass
            # A signal that came after the batch (a slow start of the sender) proves nothing.
            if sig.interrupted and timing["took"] < 0.7 * full:
                break
        assert sig.interrupted, "the interrupt never landed during the batch"
        assert "completed" not in timing, "the batch was recorded to its end before the interrupt"
        assert timing["took"] < 0.7 * full, (timing["took"], full)
        assert w.debug_state()["busy"] is False
        _works(w)


def test_polling_stats_while_another_thread_closes_a_worker_with_20000_buffers(caplog):
    """`close` frees 20,000 buffers (and logs a warning) while another thread, holding the GIL
    between calls, polls `stats()`: both finish."""
    w = sp.Worker("sim")
    for _ in range(20_000):
        w.malloc(64)
    done = threading.Event()
    polls = []

    def poll():
        while not done.is_set():
            polls.append(w.stats()["live_allocations"])

    p = threading.Thread(target=poll)
    c = threading.Thread(target=lambda: (w.close(), done.set()))
    with caplog.at_level(logging.WARNING, logger="simpler"):
        p.start()
        c.start()
        c.join(60)
        done.set()
        p.join(60)
        assert not c.is_alive() and not p.is_alive(), "close or the poller hung"
        w.stats()  # the queued records are emitted by the next call into the library
    assert w.closed and polls
    assert w.stats()["live_allocations"] == 0
    msgs = [(r.name, r.getMessage()) for r in caplog.records]
    assert (
        "simpler.runtime.worker",
        "worker closed with 20000 live buffer(s) and 0 unreleased resident set(s); freed them",
    ) in msgs, msgs


def test_native_log_records_arrive_under_the_simpler_logger(caplog):
    """A large mirror's warning is emitted through Python logging, under simpler.runtime.*."""
    with sp.Worker("sim", svm="never") as w:
        buf = w.malloc(2 << 20)
        t = buf.tensor((1 << 19,), "float32")
        with caplog.at_level(logging.WARNING, logger="simpler"):
            w.run(sp.Callable(lambda o, t: o.get_tensor_data(t, 0), [IN]), [t])
        w.free(buf)
    rec = [r for r in caplog.records if "established a host mirror" in r.getMessage()]
    assert len(rec) == 1 and rec[0].name == "simpler.runtime.views", rec
    caplog.clear()
    logging.getLogger("simpler").setLevel(logging.ERROR)
    try:
        with sp.Worker("sim", svm="never") as w:
            buf = w.malloc(2 << 20)
            w.run(
                sp.Callable(lambda o, t: o.get_tensor_data(t, 0), [IN]), [buf.tensor((1 << 19,), "float32")]
            )
    finally:
        logging.getLogger("simpler").setLevel(logging.NOTSET)
    assert not [r for r in caplog.records if "established" in r.getMessage()]


def test_close_during_a_run_from_another_thread_ends_it():
    """The run in progress is ended by close; its next step reports it, and nothing leaks."""
    in_run = threading.Event()
    closed = threading.Event()
    errors = []

    def orch(o, x, y):
        in_run.set()
        assert closed.wait(30)
        o.submit(COPY, x, y)

    w = sp.Worker("sim", staging="fresh")

    def runner():
        try:
            w.run(sp.Callable(orch, [IN, OUT]), [np.ones(8, np.float32), np.zeros(8, np.float32)])
        except sp.StateError as e:
            errors.append(e)

    r = threading.Thread(target=runner)
    r.start()
    assert in_run.wait(30)
    c = threading.Thread(target=lambda: (w.close(), closed.set()))
    c.start()
    c.join(30)
    r.join(30)
    assert not r.is_alive() and not c.is_alive(), "a thread hung"
    assert len(errors) == 1 and "not in progress" in str(errors[0]), errors
    assert _settled(w) == (0, 0)


_DAEMON_AT_EXIT = """if True:
    import sys, threading, time, numpy as np, simpler as sp
    k = sp.Kernel(lambda x: time.sleep(0.001), [sp.IN], name="k")
    def orch(o, t):
        for _ in range(20):
            o.submit(k, t)
    big = np.zeros(64 << 20, np.uint8)  # bind copies 64 MiB without the GIL
    def loop(arg):  # runs back to back, on a worker of its own (a worker runs one at a time)
        w = sp.Worker("sim")
        while True:
            w.run(sp.Callable(orch, [sp.IN]), [arg])
    def copies(n):  # bulk copies without the GIL, back to back, on a worker of its own
        mine = sp.Worker("sim")
        buf, host = mine.malloc(n), np.zeros(n, np.uint8)
        while True:
            mine.copy_to(buf, host)
            mine.copy_from(host, buf)
    threading.Thread(target=loop, args=(np.zeros(1 << 20, np.float32),), daemon=True).start()
    threading.Thread(target=loop, args=(big,), daemon=True).start()
    threading.Thread(target=copies, args=(1 << 16,), daemon=True).start()
    threading.Thread(target=copies, args=(4 << 20,), daemon=True).start()
    time.sleep(float(sys.argv[1]))
    print("exiting", flush=True)
"""

#: The scenario's runs: the exit comes at a different point of the threads' work in each.
_EXIT_RUNS = 24


def test_the_process_exits_normally_with_daemon_threads_inside_runs():
    """Daemon threads in the middle of runs (in a kernel, in a bulk copy, taking the GIL back
    after one) when the interpreter exits: the process exits with status 0 (they must not take
    the GIL back during finalization, which would unwind through native frames and abort).
    The exit races the threads, so the scenario runs many times, exiting after a different
    delay each time, while another process keeps a core busy (so a thread can be descheduled
    between its exit check and taking the GIL back)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for i in range(_EXIT_RUNS):
            delay = f"{0.05 + 0.01 * (i * 7 % 25):.2f}"
            p = subprocess.run(
                [sys.executable, "-c", _DAEMON_AT_EXIT, delay], capture_output=True, text=True, timeout=120
            )
            assert (p.returncode, p.stdout.strip(), p.stderr) == (0, "exiting", ""), (i, p.stderr[-2000:])
    finally:
        busy.kill()
        busy.wait()


_HOOK_JOINS_A_DAEMON = """if True:
    import atexit, threading, time
    stop = threading.Event()
    threads = []

    def stop_workers():
        stop.set()
        for t in threads:
            t.join()
        print("joined", flush=True)

    atexit.register(stop_workers)  # before simpler is imported: it runs after simpler's hook
    import numpy as np, simpler as sp

    def loop():
        k = sp.Kernel(lambda a: time.sleep(0.001), [sp.IN], name="k")
        c = sp.Callable(lambda o, t: o.submit(k, t), [sp.IN])
        with sp.Worker("sim") as w:
            while not stop.is_set():
                w.run(c, [np.zeros(16, np.float32)])

    t = threading.Thread(target=loop, daemon=True)
    threads.append(t)
    t.start()
    time.sleep(0.3)
"""


def test_an_exit_hook_that_joins_a_daemon_thread_in_runs_still_returns():
    """A daemon thread in runs waits at exit for the interpreter to finalize (so it never takes
    the GIL back then); an exit hook that stops and joins it still gets it back (after a grace
    period), and the process exits normally."""
    p = subprocess.run(
        [sys.executable, "-c", _HOOK_JOINS_A_DAEMON], capture_output=True, text=True, timeout=60
    )
    assert (p.returncode, p.stdout.strip()) == (0, "joined"), p.stderr[-2000:]
