import os

from snakemake_executor_context import load_context

pool = load_context(snakemake)
values = pool.map(abs, [-1, -2, -3, -4])
child = pool.apply(os.getpid)
with open(snakemake.output[0], "w") as out:
    out.write(f"{values} {os.getpid()} {child}\n")
