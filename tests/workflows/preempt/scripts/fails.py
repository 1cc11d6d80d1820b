# Jobs from params.passing on raise the script's own error, the same on any server.
import time

from snakemake_executor_context import load_context

load_context(snakemake)
time.sleep(0.3)
if int(snakemake.wildcards.i) >= snakemake.params.passing:
    raise RuntimeError(f"input {snakemake.wildcards.i} is malformed")
with open(snakemake.output[0], "w") as out:
    out.write("ok\n")
