# Fails on server cpu0 only: a black hole (a broken GPU, a full local disk).
import time

from distributed import get_worker

from snakemake_executor_context import load_context

load_context(snakemake)
time.sleep(0.3)
if get_worker().name == "cpu0":
    raise RuntimeError("this server is broken")
with open(snakemake.output[0], "w") as out:
    out.write("ok\n")
