"""Loaders: parsing a loader spec, the identity of a declaration, importing the
loader where it runs, and its cache probe.

Runs wherever a declaration is made (the Snakefile, in Snakemake's process and in
every job) and wherever a context is loaded (a context server, or a job's own process
under another executor): standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .errors import ContextDeclarationError, ContextLoadError
from .modelcache import staging

__all__ = [
    "LoaderRef",
    "cache_probe",
    "declaration_identity",
    "hold_template",
    "import_loader",
    "staged_names",
    "template_dir",
]


class LoaderRef(Protocol):
    """What importing and calling a loader needs of a declaration
    (:class:`~.contexts.ContextDeclaration` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def loader(self) -> str: ...
    @property
    def loader_path(self) -> str | None: ...
    @property
    def kwargs(self) -> Mapping[str, Any]: ...


def declaration_identity(
    name: str,
    loader: str,
    kwargs: Mapping[str, Any],
    basedir: Path,
    *,
    ranks: int = 1,
    sources: Mapping[str, str] | None = None,
) -> tuple[str, str, Path | None]:
    """(identity, canonical JSON of the arguments, the loader file's absolute path).

    The identity is the sha256 of the loader spec, the canonical JSON of the keyword
    arguments and a fingerprint of the loader's code (the content hash of its file,
    or its distribution's version when it is an installed package), and the number
    of ranks when it spans more than one process (one-process identities are those
    of releases before gangs), and the identity of each staged argument's source
    (:mod:`.modelcache.staging`; a changed model directory is a new context).
    """
    module, function, path = _parse_loader_spec(name, loader, basedir)
    canonical = _canonical_kwargs(name, kwargs)
    fingerprint = _file_fingerprint(path) if path else _module_fingerprint(name, module)
    digest = hashlib.sha256()
    for part in (
        loader if path is None else f"{Path(loader).name}:{function}",
        canonical,
        fingerprint,
        *([f"ranks={ranks}"] if ranks > 1 else []),
        *(f"staged:{key}={value}" for key, value in sorted((sources or {}).items())),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest(), canonical, path


def import_loader(declaration: LoaderRef) -> Callable[..., Any]:
    """Import a declaration's loader function; a clear error if that fails."""
    spec, _, function_name = declaration.loader.rpartition(":")
    where = f"on host {os.uname().nodename} (pid {os.getpid()})"
    try:
        if declaration.loader_path:
            module = _import_file(declaration.loader_path)
        else:
            module = importlib.import_module(spec)
    except Exception as error:
        fix = (
            "make the file readable from the servers (a shared filesystem)"
            if declaration.loader_path
            else "install the package in the servers' Python environment, or use a "
            "file loader 'path/to/file.py:function'"
        )
        raise ContextLoadError(
            f"Context '{declaration.name}': loader '{declaration.loader}' could not be "
            f"imported {where}: {type(error).__name__}: {error}. Fix: {fix}."
        ) from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ContextLoadError(
            f"Context '{declaration.name}': loader '{declaration.loader}' names "
            f"'{function_name}', which {module.__name__} does not define as a function. "
            "Fix: correct the part after ':'."
        )
    return function


def staged_names(name: str, loader: str, stage: str | Iterable[str] | None) -> tuple[str, ...]:
    """The arguments a declaration stages: ``stage`` as given, else what a loader of
    this package names (``@loader(stage=...)``; other loaders are not imported where
    the workflow is declared, so they name theirs in ``declare_context``)."""
    if stage is None:
        module, _, function = loader.rpartition(":")
        if not module.startswith(f"{__package__}."):
            return ()
        try:
            stage = getattr(getattr(importlib.import_module(module), function), "stage", None)
        except (ImportError, AttributeError):
            return ()  # the identity's fingerprint reports a loader that is not there
        if stage is None:
            return ()
    names = (stage,) if isinstance(stage, str) else tuple(stage)
    if not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ContextDeclarationError(
            f"Context '{name}': stage={stage!r} must name keyword arguments of its loader "
            "(a name or a list of names)."
        )
    return names


def cache_probe(declaration: LoaderRef) -> bool | None:
    """Whether the weights are on local disk: every staged argument's entry, else the
    loader's cache probe (None: no probe)."""
    if getattr(declaration, "stage", None):
        return staging.is_staged(declaration)
    probe = getattr(import_loader(declaration), "cache_probe", None)
    if probe is None:
        return None
    return bool(probe(**declaration.kwargs))


def template_dir(declaration: LoaderRef) -> Path | None:
    """The local directory of the context's template for these arguments: its first
    staged argument's entry (:mod:`.modelcache.staging`), else the one its loader names
    (``@loader(template=...)``); None: neither."""
    if getattr(declaration, "stage", None):
        return staging.template_entry(declaration)
    template = getattr(import_loader(declaration), "template", None)
    if template is None:
        return None
    where = template(**declaration.kwargs)
    return None if where is None else Path(where).absolute()


def hold_template(declaration: LoaderRef) -> Callable[[], None]:
    """Hold the loader's template in its node's cache (no server of the node removes
    it to make room, :func:`.modelcache.hold_entry`) until the function returned is
    called; a loader that declares none, or fails to say, holds nothing."""
    from .modelcache.cacheroom import hold_entry

    try:
        entry = template_dir(declaration)
        if entry is not None:
            return hold_entry(entry)
    except Exception:  # the load that follows reports the loader's error
        pass
    return lambda: None


def _parse_loader_spec(name: str, spec: str, basedir: Path) -> tuple[str, str, Path | None]:
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise ContextDeclarationError(
            f"Context '{name}': loader {spec!r} is not of the form "
            "'package.module:function' or 'path/to/file.py:function'."
        )
    target, _, function = spec.rpartition(":")
    if not function.isidentifier() or not target:
        raise ContextDeclarationError(
            f"Context '{name}': loader {spec!r} must end in ':function_name'."
        )
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target)
        if not path.is_absolute():
            path = basedir / path
        path = path.resolve()
        if not path.is_file():
            raise ContextDeclarationError(
                f"Context '{name}': loader file {path} does not exist. Fix: give its "
                "path relative to the Snakefile that declares the context."
            )
        return target, function, path
    if not all(part.isidentifier() for part in target.split(".")):
        raise ContextDeclarationError(
            f"Context '{name}': loader {spec!r} is not a module path or a .py file."
        )
    return target, function, None


def _canonical_kwargs(name: str, kwargs: Mapping[str, Any]) -> str:
    def plain(value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    try:
        return json.dumps(
            plain(dict(kwargs)), sort_keys=True, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError) as error:
        raise ContextDeclarationError(
            f"Context '{name}': its keyword arguments must be JSON values (str, int, "
            f"float, bool, None, lists, dicts): {error}. Fix: pass plain values, and "
            "build objects inside the loader."
        ) from error


def _file_fingerprint(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _module_fingerprint(name: str, module: str) -> str:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:
        spec = None
        reason = f"{type(error).__name__}: {error}"
    else:
        reason = "not found on sys.path"
    if spec is None:
        raise ContextDeclarationError(
            f"Context '{name}': loader module '{module}' cannot be imported here "
            f"({reason}). Fix: install the package, or use a file loader "
            "'path/to/file.py:function'."
        )
    origin = spec.origin
    if origin and os.path.isfile(origin):
        site_dirs = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
        if any(origin.startswith(site + os.sep) for site in site_dirs):
            version = _distribution_version(module.partition(".")[0])
            if version:
                return f"dist:{version}"
        return _file_fingerprint(Path(origin))
    return f"module:{module}"


def _distribution_version(top_level: str) -> str | None:
    from importlib import metadata

    for dist_name in metadata.packages_distributions().get(top_level, []):
        try:
            return f"{dist_name}=={metadata.version(dist_name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


#: One file loader executes at a time: its module is in sys.modules from the start of
#: its execution, and another thread (a server's cache probe beside a job's load) must
#: not take it half made. Re-entrant: a loader file may import another.
_importing = threading.RLock()


def _import_file(path: str) -> Any:
    # Keyed by path and content: an edited loader file is imported anew, as its
    # changed identity asks for.
    digest = hashlib.sha256(path.encode() + b"\0" + Path(path).read_bytes()).hexdigest()
    module_name = "_snakemake_context_loader_" + digest[:16]
    with _importing:
        module = sys.modules.get(module_name)
        if module is not None:
            return module
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        return module
