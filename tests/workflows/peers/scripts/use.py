import time

from snakemake_executor_context import load_context

files = load_context(snakemake)
time.sleep(snakemake.params.sleep)
with open(snakemake.output[0], "w") as f:
    f.write(f"{files['digest']} {files['cache']}\n")
