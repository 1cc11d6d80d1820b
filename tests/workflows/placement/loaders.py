"""A context whose load takes TOY_LOAD_SECONDS and which declares its size."""

import os
import time

from snakemake_executor_context import declare_size


def load(name, nbytes):
    time.sleep(float(os.environ.get("TOY_LOAD_SECONDS", "1.0")))
    declare_size(nbytes)
    return {"name": name, "pid": os.getpid()}
