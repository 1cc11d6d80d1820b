"""The last position's logits of one prompt, saved with torch.save."""

import time

import torch

from snakemake_executor_context import load_context

llm = load_context(snakemake)
prompt = f"Claim {snakemake.wildcards.i}: the sky is green. True or false?"
batch = llm.tokenizer(prompt, return_tensors="pt").to(llm.device)
with torch.inference_mode():
    logits = llm.model(**batch).logits[0, -1].float().cpu()
torch.save(logits, snakemake.output[0])
time.sleep(float(snakemake.config.get("sleep", 0)))
