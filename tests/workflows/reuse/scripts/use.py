import os
import time

from snakemake_executor_context import load_context, report_items

toy = load_context(snakemake)
time.sleep(snakemake.params.sleep)
report_items(3)
with open(snakemake.output[0], "w") as f:
    # The PID of the process that ran the script, and a value from the loaded object.
    f.write(f"{os.getpid()} {toy['value'] + int(snakemake.wildcards.i)}\n")
