"""Contexts for the gang tests: a toy gang (each rank holds a vector, calls sum it
across ranks with an all-reduce), a loader that splits a tiny transformers model over
the server's devices with device_map="auto", and one that starts child processes."""

import os
import time

from snakemake_executor_context import loader, server_devices


class Shard:
    """One rank's part: its rank's number times ``scale``, four times."""

    def __init__(self, rank, scale):
        import torch

        self.rank = rank
        self.weight = torch.full((4,), float(rank.rank + 1)) * scale

    def total(self, x, hold=0.0):
        """Sum over ranks of weight * x, after holding ``hold`` seconds (every rank)."""
        import torch.distributed as dist

        time.sleep(hold)
        summed = self.weight * x
        dist.all_reduce(summed)
        return summed.tolist()

    def fail_on(self, rank):
        """Raise on rank ``rank``; the others wait for it in an all-reduce."""
        import torch
        import torch.distributed as dist

        if self.rank.rank == rank:
            raise ValueError(f"rank {rank} fails on purpose")
        summed = torch.ones(1)
        dist.all_reduce(summed)
        return summed.item()

    def where(self):
        """(rank, pid, device) of every rank, gathered on rank 0."""
        import torch.distributed as dist

        out = [None] * self.rank.world_size
        dist.all_gather_object(out, (self.rank.rank, os.getpid(), self.rank.device))
        return out


def load_shard(scale=1.0, *, rank):
    return Shard(rank, scale)


class Front:
    """What the jobs see: one object, whose calls run on every rank."""

    def __init__(self, gang):
        self.gang = gang

    def total(self, x, hold=0.0):
        return self.gang.call("total", x, hold=hold)

    def where(self):
        return self.gang.call("where")


@loader(shard=load_shard, job_memory=10_000_000)
def load_toy(scale=1.0, *, gang):
    return Front(gang)


@loader(job_memory=10_000_000)
def load_split(layers=2):
    """A tiny Llama split over this server's devices by accelerate (device_map)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    devices = server_devices()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    from accelerate import dispatch_model, infer_auto_device_map

    model = LlamaForCausalLM(config).eval()
    # Layers over the server's GPUs as device_map="auto" places them (on a CPU server,
    # its memory: no GPU to split over).
    gpus = [int(d.split(":")[1]) for d in devices if d.startswith("cuda")]
    memory = {gpu: "20GiB" for gpu in gpus} if gpus else {"cpu": "20GiB"}
    device_map = infer_auto_device_map(model, max_memory=memory)
    model = dispatch_model(model, device_map)
    placed = sorted({str(p.device) for p in model.parameters()})
    return {"devices": devices, "model": model, "placed": placed, "map": dict(device_map)}


@loader(job_memory=10_000_000)
def load_pool(workers=2):
    """A context that starts child processes (servers are not daemonic)."""
    import multiprocessing

    return multiprocessing.get_context("spawn").Pool(workers)
