"""The one exception tree of the plugin.

Every error a user can cause derives from :class:`ContextExecutorError`, which is a
Snakemake ``WorkflowError``: Snakemake prints its message without a traceback. Each
message names what is wrong (rule, context, server), and the fix.

::

    ContextExecutorError
    ├── ContextDeclarationError   a context declaration or a rule's use of it is invalid
    ├── ContextLoadError          a loader could not be imported or raised while loading
    ├── ClusterError              the engine could not be started, reached or trusted
    │   └── VersionSkewError      client and servers run different versions
    ├── NoServerError             no server of the fleet can run a job (the job fails)
    └── JobCancelled              a running job was stopped on request (Ctrl-C, cancel)
"""

from __future__ import annotations

from snakemake_interface_common.exceptions import WorkflowError

__all__ = [
    "ClusterError",
    "ContextDeclarationError",
    "ContextExecutorError",
    "ContextLoadError",
    "JobCancelled",
    "NoServerError",
    "VersionSkewError",
]


class ContextExecutorError(WorkflowError):
    """Base of every error raised by snakemake-executor-plugin-context."""


class ContextDeclarationError(ContextExecutorError):
    """A context declaration, or a rule's use of a context, is invalid."""


class ContextLoadError(ContextExecutorError):
    """A context's loader could not be imported, or raised while loading."""


class ClusterError(ContextExecutorError):
    """The Dask cluster could not be started, reached, or used."""


class VersionSkewError(ClusterError):
    """The servers of an attached cluster run other versions than this client."""


class NoServerError(ContextExecutorError):
    """No server of the fleet can run a job (GPUs, GPU model or memory)."""


class JobCancelled(BaseException):
    """Raised inside a running in-process job to stop it (Ctrl-C, cancellation).

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """
