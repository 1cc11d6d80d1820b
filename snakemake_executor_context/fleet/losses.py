"""Why a server was lost, and what each loss costs the jobs it hit: pure functions.

A lost server costs at most the jobs it was running; they go back to the queue
without consuming Snakemake's ``--retries``. Each loss is classified from what is
known (:func:`classify`):

- a **preemption** is not the job's fault: an injected kill, SIGTERM from outside (a
  batch system's eviction), a server drained for that reason, a server whose
  heartbeat stopped (node or network loss), a server lost with nothing known;
- a **crash** may be: the server process exited by itself (``os._exit``, an
  uncaught error in a native library), died of SIGSEGV/SIGABRT/SIGBUS, or of a
  SIGKILL nobody announced (the kernel's OOM killer sends one);
- a **closed** server (retired, shut down) costs nothing.

What the cluster or batch system *said* (an injected kill, SIGTERM or SIGINT, a
drain on notice) is a preemption however often it hits a job. Any other loss is a
preemption only while no job explains it: a job that was running on each of N >= 2
servers lost without such a word explains them, and all N are its crashes
(:func:`charged`), whatever exit code each showed (a job that closes every descriptor,
``os.closerange(3, ...)``, or cuts its server's connection leaves none in time).

Every job has two budgets (:class:`Budgets`), one per kind; :class:`LossHistory`
charges them and says when one runs out, with a message naming the budget, the
servers, their exit codes and each attempt's log.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "BLACK_HOLE_STREAK",
    "DEFAULT_CRASH_BUDGET",
    "DEFAULT_PREEMPTION_BUDGET",
    "Budgets",
    "FailureStreaks",
    "LossCause",
    "LossHistory",
    "LossKind",
    "charged",
    "classify",
    "finishes_in_grace",
    "loss_line",
    "ran_there",
    "signal_name",
]

#: Preemptions a job may suffer when Snakemake's --preemptible-retries is not set.
DEFAULT_PREEMPTION_BUDGET = 10
#: Server crashes a job may cause before it fails.
DEFAULT_CRASH_BUDGET = 2

#: Signals that mean the process failed by itself (not killed from outside).
_CRASH_SIGNALS = {
    _signal.SIGSEGV,
    _signal.SIGABRT,
    _signal.SIGBUS,
    _signal.SIGFPE,
    _signal.SIGILL,
}


class LossKind(StrEnum):
    """Which budget a loss is charged to (closed: none)."""

    PREEMPTION = "preemption"
    CRASH = "crash"
    CLOSED = "closed"


@dataclass(frozen=True)
class LossCause:
    """A classified loss: its kind and a short reason ('injected SIGKILL'); ``said``:
    the cluster or batch system said it (an injected kill, SIGTERM or SIGINT, a drain
    on notice), never the job's doing."""

    kind: LossKind
    why: str
    exit_code: int | None = None
    signal: int | None = None
    said: bool = False

    def exit_text(self) -> str:
        """'killed by SIGKILL', 'exit code 3', or 'no exit code known'."""
        if self.signal is not None:
            return f"killed by {signal_name(self.signal)}"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return "no exit code known"


def signal_name(number: int) -> str:
    """'SIGKILL' for 9 (the number itself when unknown)."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify(
    *,
    expected: bool = False,
    exit_code: int | None = None,
    injected: int | None = None,
    heartbeat: bool = False,
    drained: str = "",
    drained_crash: bool = False,
    restarted: str = "",
) -> LossCause:
    """Classify a loss. ``exit_code``: the server process's, as the nanny saw it
    (negative: the signal that killed it); ``injected``: the signal an injector
    announced before it killed the server; ``heartbeat``: Dask removed the server
    for missing heartbeats; ``drained``: why the server drained before it left, and
    ``drained_crash``: whether that was a crash (a gang's rank that died by itself or
    of an unannounced SIGKILL); ``restarted``: why the plugin itself restarted it (a
    closure: nobody's fault)."""
    code = None if exit_code is None or exit_code < 0 else exit_code
    sig = -exit_code if exit_code is not None and exit_code < 0 else None
    if restarted:
        return LossCause(LossKind.CLOSED, f"restarted by the plugin ({restarted})", code, sig)
    if injected is not None:
        why = f"injected {signal_name(injected)}"
        sent = sig if sig is not None else injected
        return LossCause(LossKind.PREEMPTION, why, code, sent, said=True)
    if drained:
        kind = LossKind.CRASH if drained_crash else LossKind.PREEMPTION
        return LossCause(kind, f"drained ({drained})", code, sig, said=not drained_crash)
    if heartbeat:
        return LossCause(LossKind.PREEMPTION, "heartbeat lost (stopped or unreachable)", code, sig)
    if sig == _signal.SIGTERM or sig == _signal.SIGINT:
        why = f"{signal_name(sig)} from outside"
        return LossCause(LossKind.PREEMPTION, why, code, sig, said=True)
    if sig == _signal.SIGKILL:
        why = "SIGKILL of unknown origin (the OOM killer?)"
        return LossCause(LossKind.CRASH, why, code, sig)
    if sig is not None:
        kind = LossKind.CRASH if sig in _CRASH_SIGNALS else LossKind.PREEMPTION
        return LossCause(kind, f"died of {signal_name(sig)}", code, sig)
    if code is not None:
        if expected and code == 0:
            return LossCause(LossKind.CLOSED, "closed", code)
        return LossCause(LossKind.CRASH, f"exited by itself with code {code}", code)
    if expected:
        return LossCause(LossKind.CLOSED, "closed")
    return LossCause(LossKind.PREEMPTION, "lost (connection closed, no exit code known)")


def charged(causes: Sequence[LossCause]) -> list[LossCause]:
    """What each loss of servers a job was running on (in order) is charged as:
    what the cluster said stays as classified; the others, once there are two or
    more, are all the job's crashes, each saying why (nothing else explains them)."""
    unsaid = [c for c in causes if c.kind != LossKind.CLOSED and not c.said]
    if len(unsaid) < 2:
        return list(causes)
    why = f"lost with each of the {len(unsaid)} servers that ran it, none by the cluster's word"
    return [
        replace(c, kind=LossKind.CRASH, why=f"{c.why}; {why}")
        if c.kind == LossKind.PREEMPTION and not c.said
        else c
        for c in causes
    ]


@dataclass(frozen=True)
class Budgets:
    """How many losses of each kind a job may suffer; one more fails it."""

    preemptions: int = DEFAULT_PREEMPTION_BUDGET
    crashes: int = DEFAULT_CRASH_BUDGET

    @classmethod
    def resolve(
        cls, preemptions: int | None, crashes: int | None, preemptible_retries: int | None
    ) -> Budgets:
        """The settings' budgets; the preemption budget defaults to Snakemake's
        ``--preemptible-retries`` when set."""
        if preemptions is None:
            preemptions = (
                preemptible_retries
                if preemptible_retries is not None
                else DEFAULT_PREEMPTION_BUDGET
            )
        return cls(
            preemptions=max(0, preemptions),
            crashes=max(0, crashes if crashes is not None else DEFAULT_CRASH_BUDGET),
        )


@dataclass(frozen=True)
class _Loss:
    server: str
    cause: LossCause
    log: str


@dataclass
class LossHistory:
    """The losses one job suffered, in order."""

    losses: list[_Loss] = field(default_factory=list)

    def _charged(self) -> list[tuple[_Loss, LossCause]]:
        return list(zip(self.losses, charged([loss.cause for loss in self.losses]), strict=True))

    def count(self, kind: LossKind) -> int:
        """Losses charged to that kind so far."""
        return sum(1 for _, cause in self._charged() if cause.kind == kind)

    def charge(
        self,
        cause: LossCause,
        server: str,
        log: str,
        budgets: Budgets,
        title: str,
        ran: bool = True,
    ) -> str | None:
        """Record a loss; the job's failure message if this one exhausts a budget.
        An attempt that had not started there (``ran`` False) costs nothing."""
        if cause.kind == LossKind.CLOSED or not ran:
            return None
        self.losses.append(_Loss(server, cause, log))
        charges = self._charged()
        kind = charges[-1][1].kind
        if kind == LossKind.CRASH:
            allowed, flag = budgets.crashes, "--context-crash-budget"
        else:
            allowed, flag = budgets.preemptions, "--context-tuning preemption_budget"
        hits = [(loss, charge) for loss, charge in charges if charge.kind == kind]
        if len(hits) <= allowed:
            return None
        servers = "; ".join(f"{loss.server} ({charge.exit_text()})" for loss, charge in hits)
        logs = ", ".join(loss.log for loss in self.losses if loss.log) or "none kept"
        if kind == LossKind.CRASH:
            unsaid = any(loss.cause.kind == LossKind.PREEMPTION for loss, _ in hits)
            what = "crashed or was lost, with no word from the cluster," if unsaid else "crashed"
            head = (
                f"{title}: its server {what} while running it {len(hits)} time(s), more "
                f"than the crash budget of {allowed} ({flag})"
            )
            fix = (
                "Fix: read the attempts' logs; a job that kills its server or closes its "
                "connections (os._exit, os.closerange, a segfault in a native library, the "
                "OOM killer) fails here: give the rule more memory or fix the crash, or "
                "raise the budget."
            )
        else:
            head = (
                f"{title}: its server was preempted {len(hits)} time(s), more than the "
                f"preemption budget of {allowed} ({flag}, default --preemptible-retries)"
            )
            fix = (
                "Fix: split the job into shorter ones if it is long next to the time "
                "between preemptions, or raise the budget."
            )
        return f"{head}. Servers: {servers}. Logs of its attempts: {logs}. {fix}"

    def describe_charge(self, cause: LossCause, budgets: Budgets, ran: bool = True) -> str:
        """Which budget the last :meth:`charge` of this loss went to, in words."""
        if cause.kind == LossKind.CLOSED:
            return "not charged: its server closed"
        if not ran:
            return "not charged: it had not started there"
        kind = self._charged()[-1][1].kind
        allowed = budgets.crashes if kind == LossKind.CRASH else budgets.preemptions
        return f"charged to the {kind} budget ({self.count(kind)} of {allowed})"


def ran_there(
    keys: Sequence[str],
    started: Collection[str],
    server: Any,
    running: Sequence[str] | None = None,
) -> set[str]:
    """Of the attempts placed on a lost server (``keys``, in dispatch order), those
    that ran there. ``running``: what the server's own record on disk said it ran
    when it died (its nanny read it), when known: the truth. Else the ones seen
    starting, and as many others as its free slots could hold (a start not reported
    yet). The rest were queued behind a running job (placement sends one ahead to a
    warm server): placed again at no cost."""
    if running is not None:
        return set(keys) & set(running)
    ran = {key for key in keys if key in started}
    free = max(0, (getattr(server, "slots", 1) or 1) - len(ran))
    return ran | set([key for key in keys if key not in ran][:free])


def loss_line(
    server: str,
    cause: LossCause,
    jobs: list[str],
    placed: int = 0,
    fleet: tuple[int, int] = (0, 0),
) -> str:
    """The console's one line for a loss: server, why, which running jobs went back
    (and how many jobs queued there were placed again), and the fleet left when it
    is smaller than planned (``fleet``: servers left, servers planned)."""
    went = f"{len(jobs)} job(s) back to the queue: {', '.join(jobs)}" if jobs else "no job running"
    queued = placed - len(jobs)
    more = f" ({queued} queued there placed again)" if queued > 0 else ""
    left, planned = fleet
    size = f" Fleet: {left} of {planned} planned servers." if 0 <= left < planned else ""
    return f"Server {server} lost ({cause.kind}: {cause.why}); {went}{more}.{size}"


def finishes_in_grace(mean: float | None, elapsed: float, grace: float) -> bool:
    """Whether a draining server should finish a running job (else hand it back at
    once): its expected remaining time (the measured mean job time of its context
    there, minus what it ran) fits the grace period less 2 s. Unknown: hand back."""
    if mean is None:
        return False
    return mean - elapsed <= grace - 2.0


#: Failures in a row by the server's fault of one rule on one server, while others
#: succeed on it, that make the server a black hole.
BLACK_HOLE_STREAK = 3


@dataclass
class FailureStreaks:
    """Per rule, each server's failures in a row, and which servers succeeded: a
    server whose last ``k`` jobs of a rule failed by its fault while another server
    succeeded on that rule is a black hole (a broken GPU, a full disk): drain it. A
    job's own failure (its script's exception, the same on any server) is charged to
    the job: it neither counts nor breaks a streak."""

    k: int = BLACK_HOLE_STREAK
    _streak: dict[tuple[str, str], int] = field(default_factory=dict)
    _succeeded: dict[str, set[str]] = field(default_factory=dict)

    def record(self, rule: str, server: str, ok: bool, fault: str = "") -> str | None:
        """Fold in one job's end (``fault``: why its failure was the server's, '' if
        its own); why ``server`` is a black hole, if it now is."""
        if ok:
            self._streak[rule, server] = 0
            self._succeeded.setdefault(rule, set()).add(server)
            return None
        if not fault:
            return None
        self._streak[rule, server] = self._streak.get((rule, server), 0) + 1
        others = self._succeeded.get(rule, set()) - {server}
        if self._streak[rule, server] >= self.k and others:
            self._streak[rule, server] = 0
            return (
                f"black hole: its last {self.k} jobs of rule '{rule}' failed by its fault "
                f"({fault}) while {len(others)} other server(s) succeeded on it"
            )
        return None
