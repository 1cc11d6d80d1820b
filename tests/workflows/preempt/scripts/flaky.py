# Fails on server cpu0 only, by the server's fault: a black hole (a full local disk).
import errno
import time

from distributed import get_worker

from snakemake_executor_context import load_context

load_context(snakemake)
time.sleep(0.3)
if get_worker().name == "cpu0":
    raise OSError(errno.ENOSPC, "No space left on device", snakemake.output[0])
with open(snakemake.output[0], "w") as out:
    out.write("ok\n")
