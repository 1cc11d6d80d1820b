# Simulated: no GPU here. The text is what torch raises after an illegal memory access.
from snakemake_executor_context import load_context

load_context(snakemake)
raise RuntimeError("CUDA error: an illegal memory access was encountered")
