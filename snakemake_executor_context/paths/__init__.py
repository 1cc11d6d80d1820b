"""The one rule for every path the plugin, or Dask under it, uses outside the workflow
directory: nothing another local user can plant is trusted.

Two kinds of place, and nothing else:

- **The private root** ``<base>/snakemake-context-<uid>``, where ``<base>`` is
  ``$SNAKEMAKE_CONTEXT_LOCAL_DIR`` (the executor's ``--context-local-dir`` sets it),
  else ``$XDG_RUNTIME_DIR``, else the temporary directory (``$TMPDIR``, else
  ``/tmp``). It must be a real directory (not a symlink) owned by this user, mode
  0700, in directories nobody else may rename it out of (each owned by this user or
  root, and not writable by others unless sticky). Everything the plugin keeps for
  itself on a node lives inside, in directories created 0700 and checked the same
  way (:func:`private_path`): Dask's scratch space of the scheduler, nannies,
  servers and pilots (:func:`scratch_dir`, which Dask puts first on ``sys.path``),
  the process-group records, live copies of network catalogs, the digests of model
  caches, locks, and the cluster process's temporary files. Anything wrong with it
  is refused in one line that names the setting that moves it.
- **Files a user names** (a scheduler file and its siblings, a catalog, a model
  cache): created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``, 0600, then renamed
  into place, :func:`write_private`), and trusted only when the opened file is a
  regular file owned by this user and not writable by others (``O_NOFOLLOW`` and an
  ``fstat`` of the descriptor at each open, :func:`open_trusted`): a file someone
  else planted there is neither read, nor appended to, nor replaced.

- **Output files** (a command's ``-o``, ``--csv``, ``--json``; a run's report and
  summary under ``.snakemake/context/``): written whole to a private temporary file
  in the target's directory, then renamed over the target; a directory, another
  user's file or symlink there is refused, and nothing is created above a path the
  user named (:func:`write_output`).

Standard library only, and nothing of the project but its exception and
:mod:`..defaults`: the catalog, the servers, the cluster and the executor all use it.
:mod:`.root` holds the private root, :mod:`.files` the opens, :mod:`.outputs` the
output files; ``__main__`` is ``python
-m snakemake_executor_context.paths --shell``, which prints the root and the scratch
space as shell ``export`` lines (a pilot's job script runs it on its node).
"""

from __future__ import annotations

from .files import (
    close_lock,
    create_exclusive,
    file_problem,
    held_locks,
    lock_descriptor,
    lock_path,
    new_private_dir,
    new_private_file,
    open_append,
    open_directory,
    open_nofollow,
    open_trusted,
    private_lock,
    read_trusted,
    refuse_planted,
    remove_own,
    replace_private,
    write_private,
)
from .outputs import output_directory, output_problem, write_output
from .root import (
    LOCAL_DIR_SETTING,
    LOCAL_DIR_VARIABLE,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    SCRATCH_NAME,
    dir_problem,
    local_base,
    named_dir_problem,
    not_a_directory,
    private_dir,
    private_path,
    private_root,
    private_temporary_directory,
    root_path,
    scratch_dir,
    shared_note,
)

__all__ = [
    "LOCAL_DIR_SETTING",
    "LOCAL_DIR_VARIABLE",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SCRATCH_NAME",
    "close_lock",
    "create_exclusive",
    "dir_problem",
    "file_problem",
    "held_locks",
    "local_base",
    "lock_descriptor",
    "lock_path",
    "named_dir_problem",
    "new_private_dir",
    "new_private_file",
    "not_a_directory",
    "open_append",
    "open_directory",
    "open_nofollow",
    "open_trusted",
    "output_directory",
    "output_problem",
    "private_dir",
    "private_lock",
    "private_path",
    "private_root",
    "private_temporary_directory",
    "read_trusted",
    "refuse_planted",
    "remove_own",
    "replace_private",
    "root_path",
    "scratch_dir",
    "shared_note",
    "write_output",
    "write_private",
]
