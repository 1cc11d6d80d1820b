"""Run Snakemake GPU rules on persistent context servers.

The public API is small: declare a context in the Snakefile, use it from a rule's
script, and the exception tree. The executor itself is found by Snakemake through
the ``snakemake_executor_plugin_context`` package (``snakemake --executor context``).

Importing this package is cheap (standard library and Snakemake's interface
packages only): every Snakefile that declares a context imports it, in every job.
"""

from ._version import __version__
from .batching import Batcher, batched
from .contexts import (
    CONFIG_KEY,
    ContextDeclaration,
    declare_context,
    declare_job_memory,
    declare_size,
    load_context,
    loader,
    note_conversion,
    report_items,
)
from .errors import (
    ClusterError,
    ContextDeclarationError,
    ContextExecutorError,
    ContextLoadError,
    JobCancelled,
    NoServerError,
    VersionSkewError,
)

__all__ = [
    "CONFIG_KEY",
    "Batcher",
    "ClusterError",
    "ContextDeclaration",
    "ContextDeclarationError",
    "ContextExecutorError",
    "ContextLoadError",
    "JobCancelled",
    "NoServerError",
    "VersionSkewError",
    "__version__",
    "batched",
    "declare_context",
    "declare_job_memory",
    "declare_size",
    "load_context",
    "loader",
    "note_conversion",
    "report_items",
]
