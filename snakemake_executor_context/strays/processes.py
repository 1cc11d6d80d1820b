"""Process work, written once: whether a pid lives, stopping a process tree, and what
a job leaves running.

Every part of the project that ends processes goes through here: a server stopping a
plain job's tree, the zygote killing the jobs it forked, the executor stopping local
jobs, the cluster process killing what is left below it, the catalog's lease and the
cluster's pid file asking whether their process still runs.

What a job leaves running (a double fork, ``setsid``, a child it never waited for)
does not outlive it. A server, its zygote and the process above them (the cluster's,
a pilot's nanny) are child subreapers (:func:`become_subreaper`, Linux): what a job
detaches is reparented to them instead of init, so it stays in their tree. Which
processes to end is a pure decision (:mod:`.decisions`); :func:`read_processes`
reads its facts from ``/proc`` and :func:`end_leftovers` carries it out: SIGTERM,
SIGKILL after a grace, and ``waitpid`` on the ended processes that are this process's
children, never on any other (``waitpid(-1)`` would steal the exit status of a child a
job still waits for). :data:`OWN` names the processes a server's own machinery started
(its zygote, gang ranks, what a context's loader started): never a job's leftovers.

Standard library at import time; ``psutil`` when a process tree is stopped.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from ..defaults import JOB_MARK_VARIABLE, KEEP_VARIABLE, SERVER_MARK_VARIABLE
from .decisions import ProcessFacts, span_leftovers

__all__ = [
    "OWN",
    "OwnProcesses",
    "TaskWatch",
    "become_subreaper",
    "end_leftovers",
    "facts_of",
    "has_ended_child",
    "is_subreaper",
    "kill_process_group",
    "pid_alive",
    "process_tree",
    "read_processes",
    "stop_processes",
    "stop_tree",
    "ticks_now",
]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not count; another user's does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def process_tree(pid: int) -> list[Any]:
    """Process ``pid`` and all its descendants (``psutil.Process``, descendants
    first); empty when it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [*root.children(recursive=True), root]
    except psutil.Error:
        return []


def stop_processes(
    processes: Iterable[Any], grace: float, *, wait: float = 0.0, reap: bool = True
) -> None:
    """Stop ``psutil.Process`` objects: SIGTERM, then SIGKILL what is still alive
    after ``grace`` seconds (``grace`` 0: SIGKILL at once); then wait up to ``wait``
    seconds for the killed ones to be gone. Processes already gone are skipped.
    Waiting reaps those that are this process's children (psutil waits on each pid);
    ``reap=False`` leaves them, as zombies, to whoever started them: a ``Popen``
    whose child another thread reaped reads exit status 0, a killed job as a success."""
    import psutil

    targets = list(processes)
    if grace > 0:
        for process in targets:
            try:
                process.terminate()
            except psutil.Error:
                pass
        if reap:
            _, targets = psutil.wait_procs(targets, timeout=grace)
        else:
            deadline = time.monotonic() + grace
            while (targets := [p for p in targets if _alive(p)]) and time.monotonic() < deadline:
                time.sleep(0.05)
    for process in targets:
        try:
            process.kill()
        except psutil.Error:
            pass
    if wait > 0 and targets:
        if reap:
            psutil.wait_procs(targets, timeout=wait)
        else:
            deadline = time.monotonic() + wait
            while any(_alive(p) for p in targets) and time.monotonic() < deadline:
                time.sleep(0.05)


def _alive(process: Any) -> bool:
    """Running and not a zombie (without waiting on it)."""
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def stop_tree(pid: int, grace: float, *, wait: float = 0.0) -> None:
    """Stop process ``pid`` and everything below it (see :func:`stop_processes`)."""
    stop_processes(process_tree(pid), grace, wait=wait)


def kill_process_group(pgid: int, signum: int = signal.SIGKILL) -> bool:
    """Send ``signum`` (SIGKILL unless told) to every process of process group ``pgid``.

    Never raises for a group that cannot be signalled: True when the signal was
    delivered, False when the group is gone (``ESRCH``) or is not this user's to
    signal (``EPERM``: its pid reused by another user's group, or only zombies
    left on some kernels). Other errors (an invalid signal) propagate."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --------------------------------------------------------------------------------------
# What a job leaves running: reading the facts, and carrying a decision out.


def ticks_now() -> int:
    """Now, in the clock ticks after boot in which ``/proc`` gives a process's start."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


#: ``pidfd_open``'s flag for a thread's pidfd (Linux 6.9), and ``waitid``'s for
#: children of every kind (a clone's too).
_PIDFD_THREAD = os.O_EXCL
_WALL = 0x40000000
_LAST_PID = "/proc/sys/kernel/ns_last_pid"


class TaskWatch:
    """Whether no process was started since: a proof, not a likelihood, in three
    small reads instead of a walk of every thread's children.

    The kernel hands out pids in turn and shows the last one handed out (``ns_last_pid``
    of this pid namespace, which every process below this one is in or below: a pid
    of a nested namespace is one here too). The same last pid later proves nothing by
    itself, since the pids come round (32,768 thread starts take a second), but a pid
    is not handed out again while its task lives: the same last pid, and its task
    alive all along (held by a pidfd), means no task, thread or process, was started
    in between. Only a privileged process that picks its pids (``clone3``'s
    ``set_tid``, a write of ``ns_last_pid``: CAP_CHECKPOINT_RESTORE) could start one
    unseen. Where no proof can be had (that task has already ended, no pidfds of
    threads before Linux 6.9), :meth:`none_since` says False."""

    def __init__(self) -> None:
        self._last = _last_pid()
        self._holder: int | None = None
        if self._last is None:
            return
        for flags in (0, _PIDFD_THREAD):
            try:
                self._holder = os.pidfd_open(self._last, flags)
                break
            except (OSError, AttributeError):
                continue
        if self._holder is not None and _last_pid() != self._last:
            self.close()  # a task started between the reads: the one held may be its

    def none_since(self) -> bool:
        """Whether no task was started since the watch began (still open: a watch
        that says so serves any later start too)."""
        holder = self._holder
        return holder is not None and _last_pid() == self._last and _lives(holder)

    def close(self) -> None:
        """Let go of the task held."""
        if self._holder is not None:
            os.close(self._holder)
            self._holder = None


def _last_pid() -> int | None:
    try:
        return int(_read(_LAST_PID))
    except ValueError:
        return None


def _lives(pidfd: int) -> bool:
    """Whether the task a pidfd refers to still holds its pid (a zombie does)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except PermissionError:  # another user's, alive
        return True
    except OSError:
        return False
    return True


def has_ended_child() -> bool:
    """Whether an ended child of this process waits to be reaped (a zombie), of any
    kind, asked without reaping it."""
    try:
        found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL)
    except ChildProcessError:
        return False
    return found is not None


def _stat(pid: int | str) -> tuple[int, bool, int, str] | None:
    """(ppid, zombie, start ticks, name) of a process; None when it is gone."""
    try:
        head, _, tail = _read(f"/proc/{pid}/stat").rpartition(b")")
        fields = tail.split()
        name = head.partition(b"(")[2].decode(errors="replace")
        return int(fields[1]), fields[0] == b"Z", int(fields[19]), name
    except (IndexError, ValueError):
        return None


def _read(path: str) -> bytes:
    """A small file of ``/proc`` (os.open: half the cost of open(), at every job's end)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        chunks = []
        while chunk := os.read(descriptor, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(descriptor)


def _below(
    root: int, pruned: Collection[tuple[int, int]]
) -> dict[int, tuple[int, bool, int, str]] | None:
    """The stats of the processes below ``root``, from the kernel's per-thread lists of
    children (``CONFIG_PROC_CHILDREN``), none of the ``pruned`` identities nor what is
    below them; None where there are no such lists."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        return None
    found: dict[int, tuple[int, bool, int, str]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            for child in map(int, _read(f"/proc/{pid}/task/{task}/children").split()):
                if child in found or (stat := _stat(child)) is None:
                    continue
                if (child, stat[2]) not in pruned:
                    found[child] = stat
                    todo.append(child)
    return found


#: A process in the middle of exec has its new name but not yet its arguments or its
#: environment: both read empty (a detached `sleep` just started by a job, seen in CI
#: as "[sleep]", its keep mark unread). Read again for at most this long.
_EXEC_SETTLES_SECONDS = 0.2


def _facts(pid: int, ppid: int, zombie: bool, started: int, name: str) -> ProcessFacts:
    command = _read(f"/proc/{pid}/cmdline")
    deadline = time.monotonic() + _EXEC_SETTLES_SECONDS
    kernel = ppid in (0, 2)  # kthreadd's threads have no arguments at all
    while not command and not zombie and not kernel and time.monotonic() < deadline:
        time.sleep(0.005)
        command = _read(f"/proc/{pid}/cmdline")
    command = command.replace(b"\0", b" ").strip()
    marks = {JOB_MARK_VARIABLE: "", SERVER_MARK_VARIABLE: "", KEEP_VARIABLE: ""}
    for entry in _read(f"/proc/{pid}/environ").split(b"\0"):
        name_, _, value = entry.decode(errors="replace").partition("=")
        if name_ in marks:
            marks[name_] = value
    return ProcessFacts(
        pid=pid,
        ppid=ppid,
        started=started,
        command=command.decode(errors="replace") or f"[{name}]",
        job=marks[JOB_MARK_VARIABLE],
        server=marks[SERVER_MARK_VARIABLE],
        keep=marks[KEEP_VARIABLE] not in ("", "0"),
        zombie=zombie,
    )


def facts_of(pid: int) -> ProcessFacts | None:
    """Process ``pid``'s facts; None when it is gone."""
    stat = _stat(pid) if sys.platform.startswith("linux") else None
    return _facts(pid, *stat) if stat is not None else None


def read_processes(
    root: int | None = None, pruned: Collection[tuple[int, int]] = ()
) -> list[ProcessFacts]:
    """The processes below ``root`` (itself excluded) or, ``root`` None, every
    process of this user but this one; empty where there is no ``/proc``. The
    ``pruned`` identities, and what is below them, are what the caller does not need
    (a server's own processes: its zygote and what it forked): where the kernel
    lists children they are neither read nor returned."""
    if not sys.platform.startswith("linux"):
        return []
    below = _below(root, pruned) if root is not None else None
    if below is not None:  # only the subtree's files: a node may run thousands
        return [_facts(pid, *stat) for pid, stat in sorted(below.items())]
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            table[int(entry)] = stat
    if root is not None:
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_) in table.items():
            children.setdefault(ppid, []).append(pid)
        chosen, todo = set(), list(children.get(root, ()))
        while todo:
            pid = todo.pop()
            if pid not in chosen:
                chosen.add(pid)
                todo.extend(children.get(pid, ()))
    else:
        uid = os.getuid()
        chosen = {pid for pid in table if pid != os.getpid() and _owner(pid) == uid}
    return [_facts(pid, *table[pid]) for pid in sorted(chosen)]


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def end_leftovers(processes: Sequence[ProcessFacts], grace: float) -> list[ProcessFacts]:
    """End these processes: SIGTERM, SIGKILL what still runs after ``grace`` seconds
    (then up to 5 s more). Those that are, or become, this process's children (an
    orphan reparented to it as its parent ends) are reaped, each by its pid; a zombie
    of another parent counts as ended. A pid that names another process by now (its
    start differs) is left alone. Returns those signalled, named as they run (a copy
    of this process forked a moment ago, named once it has exec'd)."""
    targets = [_after_exec(fact) for fact in processes if _gone(fact) is False]
    for signum, seconds in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = [fact for fact in targets if _gone(fact) is False]
        for fact in alive:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(fact.pid, signum)
        deadline = time.monotonic() + seconds
        while alive and time.monotonic() < deadline:
            time.sleep(0.01)
            alive = [fact for fact in alive if _gone(fact) is False]
        if not alive:
            break
    return targets


def _after_exec(fact: ProcessFacts) -> ProcessFacts:
    """The facts of a process that is still a copy of this one (forked, its exec not
    yet done: a job's double fork caught between the two, seen in CI named as the
    server) read again once it has exec'd, for at most :data:`_EXEC_SETTLES_SECONDS`;
    a fork that never execs (a multiprocessing child) keeps its name."""
    own = _read(f"/proc/{os.getpid()}/cmdline").replace(b"\0", b" ").strip()
    if not own or fact.command != own.decode(errors="replace"):
        return fact
    deadline = time.monotonic() + _EXEC_SETTLES_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.005)
        again = facts_of(fact.pid)
        if again is None or again.started != fact.started:
            return fact
        if again.command != fact.command:
            return again
    return fact


def _gone(fact: ProcessFacts) -> bool:
    """Whether that process is gone (reaping it if it is a zombie child of this one)."""
    stat = _stat(fact.pid)
    if stat is None or stat[2] != fact.started:
        return True
    ppid, zombie = stat[0], stat[1]
    if zombie and ppid == os.getpid():
        with suppress(ChildProcessError):
            os.waitpid(fact.pid, os.WNOHANG)  # this pid only, never any child
    return zombie


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): an
    orphan below it is reparented to it, not to init. Whether it is one."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    """Whether this process is a child subreaper (``PR_GET_CHILD_SUBREAPER``)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    flag = ctypes.c_int(0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(flag), 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return flag.value != 0


class OwnProcesses:
    """The processes this process's own machinery started (its zygote, gang ranks,
    what a context's loader started, by owner): a job's leftovers are never among
    them, nor below them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starting = threading.Lock()
        self._owners: dict[tuple[int, int], tuple[str, ProcessFacts]] = {}

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Held while the machinery starts a process and adds it, and while a sweep
        decides: a sweep never sees one of its processes between fork and :meth:`add`
        (its mark, if any, is not readable before its exec either)."""
        with self._starting:
            yield

    def add(self, pid: int, owner: str) -> None:
        """Process ``pid`` (started just now, by this process) belongs to ``owner``."""
        stat = _stat(pid)
        if stat is not None:
            fact = ProcessFacts(pid=pid, ppid=stat[0], started=stat[2], command=stat[3])
            with self._lock:
                if len(self._owners) > 256:  # forget those gone (a gang's ranks, per load)
                    for key, (_, old) in list(self._owners.items()):
                        if (found := _stat(old.pid)) is None or found[2] != old.started:
                            del self._owners[key]
                self._owners[fact.identity] = (owner, fact)

    def claim(self, since: int, owner: str) -> list[ProcessFacts]:
        """Give ``owner`` the processes below this one started at or after ``since``
        (clock ticks) that are no plain job's and no one else's; returns them."""
        with self._starting:
            found = read_processes(os.getpid(), self.identities())
        with self._lock:
            decided = span_leftovers(found, since, self._owners.keys(), os.getpid())
            new = [fact for fact in (*decided.end, *decided.kept) if not fact.zombie]
            for fact in new:
                self._owners[fact.identity] = (owner, fact)
        return new

    def identities(self) -> set[tuple[int, int]]:
        """Every owned process's identity."""
        with self._lock:
            return set(self._owners)

    def release(self, owner: str) -> list[ProcessFacts]:
        """Forget ``owner``'s processes; returns them (to end those still running)."""
        with self._lock:
            mine = [k for k, (who, _) in self._owners.items() if who == owner]
            return [self._owners.pop(key)[1] for key in mine]


#: This process's own processes.
OWN = OwnProcesses()
