"""The one exception tree of the plugin.

Every error a user can cause derives from :class:`ContextExecutorError`, which is a
Snakemake ``WorkflowError``: Snakemake prints its message without a traceback. Each
message names what is wrong (rule, context, server), and the fix.

::

    ContextExecutorError
    ├── ContextDeclarationError   a context declaration or a rule's use of it is invalid
    ├── ContextLoadError          a loader could not be imported or raised while loading
    ├── GangBroken                a rank of a context that spans processes died: it is lost
    ├── RankError                 a rank of such a context raised in a call (the job's error)
    ├── JobValueError             a value a job or loader hands the plugin is refused
    ├── SettingError              a setting's value, or a combination of settings, is refused
    ├── ClusterError              the engine could not be started, reached or trusted
    │   └── VersionSkewError      client and servers run different versions
    ├── NoServerError             no server of the fleet can run a job (the job fails)
    ├── UnsafePathError           a path another user could have planted or can change
    │   └── ManifestError         files that do not match the manifest recorded for them
    ├── UnsupportedSnakemakeError the installed Snakemake lacks an internal the plugin reads
    └── JobCancelled              a running job was stopped on request (Ctrl-C, cancel)
"""

from __future__ import annotations

from typing import Any

from snakemake_interface_common.exceptions import WorkflowError

from .terminal import printable

__all__ = [
    "ClusterError",
    "ContextDeclarationError",
    "ContextExecutorError",
    "ContextLoadError",
    "GangBroken",
    "JobCancelled",
    "JobValueError",
    "ManifestError",
    "NoServerError",
    "RankError",
    "SettingError",
    "TemplateTransferError",
    "UnsafePathError",
    "UnsupportedSnakemakeError",
    "VersionSkewError",
]


class ContextExecutorError(WorkflowError):
    """Base of every error raised by snakemake-executor-plugin-context.

    Its message is shown on a terminal and may quote names and values from a workflow
    or a catalog: every control character in it but newline and tab is escaped
    (:func:`.terminal.printable`), once, here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*(printable(a) if isinstance(a, str) else a for a in args), **kwargs)


class ContextDeclarationError(ContextExecutorError):
    """A context declaration, or a rule's use of a context, is invalid."""


class ContextLoadError(ContextExecutorError):
    """A context's loader could not be imported, or raised while loading."""


class GangBroken(ContextExecutorError):
    """A rank of a context that spans several processes (a gang) died: the context is
    lost, and the jobs that used it run again on a new gang."""


class RankError(ContextExecutorError):
    """A rank of a gang raised in a call; the message holds its traceback."""


class JobValueError(ContextExecutorError):
    """A value a job's script or a loader hands the plugin (:func:`~.contexts.report_items`,
    :func:`~.contexts.declare_size`, :func:`~.contexts.declare_job_memory`) is refused,
    where it is handed: the job, or the load, fails with it."""


class TemplateTransferError(ContextLoadError):
    """No peer could send a context's template whole and intact (the load then reads
    the context's source)."""


class SettingError(ContextExecutorError):
    """A setting's value, or a combination of settings, is refused (at start)."""


class ClusterError(ContextExecutorError):
    """The Dask cluster could not be started, reached, or used."""


class VersionSkewError(ClusterError):
    """The servers of an attached cluster run other versions than this client."""


class UnsupportedSnakemakeError(ContextExecutorError):
    """The installed Snakemake lacks an internal the plugin reads (see
    :mod:`snakemake_executor_context.snakemake_internals`)."""


class NoServerError(ContextExecutorError):
    """No server of the fleet can run a job (GPUs, GPU model or memory)."""


class UnsafePathError(ContextExecutorError):
    """A path outside the workflow directory that this user cannot trust: a symlink,
    another user's file or directory, or one that other users may change (see
    :mod:`.paths`). Nothing was read from it or written through it."""


class ManifestError(UnsafePathError):
    """Files that do not match the manifest recorded for them (see :mod:`.modelcache.manifest`),
    or a manifest that cannot be read."""


class JobCancelled(BaseException):
    """Raised inside a running in-process job to stop it (Ctrl-C, cancellation).

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """
