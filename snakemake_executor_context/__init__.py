"""Run Snakemake GPU rules on persistent context servers.

The public API is small: declare a context in the Snakefile, use it from a rule's
script, and the exception tree. The executor itself is found by Snakemake through
the ``snakemake_executor_plugin_context`` package (``snakemake --executor context``).

Importing this package is cheap (standard library and Snakemake's interface
packages only): every Snakefile that declares a context imports it, in every job.

The map, by the process each part runs in (imports run one way: ``fleet`` at the
bottom, ``settings`` and ``strays`` beside it, ``catalog`` above them, then ``dispatch``,
``server``, ``pilots``, ``cluster``, ``executor`` and ``cli``):

- the public API: :mod:`.contexts` (declaring and using a context), :mod:`.loaders`
  (loader specs, identities, cache probes), :mod:`.callmerge` (``batched``: calls
  merged across jobs), :mod:`.errors` (the one exception tree), :mod:`.gang` (contexts spanning
  several processes, one rank per device, and the devices a server owns), :mod:`.hf`
  (the built-in loader: any causal LM ``transformers`` reads, in one line);
- shared by every process: :mod:`.jobhooks` (what a server installs for the job of a
  thread), :mod:`.jobspec` (what travels to a server and back), :mod:`.defaults` (each
  default and environment variable once), :mod:`.paths` (the one rule for paths
  outside the workflow directory: the private root, files trusted only when yours),
  :mod:`.modelcache` (the node-local model cache, a package: a loader's converted
  weights and staged model files, their manifests, size limit and checks; its entry
  functions are public API for loaders),
  :mod:`.terminal` (values from a workflow or a catalog shown with their control
  characters escaped), :mod:`._version`;
- Snakemake's process and a server's: :mod:`.snakemake_internals` (every read of
  Snakemake beyond its plugin interface, checked at the start of a run);
- packages: :mod:`.fleet` (vocabulary and pure policy), :mod:`.settings` (every
  option declared once, its checks, the fleet's shape), :mod:`.strays` (stray
  processes found, ended and named), :mod:`.catalog` (storage), :mod:`.dispatch` (the
  pure dispatch machine), :mod:`.server` (a context server's process),
  :mod:`.pilots` (servers as batch jobs, every batch system, the running pool),
  :mod:`.cluster` (the cluster's processes), :mod:`.report` (the GPU ledger as an
  HTML report, read from the catalog), :mod:`.executor` (Snakemake's process),
  :mod:`.simulate` (the fleet simulated around the real dispatch machine, above the
  executor), and :mod:`.cli` (the ``snakemake-context`` command) on top.
"""

from ._version import __version__
from .callmerge import Batcher, batched
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
    GangBroken,
    JobCancelled,
    NoServerError,
    RankError,
    UnsupportedSnakemakeError,
    VersionSkewError,
)
from .gang import Gang, Rank, server_devices

__all__ = [
    "CONFIG_KEY",
    "Batcher",
    "ClusterError",
    "ContextDeclaration",
    "ContextDeclarationError",
    "ContextExecutorError",
    "ContextLoadError",
    "Gang",
    "GangBroken",
    "JobCancelled",
    "NoServerError",
    "Rank",
    "RankError",
    "UnsupportedSnakemakeError",
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
    "server_devices",
]
