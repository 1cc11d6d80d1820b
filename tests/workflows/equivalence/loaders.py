"""A tiny context: a dict built from the declared arguments."""

import os

from snakemake_executor_context import declare_job_memory


def load_toy(scale):
    # Tiny jobs: a server with slots may run several at once from the start.
    declare_job_memory(1_000_000)
    return {"scale": scale, "pid": os.getpid()}
