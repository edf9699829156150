"""Signals a test sends to itself or to its children, which never land outside that test.

A test that checks what Ctrl+C (or a killed child) does has to send the signal while the code
under test is inside the call it aims at. Sent by a timer, it can come too late: when the call
ended early for another reason, the SIGINT lands in whatever pytest runs next, and pytest takes
it for the user's Ctrl+C and abandons the whole session. So here:

* the signal is sent when a condition says the code is where it should be (a child wrote its
  marker file), not after a guessed delay;
* the block's end cancels a signal not yet sent, and waits for the sender, so nothing is sent
  once the block has ended;
* a SIGINT sent to this process is counted by a handler of the block's own (it raises
  ``KeyboardInterrupt`` as Python's default handler does), and one that has not surfaced by the
  block's end is taken there, so it cannot surface in a later test: the block then fails with
  :class:`LateSignal` instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType


class LateSignal(AssertionError):
    """The SIGINT was sent, but surfaced only after the code it was aimed at had finished."""


class _CountingSigint:
    """Python's default SIGINT behaviour (raise ``KeyboardInterrupt``), counting deliveries."""

    def __init__(self) -> None:
        self.delivered = 0

    def __call__(self, signum, frame):
        self.delivered += 1
        raise KeyboardInterrupt


class SignalWhen:
    """Sends a signal (``send()``) once ``ready()`` holds, from a thread of its own, at most once,
    and never after the ``with`` block ends. ``sigint_here`` says that ``send`` interrupts this
    process (its main thread), so the block takes the SIGINT over (see the module docs).

    ``sent`` says whether the signal went out; ``interrupted`` whether a SIGINT to this process
    surfaced inside the block."""

    def __init__(
        self,
        send: Callable[[], None],
        ready: Callable[[], bool],
        *,
        sigint_here: bool = False,
        timeout: float = 120.0,
    ) -> None:
        self._send = send
        self._ready = ready
        self._sigint_here = sigint_here
        self._timeout = timeout
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-signal", daemon=True)
        self._handler = _CountingSigint()
        self._previous = None
        self.sent = False

    @property
    def interrupted(self) -> bool:
        return self._handler.delivered > 0

    def _run(self) -> None:
        end = time.monotonic() + self._timeout
        while not self._stop.is_set() and time.monotonic() < end:
            if self._ready():
                with self._lock:
                    if not self._stop.is_set():
                        self._send()
                        self.sent = True
                return
            self._stop.wait(0.005)

    def __enter__(self) -> SignalWhen:
        if self._sigint_here:
            assert threading.current_thread() is threading.main_thread(), "SIGINT goes to the main thread"
            self._previous = signal.signal(signal.SIGINT, self._handler)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with self._lock:
            self._stop.set()
        self._thread.join()
        late = False
        if self._sigint_here:
            try:
                if self.sent and not self.interrupted:
                    # The signal was sent after the block's code had finished: it surfaces at the
                    # next check of the interpreter, which must be here, not in a later test.
                    end = time.monotonic() + 10.0
                    while not self.interrupted and time.monotonic() < end:
                        time.sleep(0.001)
            except KeyboardInterrupt:
                late = True
            finally:
                signal.signal(signal.SIGINT, self._previous)
        if late and exc_type is None:
            raise LateSignal("the SIGINT surfaced only after the code it was aimed at had finished")
        return False


def interrupt_main_when(ready: Callable[[], bool]) -> SignalWhen:
    """Ctrl+C for the main thread (SIGINT through ``pthread_kill``) once ``ready()`` holds."""
    main = threading.main_thread().ident
    assert main is not None
    return SignalWhen(lambda: signal.pthread_kill(main, signal.SIGINT), ready, sigint_here=True)


def kill_when(pid: int, ready: Callable[[], bool], signum: int = signal.SIGKILL) -> SignalWhen:
    """``signum`` (SIGKILL) to process ``pid`` once ``ready()`` holds."""
    return SignalWhen(lambda: os.kill(pid, signum), ready)


def marker_exists(path: Path | str) -> Callable[[], bool]:
    """A ``ready`` condition: ``path`` exists (a child writes it when it is where the test wants)."""
    p = Path(path)
    return p.exists


class ExternalSigint:
    """Ctrl+C from outside the interpreter, for a native call that holds the GIL (no Python
    thread could run meanwhile): another process sends SIGINT to this one ``delay`` seconds after
    :meth:`start`. Use it as a ``with`` block around the call, with :meth:`start` right before
    the call. The sender always sends; the block's end waits for it and takes a SIGINT that has
    not surfaced yet (see the module docs): ``interrupted`` says whether it surfaced inside the
    block, ``late`` whether it surfaced only at the block's end (the call had finished first)."""

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._handler = _CountingSigint()
        self._previous = None
        self._sender: subprocess.Popen[bytes] | None = None
        self.late = False

    @property
    def interrupted(self) -> bool:
        return self._handler.delivered > 0 and not self.late

    def __enter__(self) -> ExternalSigint:
        assert threading.current_thread() is threading.main_thread(), "SIGINT goes to the main thread"
        self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def start(self) -> None:
        """Starts the sender (the delay runs from here)."""
        self._sender = subprocess.Popen(["sh", "-c", f"sleep {self._delay}; kill -INT {os.getpid()}"])

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            if self._sender is not None:
                rc = self._sender.wait(60)
                assert rc == 0, f"the SIGINT sender failed ({rc})"
                end = time.monotonic() + 10.0
                while self._handler.delivered == 0 and time.monotonic() < end:
                    time.sleep(0.001)
        except KeyboardInterrupt:
            self.late = True
        finally:
            signal.signal(signal.SIGINT, self._previous)
        return False


class SignalsInTurn:
    """Ctrl+C for the main thread once per condition, in turn: the first SIGINT once
    ``readies[0]()`` holds, the next once ``readies[1]()`` holds, and so on; from a thread of its
    own, never after the ``with`` block ends (a condition not reached by then sends nothing).
    Every SIGINT is counted by a handler of the block's own, and one sent but not surfaced by
    the block's end is taken there (then :class:`LateSignal`), as with :class:`SignalWhen`.

    ``sent`` is how many went out, ``delivered`` how many surfaced inside the block."""

    def __init__(self, *readies: Callable[[], bool], timeout: float = 120.0) -> None:
        self._readies = readies
        self._timeout = timeout
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-signals", daemon=True)
        self._handler = _CountingSigint()
        self._previous = None
        self._main = threading.main_thread().ident
        self.sent = 0

    @property
    def delivered(self) -> int:
        return self._handler.delivered

    def _run(self) -> None:
        end = time.monotonic() + self._timeout
        for ready in self._readies:
            while not ready():
                if self._stop.is_set() or time.monotonic() > end:
                    return
                self._stop.wait(0.005)
            with self._lock:
                if self._stop.is_set():
                    return
                assert self._main is not None
                signal.pthread_kill(self._main, signal.SIGINT)
                self.sent += 1

    def __enter__(self) -> SignalsInTurn:
        assert threading.current_thread() is threading.main_thread(), "SIGINT goes to the main thread"
        self._previous = signal.signal(signal.SIGINT, self._handler)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with self._lock:
            self._stop.set()
        self._thread.join()
        late = False
        end = time.monotonic() + 10.0
        try:
            while True:  # every SIGINT sent surfaces here at the latest, each one taken
                try:
                    while self.delivered < self.sent and time.monotonic() < end:
                        time.sleep(0.001)
                    break
                except KeyboardInterrupt:
                    late = True
        finally:
            signal.signal(signal.SIGINT, self._previous)
        if late and exc_type is None:
            raise LateSignal("a SIGINT surfaced only after the code it was aimed at had finished")
        return False
