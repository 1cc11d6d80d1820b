"""The children a context job's script starts with multiprocessing's ``spawn`` or
``forkserver`` start method.

Such a child re-creates its parent's ``__main__`` before it runs its target: it
imports the module ``__main__.__spec__`` names, else runs the file ``__main__.__file__``
names. In a server the job's ``__main__`` is a stand-in whose ``__file__`` is the
script's path: the child would run the bare script, without the ``snakemake`` object
the preamble gives it. So, for multiprocessing only, the job's ``__main__`` names a
module written for the job (:class:`ScriptChildren`, 0600 in a 0700 directory):
run in the child, :func:`run_in_child` makes the job's ``snakemake`` object and runs
the script as ``__mp_main__``, its functions defined and its guarded work skipped, as
a child of ``fork`` (the default) sees them. A child whose script fails before its
target runs leaves a note, and the job fails with its one line, never succeeds
without the child's work. The script itself sees ``__spec__`` None, as in
``python script.py``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import signal
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from .. import paths
from ..terminal import error_text

__all__ = ["ScriptChildren", "run_in_child", "stand_in_main"]

#: Where the modules the children import lie, in the private root of the server's
#: start (a job points the temporary directory elsewhere).
_DIRECTORY = "script-children"
_BASE = paths.local_base()
_ON_PATH = str(paths.root_path(_BASE) / _DIRECTORY)
_PREFIX = "_snakemake_context_child_"


class ScriptChildren:
    """What a job's ``spawn``/``forkserver`` children need: written when
    multiprocessing first asks, removed with :meth:`close`."""

    def __init__(
        self, script_path: str, source: str | bytes, real_file: str, pickled: tuple[bytes, bytes]
    ):
        self._what = {
            "script_path": script_path,
            "source": source,
            "real_file": real_file,
            "snakemake": pickled,
        }
        self._script_path = script_path
        self._spec: ModuleSpec | None = None
        self._files: list[Path] = []
        self._note: Path | None = None
        # On sys.path before multiprocessing copies it for a child (restored when
        # the job's group ends), though the module is only written when it asks.
        if _ON_PATH not in sys.path:
            sys.path.append(_ON_PATH)

    def spec(self) -> ModuleSpec:
        """The module spec a child imports its ``__main__`` from."""
        if self._spec is None:
            directory = paths.private_path(_DIRECTORY, base=_BASE)
            token = secrets.token_hex(8)
            name = f"{_PREFIX}{token}"
            data, module = directory / f"{name}.pickle", directory / f"{name}.py"
            self._note = directory / f"{name}.failed"
            what = {**self._what, "note": str(self._note)}
            paths.write_private(data, pickle.dumps(what))
            self._files += [data, module, self._note]
            paths.write_private(
                module,
                "from snakemake_executor_context.server.scriptchild import run_in_child\n"
                f"run_in_child(globals(), {str(data)!r})\n",
            )
            self._spec = ModuleSpec(name, None, origin=self._script_path)
        return self._spec

    def failure(self) -> str | None:
        """The line a child left when its script failed before its target ran."""
        if self._note is None:
            return None
        note = (paths.read_trusted(self._note) or b"").decode(errors="replace").strip()
        return note or None

    def close(self) -> None:
        """Remove the files written for the children."""
        for path in self._files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def stand_in_main(children: ScriptChildren) -> types.ModuleType:
    """A job's stand-in ``__main__``: the script sees ``__spec__`` None in its globals,
    multiprocessing sees the module its children import."""

    class JobMain(types.ModuleType):
        @property
        def __spec__(self) -> ModuleSpec:  # type: ignore[override]
            return children.spec()

    return JobMain("__main__")


def run_in_child(namespace: dict[str, Any], data_path: str) -> None:
    """In a job's ``spawn``/``forkserver`` child: run the job's script as
    ``__mp_main__`` with the job's ``snakemake`` object in ``namespace``."""
    from ..snakemake_internals import load_script_object, script_globals

    # An ignored SIGINT survives exec (the server ignores Ctrl-C): a script's process
    # raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    what = pickle.loads(paths.read_trusted(Path(data_path)) or b"")
    snakemake = load_script_object(*what["snakemake"])
    namespace.update(script_globals(what["script_path"], what["real_file"], snakemake))
    namespace["__spec__"] = None
    try:
        code = compile(what["source"], what["script_path"], "exec", dont_inherit=True)
        exec(code, namespace)
    except BaseException as error:
        line = " ".join(error_text(error).split())[:300]
        with contextlib.suppress(OSError):
            paths.write_private(Path(what["note"]), f"{line} (pid {os.getpid()})")
        raise
