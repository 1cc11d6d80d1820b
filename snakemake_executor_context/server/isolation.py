"""What an in-process job may change in the server process, and how it is undone.

A job sees what Snakemake's script preamble gives it in a fresh interpreter; nothing
it changes in the process (cwd, environment, ``sys.path``, ``sys.modules['__main__']``,
``sys.argv``, stdout/stderr, thread pools, tempfile's directory, the ``shell()``
defaults) outlives it, and modules imported from the workflow's own files (its
script directory, workdir and the preamble's search paths) are forgotten after the
job (:func:`fresh_modules`), so each job imports the helper it sees on disk. Modules
first imported while a context was loading live as long as that context (a loaded
model keeps its own classes). What is *not* isolated: globals of installed modules
(site-packages, the standard library), like the loaded context itself; threads and
open files a job leaves behind are reported and kept out of other jobs' logs
(:mod:`.output`), not stopped.
"""

from __future__ import annotations

import importlib
import os
import site
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from ..jobspec import ContextJobSpec

__all__ = [
    "THREAD_VARIABLES",
    "TMPDIR_VARIABLES",
    "forget_modules_since",
    "fresh_modules",
    "is_installed",
    "is_workflow_module",
    "new_local_modules",
    "process_state",
    "thread_limits",
    "torch_threads",
]

#: What Snakemake's shell() sets for a script subprocess (snakemake/shell.py).
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
TMPDIR_VARIABLES = ("TMPDIR", "TMP", "TEMPDIR", "TEMP")


@contextmanager
def process_state(spec: ContextJobSpec) -> Iterator[None]:
    """cwd, environment, sys.path, sys.argv, __main__ and tempfile: set, then restored."""
    from ..snakemake_internals import restore_shell_defaults, shell_defaults

    saved_cwd = os.getcwd()
    saved_environ = _environ_bytes()
    saved_path = list(sys.path)
    saved_argv = list(sys.argv)
    saved_main = sys.modules.get("__main__")
    saved_tempdir = tempfile.tempdir
    saved_shell_args = shell_defaults()
    tmpdir = _temporary_directory()
    try:
        os.chdir(spec.workdir)
        os.environ.update(spec.envvars)
        for name in THREAD_VARIABLES:
            os.environ[name] = str(spec.threads)
        for name in TMPDIR_VARIABLES:
            os.environ[name] = tmpdir
        if not os.path.isdir(tmpdir):
            os.makedirs(tmpdir, exist_ok=True)
        tempfile.tempdir = tmpdir
        yield
    finally:
        os.chdir(saved_cwd)
        _restore_environ(saved_environ)
        sys.path[:] = saved_path
        sys.argv[:] = saved_argv
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        tempfile.tempdir = saved_tempdir
        restore_shell_defaults(saved_shell_args)


#: Where ``tempfile.gettempdir`` last found the temporary directory, with none set.
_found_tmpdir: list[str] = []


def _temporary_directory() -> str:
    """``tempfile.gettempdir()``, not looked for again while the first place it looks
    (``$TMPDIR``, ``$TEMP``, ``$TMP``, else ``/tmp``) is where it was found and is still
    writable (``access``): looking creates and removes a file in each place tried, most
    of what a no-op job's process state cost (``tempfile.tempdir`` is put back to None
    after each job)."""
    if tempfile.tempdir is None:
        first = os.path.abspath(tempfile._candidate_tempdir_list()[0])  # type: ignore[attr-defined]
        if _found_tmpdir == [first] and os.access(first, os.W_OK | os.X_OK):
            return first
        _found_tmpdir[:] = [tempfile.gettempdir()]
        return _found_tmpdir[0]
    return tempfile.gettempdir()


def _environ_bytes() -> dict[bytes, bytes]:
    """``os.environ`` as the C environment holds it: a copy of its own mapping of
    bytes (CPython's ``_data``) costs a microsecond, decoding every entry 30."""
    return dict(os.environ._data)  # type: ignore[attr-defined]


def _restore_environ(saved: dict[bytes, bytes]) -> None:
    """``os.environ`` back to ``saved``, changing only the entries that differ; every
    other saved entry is set again in the C environment, which a C library's
    ``setenv`` changes without ``os.environ`` knowing (and a subprocess inherits)."""
    now = os.environ._data  # type: ignore[attr-defined]
    for key in [key for key in now if key not in saved]:
        del os.environ[os.fsdecode(key)]
    for key, value in saved.items():
        if now.get(key) == value:
            os.putenv(key, value)
        else:
            os.environ[os.fsdecode(key)] = os.fsdecode(value)


@contextmanager
def thread_limits(
    threads: int, set_torch_threads: Callable[[int], Callable[[], None] | None] | None
) -> Iterator[None]:
    """Thread pools (BLAS/OpenMP through threadpoolctl, torch) sized to the rule's threads."""
    restore_torch = set_torch_threads(threads) if set_torch_threads else None
    try:
        with _thread_pools().limit(limits=threads):
            yield
    finally:
        if restore_torch is not None:
            restore_torch()


_found_pools: tuple[int, Any] | None = None


def _thread_pools() -> Any:
    """threadpoolctl's controller of the loaded thread pools, found again only after a
    module was imported: finding them walks every loaded library, about 1 ms, which a
    no-op job would pay each time. Pools come with extension modules, so a library
    loaded since shows as a longer ``sys.modules`` (or as a workflow module forgotten)."""
    global _found_pools
    from threadpoolctl import ThreadpoolController

    modules = len(sys.modules)
    if _found_pools is None or _found_pools[0] != modules:
        _found_pools = (modules, ThreadpoolController())
    return _found_pools[1]


def _forget_thread_pools() -> None:
    global _found_pools
    _found_pools = None


def torch_threads(threads: int) -> Callable[[], None] | None:
    """Set torch's intra-op threads if torch is loaded; return how to undo it."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    return lambda: torch.set_num_threads(previous)


#: Modules of loader files (``loaders._import_file``): they live with their context.
LOADER_PREFIX = "_snakemake_context_loader_"
#: Packages never forgotten, wherever they lie (this plugin, Snakemake).
_KEEP_PACKAGES = ("snakemake", "snakemake_executor_context", "snakemake_executor_plugin_context")


def _installed_roots() -> list[str]:
    roots = {
        os.path.realpath(path)
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
    try:
        roots.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    roots.add(os.path.realpath(sys.prefix) + os.sep + "lib")
    return sorted(roots)


_INSTALLED = _installed_roots()


def _under(path: str, roots: Collection[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _module_file(module: ModuleType | None) -> str | None:
    filename = getattr(module, "__file__", None)
    return os.path.realpath(filename) if isinstance(filename, str) else None


def is_installed(path: str) -> bool:
    """Whether a file belongs to the Python installation (stdlib, site-packages)."""
    return "site-packages" in path or "dist-packages" in path or _under(path, _INSTALLED)


def is_workflow_module(name: str, module: ModuleType | None, roots: Collection[str]) -> bool:
    """Whether a module was imported from the workflow's own files: under one of
    ``roots`` and not part of the installation, a loader file or this plugin."""
    if name.startswith(LOADER_PREFIX) or name.split(".")[0] in _KEEP_PACKAGES:
        return False
    path = _module_file(module)
    return path is not None and _under(path, roots) and not is_installed(path)


def new_local_modules(before: Collection[str]) -> list[str]:
    """Modules imported since ``before`` from files outside the installation (what
    a context's load brought in from the workflow), loaders excepted."""
    return [
        name
        for name, module in list(sys.modules.items())
        if name not in before
        and not name.startswith(LOADER_PREFIX)
        and name.split(".")[0] not in _KEEP_PACKAGES
        and (path := _module_file(module)) is not None
        and not is_installed(path)
    ]


def forget_modules_since(before: Collection[str]) -> list[str]:
    """Forget the modules imported since ``before`` from outside the installation,
    loader modules included (a cache probe's imports: the load imports them again,
    and then they belong to the context)."""
    names = new_local_modules(before)
    names += [n for n in list(sys.modules) if n.startswith(LOADER_PREFIX) and n not in before]
    for name in names:
        sys.modules.pop(name, None)
    return names


def _imported_since(names: list[str]) -> list[tuple[str, ModuleType]]:
    """The modules imported since ``sys.modules`` held ``names``: none when it holds
    the same names in the same order, one comparison (most jobs import nothing)."""
    if list(sys.modules) == names:
        return []
    before = set(names)
    return [(name, module) for name, module in list(sys.modules.items()) if name not in before]


@contextmanager
def fresh_modules(
    roots: Collection[str], keep: Callable[[], Collection[str]]
) -> Iterator[list[str]]:
    """Forget, at the end, the workflow modules the job imported, except those
    ``keep()`` names (modules of loaded contexts). Yields the names forgotten."""
    names = list(sys.modules)
    forgotten: list[str] = []
    try:
        yield forgotten
    finally:
        new = _imported_since(names)
        kept = set(keep()) if new else set()
        # Resolved only when the job imported something: most jobs import nothing.
        real_roots = sorted({os.path.realpath(root) for root in roots if root}) if new else []
        for name, module in new:
            if name in kept or name == "__main__":
                continue
            if is_workflow_module(name, module, real_roots):
                sys.modules.pop(name, None)
                forgotten.append(name)
        if forgotten:
            importlib.invalidate_caches()
            _forget_thread_pools()  # a forgotten extension's library stays loaded
