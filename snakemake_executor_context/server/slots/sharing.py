"""What concurrent in-process jobs of one group share, set up once for all of them.

With slots, several jobs run in one server process at once. cwd, the environment,
``sys.path``, ``sys.argv``, tempfile's directory, thread pools, the ``shell()``
defaults and the settings of :mod:`..processwide` (umask, rlimits) are process-global:
the slot gate (:mod:`.gate`) lets jobs overlap only when they agree on the first ones
(:func:`group_of`), and :class:`SharedGroup` sets them when the first job of a group
starts and restores them when its last one ends. The workflow's modules are forgotten
then too (:func:`..isolation.fresh_modules`), not while another job of the workflow
still uses them.

``sys.modules['__main__']`` is per job: while a group runs it is a module whose
attributes are those of the running job's own ``__main__`` (:class:`ThreadMain`), as
the thread asking (or the job thread that started it) sees it.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Callable, Collection, Hashable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from ...jobspec import ContextJobSpec
from ..isolation import fresh_modules, process_state, thread_limits
from ..output import current_job_output
from ..processwide import ProcessWide

__all__ = ["SharedGroup", "ThreadMain", "group_of", "job_main"]


def group_of(spec: ContextJobSpec) -> Hashable:
    """What jobs must agree on to run in one process at once."""
    return (
        spec.workdir,
        spec.script_path,
        spec.threads,
        tuple(sorted(spec.envvars.items())),
        tuple(spec.search_paths),
        spec.shell_exec,
    )


class SharedGroup:
    """The process state of the group of jobs running now (reference counted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs = 0
        self._stack: ExitStack | None = None
        self._group: Hashable | None = None
        self._paths = False
        self._unrestorable: list[str] = []

    @contextmanager
    def job(
        self,
        spec: ContextJobSpec,
        set_torch_threads: Callable[[int], Callable[[], None] | None] | None,
        owned_modules: Callable[[], Collection[str]],
    ) -> Iterator[None]:
        """The job's process state: set by the group's first job, restored by its
        last (the slot gate keeps other groups out meanwhile)."""
        group = group_of(spec)
        with self._lock:
            if self._jobs == 0:
                roots = [spec.workdir, os.path.dirname(spec.script_path), *spec.search_paths]
                stack = ExitStack()
                try:
                    stack.enter_context(fresh_modules(roots, owned_modules))
                    stack.enter_context(self._process_wide())
                    stack.enter_context(process_state(spec))
                    sys.argv[:] = [spec.script_path]
                    stack.enter_context(thread_limits(spec.threads, set_torch_threads))
                    stack.enter_context(_main_proxy())
                except BaseException:
                    stack.close()
                    raise
                self._stack, self._group, self._paths = stack, group, False
            elif group != self._group:  # the gate never lets this happen
                raise RuntimeError("jobs of two groups in one server process at once")
            self._jobs += 1
        try:
            yield
        finally:
            with self._lock:
                self._jobs -= 1
                if self._jobs == 0 and self._stack is not None:
                    stack, self._stack, self._group = self._stack, None, None
                    stack.close()

    @contextmanager
    def _process_wide(self) -> Iterator[None]:
        saved = ProcessWide.now()
        saved.for_a_job()
        try:
            yield
        finally:
            self._unrestorable.extend(saved.restore())

    def take_unrestorable(self) -> list[str]:
        """What the group's jobs changed for the whole process that could not be put
        back (:meth:`.ProcessWide.restore`): the server must restart."""
        with self._lock:
            lost, self._unrestorable = self._unrestorable, []
        return lost

    def add_search_paths(self, spec: ContextJobSpec) -> None:
        """What the script preamble appends to ``sys.path``, once for the group, when
        its first script is about to run (after its context loaded: a loader imports
        from the server's environment, not from the submitting process's paths)."""
        with self._lock:
            if not self._paths:
                sys.path.extend(spec.search_paths)
                self._paths = True


# --------------------------------------------------------------------------------------
# __main__, per job.

_mains: dict[object, types.ModuleType] = {}
_mains_lock = threading.Lock()


#: The process's own __main__, for threads of no job (the server's).
_fallback: list[types.ModuleType] = []


def _own_main() -> types.ModuleType | None:
    owner = current_job_output()
    with _mains_lock:
        found = _mains.get(owner) if owner is not None else None
        return found if found is not None else (_fallback[0] if _fallback else None)


class ThreadMain(types.ModuleType):
    """``sys.modules['__main__']`` while jobs run: the asking job's own module."""

    def __getattribute__(self, name: str) -> Any:
        target = _own_main()
        if target is None:
            return types.ModuleType.__getattribute__(self, name)
        return getattr(target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        target = _own_main()
        if target is None:
            types.ModuleType.__setattr__(self, name, value)
        else:
            setattr(target, name, value)

    def __dir__(self) -> list[str]:
        target = _own_main()
        return dir(target) if target is not None else []


@contextmanager
def _main_proxy() -> Iterator[None]:
    saved = sys.modules.get("__main__")
    _fallback[:] = [saved] if saved is not None else []
    sys.modules["__main__"] = ThreadMain("__main__")
    try:
        yield
    finally:
        _fallback.clear()
        if saved is not None:
            sys.modules["__main__"] = saved


@contextmanager
def job_main(module: types.ModuleType) -> Iterator[None]:
    """Make ``module`` the ``__main__`` the calling job's threads see."""
    owner = current_job_output()
    if owner is None:  # not under a job's output routing (a direct call in tests)
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = module
        try:
            yield
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved
        return
    with _mains_lock:
        _mains[owner] = module
    try:
        yield
    finally:
        with _mains_lock:
            _mains.pop(owner, None)
