import os
import time

from snakemake_executor_context import load_context, report_items

ctx = load_context(snakemake)
# With config kill_marker, job 0 writes its server's PID there and waits to be killed;
# its second attempt (the marker exists) runs normally.
marker = snakemake.config.get("kill_marker")
if marker and snakemake.wildcards.i == "0" and not os.path.exists(marker):
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    time.sleep(300)
time.sleep(snakemake.params.sleep)
report_items(1)
with open(snakemake.output[0], "w") as f:
    f.write(f"{os.getpid()} {ctx['name']}\n")
