import time

from snakemake_executor_context import load_context

toy = load_context(snakemake)
time.sleep(float(snakemake.params.sleep))
with open(snakemake.output[0], "w") as out:
    out.write(f"{snakemake.wildcards.i}\n")
with open("work-writes.txt", "a") as writes:  # every write, for the tests that count them
    writes.write(f"{snakemake.wildcards.i} {time.time()}\n")
