"""Ctrl-C and SIGTERM where Snakemake's own handling does not reach: before its
scheduler runs (the DAG, the lock, the executor's start) and after its loop ends.

Snakemake takes its lock once the DAG is built and binds SIGTERM to its graceful stop
only once its scheduler has built the executor; the embedded cluster's start sits in
between. There SIGTERM's default action killed Snakemake outright and left its lock
(the plain rerun refused with ``LockException``), and a Ctrl-C anywhere outside the
scheduler's loop ended in Python's traceback of ``KeyboardInterrupt``. Here, from the
moment the executor's settings are built for Snakemake's command line:

- SIGTERM raises ``SystemExit(143)`` after one line: whatever runs unwinds, Snakemake's
  ``with persistence.lock()`` lets the lock go, the executor's start undoes what it
  made; once the start is done, SIGTERM is handed to the scheduler being built (the
  stop Snakemake's own handler makes, a moment before it binds it);
- a ``KeyboardInterrupt`` that reaches the top is one line, not a traceback (Python
  still ends the process as SIGINT does);
- a second signal while a stop unwinds is noted, not raised into the unwinding, and a
  Ctrl-C after the executor shut down is ignored: the process ends with the run, and a
  press there landed in Snakemake's last steps or the interpreter's exit as a traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from ..snakemake_internals import scheduler_being_built

__all__ = [
    "STOPPED_BY_CTRL_C",
    "CtrlC",
    "hand_sigterm_to_the_scheduler",
    "take_signals_before_the_run",
]

#: What a Ctrl-C that reached the top says (Snakemake's own loop says its own).
STOPPED_BY_CTRL_C = (
    "Context executor: stopped by Ctrl-C; nothing it started is left, and a plain rerun "
    "goes on from here."
)
_STOPPED_BY_SIGTERM = (
    "Context executor: stopped by SIGTERM before the run's jobs started; nothing it "
    "started is left, and a plain rerun goes on from here.\n"
)
#: The exit status of a process SIGTERM ended (128 + 15), as a shell reports it.
_SIGTERM_STATUS = 128 + signal.SIGTERM


#: Whether this process is one run, from its command line to its exit.
_whole_process: list[bool] = []


def take_signals_before_the_run() -> None:
    """SIGTERM (where it has its default action) raises ``SystemExit`` after one line,
    and an uncaught ``KeyboardInterrupt`` prints one line (main thread only; once).
    Called where this process is one run (Snakemake's command line)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _whole_process[:] = [True]
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    if not getattr(sys.excepthook, "one_line_interrupt", False):
        sys.excepthook = _one_line_interrupt(sys.excepthook)


def hand_sigterm_to_the_scheduler() -> None:
    """Once the executor has started: SIGTERM makes the graceful stop of the scheduler
    that is building it, as Snakemake's own handler does a moment later."""
    if threading.current_thread() is not threading.main_thread():
        return
    scheduler = scheduler_being_built()
    if scheduler is not None and signal.getsignal(signal.SIGTERM) == _terminate:
        signal.signal(signal.SIGTERM, scheduler.exit_gracefully)


def _terminate(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one waits for this stop
    os.write(2, _STOPPED_BY_SIGTERM.encode())  # no print: it may be printing now
    raise SystemExit(_SIGTERM_STATUS)


def _one_line_interrupt(
    previous: Callable[[type[BaseException], BaseException, TracebackType | None], Any],
) -> Callable[[type[BaseException], BaseException, TracebackType | None], Any]:
    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> Any:
        if issubclass(kind, KeyboardInterrupt):
            print(STOPPED_BY_CTRL_C, file=sys.stderr, flush=True)
            return None
        return previous(kind, value, tb)

    hook.one_line_interrupt = True  # type: ignore[attr-defined]
    return hook


class CtrlC:
    """SIGINT in Snakemake's process, raised as ``KeyboardInterrupt``, and again if
    swallowed.

    A Ctrl-C that Snakemake's main thread swallowed, raised again.

    Snakemake stops on Ctrl-C when its main thread sees ``KeyboardInterrupt``. Code in
    that thread that catches everything can swallow it: pulp's CBC call closes its pipe
    under a bare ``except:``, and Snakemake turns an interrupted resource evaluation into
    ``InputFunctionException``. The run then goes on as if nothing was pressed (seen once
    in about 120 Ctrl-C's at 2,000 ready jobs under the default scheduler). So the
    executor takes SIGINT itself, where its handler is Python's default one: the handler
    notes the press and raises ``KeyboardInterrupt`` as the default does. A scheduler
    that hands the executor a job after a press it never acted on has swallowed it: the
    executor raises it again there, in the main thread, in the middle of Snakemake's own
    scheduling (never in its handling of the first, which starts with cancelling the jobs).

    Once the run stops (its jobs are being cancelled, or the executor shuts down), a
    press is noted and not raised: a second Ctrl-C a moment after the first landed in
    the cancelling, inside the catalog's writes, as a second traceback, and left the
    run and two attempts without their ends.
    """

    def __init__(self) -> None:
        self._pressed = False
        self._installed = False
        self._stopping = False

    def install(self) -> None:
        """Take SIGINT, from the main thread, where its handler is Python's default
        (an ignored SIGINT, a background job's, stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True

    def uninstall(self) -> None:
        """Give SIGINT back to Python's default handler (the run is over), or, where
        the process ends with the run, ignore it until the exit (the interpreter's
        finalization gives a handler of its own SIGINT's default action back, which
        killed a run that had ended well: exit status -2)."""
        if self._installed and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) == self._on_sigint:
                ending = signal.SIG_IGN if _whole_process else signal.default_int_handler
                signal.signal(signal.SIGINT, ending)
            self._installed = False

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            return
        self._pressed = True
        raise KeyboardInterrupt

    def handled(self) -> None:
        """Snakemake acted on the press (it is cancelling the jobs): the run stops."""
        self._pressed = False
        self.stopping()

    def stopping(self) -> None:
        """The run stops: from now on a press changes nothing (the stop goes on)."""
        self._stopping = True

    def raise_if_swallowed(self) -> None:
        """In the main thread, as Snakemake hands a job over: a press nothing acted
        on is raised again."""
        if self._pressed:
            raise KeyboardInterrupt
