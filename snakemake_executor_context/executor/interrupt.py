"""A Ctrl-C that Snakemake's main thread swallowed, raised again.

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
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["CtrlC"]


class CtrlC:
    """SIGINT in Snakemake's process, raised as ``KeyboardInterrupt``, and again if
    swallowed."""

    def __init__(self) -> None:
        self._pressed = False
        self._installed = False

    def install(self) -> None:
        """Take SIGINT, from the main thread, where its handler is Python's default
        (an ignored SIGINT, a background job's, stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True

    def uninstall(self) -> None:
        """Give SIGINT back to Python's default handler (the run is over)."""
        if self._installed and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            self._installed = False

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self._pressed = True
        raise KeyboardInterrupt

    def handled(self) -> None:
        """Snakemake acted on the press (it is cancelling the jobs)."""
        self._pressed = False

    def raise_if_swallowed(self) -> None:
        """In the main thread, as Snakemake hands a job over: a press nothing acted
        on is raised again."""
        if self._pressed:
            raise KeyboardInterrupt
