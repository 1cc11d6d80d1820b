"""The executor's settings of a pool of pilots for one run (``--context-backend``
and the ``--context-pilot-*`` flags): a base of
:class:`~.settings.ExecutorSettings`. Each is an option of :mod:`..settings.table`, declared
there once with `up`'s pilot flags.
"""

# No `from __future__ import annotations`: Snakemake reads the field types at run time
# to build the argument parser, and only understands typing.Optional.
from dataclasses import dataclass
from typing import Optional

from ..settings.table import table_field

__all__ = ["ATTACH_SETTINGS", "PilotSettings"]

#: The settings that attach the run to a running cluster: pilots (and the embedded
#: cluster's own settings) are for a cluster the run starts, not with one of these.
ATTACH_SETTINGS = ("scheduler_address", "scheduler_file")


@dataclass
class PilotSettings:
    """A pool of pilots on a batch system, submitted for this run."""

    backend: Optional[str] = table_field("backend", conflicts=ATTACH_SETTINGS)
    pilot_queue: Optional[str] = table_field("pilot_queue")
    pilot_account: Optional[str] = table_field("pilot_account")
    pilot_qos: Optional[str] = table_field("pilot_qos")
    pilot_walltime: str = table_field("pilot_walltime")
    pilot_gpus: int = table_field("pilot_gpus")
    pilot_nodes: int = table_field("pilot_nodes")
    pilot_gpu_types: Optional[list[str]] = table_field("pilot_gpu_types")
    pilot_cores: int = table_field("pilot_cores")
    pilot_memory: str = table_field("pilot_memory")
    pilot_directives: Optional[list[str]] = table_field("pilot_directives")
    pilot_prologue: Optional[list[str]] = table_field("pilot_prologue")
    min_pilots: int = table_field("min_pilots")
    max_pilots: int = table_field("max_pilots")
    pilot_model_cache: Optional[str] = table_field("pilot_model_cache")
