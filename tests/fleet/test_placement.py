"""Pure placement policy: requirements, which servers fit, and why none does."""

from __future__ import annotations

import pytest

from snakemake_executor_context.cluster.plan import plan_servers
from snakemake_executor_context.fleet.gpus import GpuInfo, gpu_model_tokens, normalize_gpu_model
from snakemake_executor_context.fleet.resources import (
    Requirements,
    covers,
    explain_unrunnable,
    job_resources,
    requirements_from,
    server_resources,
    widest,
)
from snakemake_executor_context.fleet.state import ServerState
from snakemake_executor_context.server.cache import resolve_budget
from snakemake_executor_context.server.nvml import _visible


def gpu_model_matches(requested: str, gpu_name: str) -> bool:
    """Whether a rule asking for ``gpu_model=requested`` runs on a server with that
    GPU: the one can-run check, on the resources both sides advertise."""
    gpu = GpuInfo(index=0, uuid="GPU-x", name=gpu_name, memory_bytes=1)
    wanted = job_resources(Requirements(gpu_model=requested))
    return covers(server_resources(1, [gpu]), wanted)


def runnable_on(req: Requirements, servers: list[ServerState]) -> list[ServerState]:
    return [s for s in servers if covers(s.resources, job_resources(req))]


# Names as NVML reports them on real machines.
NVML_NAMES = {
    "NVIDIA H200": ("h200", {"h200"}),
    "NVIDIA A100-SXM4-80GB": ("a100-sxm4-80gb", {"a100", "sxm4", "80gb"}),
    "NVIDIA GeForce RTX 4090": ("geforce-rtx-4090", {"geforce", "rtx", "4090"}),
    "Tesla V100-SXM2-16GB": ("tesla-v100-sxm2-16gb", {"tesla", "v100", "sxm2", "16gb"}),
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb": ("a100-sxm4-40gb-mig-1g.5gb", {"a100", "mig", "1g.5gb"}),
    "NVIDIA L40S": ("l40s", {"l40s"}),
    "NVIDIA H100 80GB HBM3": ("h100-80gb-hbm3", {"h100", "80gb", "hbm3"}),
    "NVIDIA H100 80GB HBM3 MIG 3g.40gb": ("h100-80gb-hbm3-mig-3g.40gb", {"h100", "mig", "3g.40gb"}),
    "NVIDIA H200 MIG 1g.18gb": ("h200-mig-1g.18gb", {"h200", "mig", "1g.18gb"}),
    "NVIDIA GH200 480GB": ("gh200-480gb", {"gh200", "480gb"}),
    "Tesla T4": ("tesla-t4", {"tesla", "t4"}),
    "NVIDIA RTX A6000": ("rtx-a6000", {"rtx", "a6000"}),
    "Quadro RTX 8000": ("quadro-rtx-8000", {"quadro", "rtx", "8000"}),
}


@pytest.mark.parametrize(("name", "expected"), NVML_NAMES.items())
def test_gpu_model_normalisation(name, expected):
    normalized, tokens = expected
    assert normalize_gpu_model(name) == normalized
    assert tokens <= gpu_model_tokens(name)
    for token in tokens:
        assert gpu_model_matches(token.upper(), name)


def test_gpu_model_does_not_match_other_models():
    assert not gpu_model_matches("h100", "NVIDIA H200")
    assert not gpu_model_matches("a10", "NVIDIA A100-SXM4-80GB")
    assert not gpu_model_matches("h200", "NVIDIA GH200 480GB")
    assert gpu_model_matches("NVIDIA H200", "NVIDIA H200")
    assert gpu_model_matches("h200-mig-1g.18gb", "NVIDIA H200 MIG 1g.18gb")


class FakeNvml:
    """NVML as nvidia-ml-py exposes it, for a machine with a plain H200 and an A100
    in MIG mode with two MIG devices (no GPU exists here to ask)."""

    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        pass

    class _Memory:
        def __init__(self, total):
            self.total = total

    devices = [
        {"name": "NVIDIA H200", "uuid": "GPU-aaaa", "memory": 150_000_000_000, "cc": (9, 0)},
        {
            "name": b"NVIDIA A100-SXM4-40GB",
            "uuid": b"GPU-bbbb",
            "memory": 40_000_000_000,
            "cc": (8, 0),
            "mig": [
                {"name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "uuid": "MIG-1111", "memory": 5e9},
                None,
                {"name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "uuid": "MIG-3333", "memory": 2e10},
            ],
        },
    ]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._Memory(int(handle["memory"]))

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return handle["cc"]

    def nvmlDeviceGetMigMode(self, handle):
        if "mig" not in handle:
            raise self.NVMLError("Not Supported")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return len(handle["mig"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        found = handle["mig"][index]
        if found is None:
            raise self.NVMLError("Not Found")
        return found


def test_nvml_discovery_lists_mig_devices_and_finds_them_by_uuid(monkeypatch):
    import sys

    from snakemake_executor_context.server.nvml import discover_gpus, gpu_by_uuid

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = discover_gpus()
    assert [(g.index, g.uuid, g.name, g.is_mig) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA H200", False),
        (1, "MIG-1111", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", True),
        (1, "MIG-3333", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", True),
    ]
    assert gpus[0].compute_capability == "9.0" and gpus[0].memory_bytes == 150_000_000_000
    assert gpus[2].compute_capability == "8.0" and gpus[2].extra["parent_uuid"] == "GPU-bbbb"
    assert [g.server_name for g in gpus] == ["gpu0", "gpu1-mig0", "gpu1-mig2"]
    mig = gpu_by_uuid("MIG-3333")
    assert mig is not None and mig.memory_bytes == 20_000_000_000
    assert gpu_by_uuid("GPU-nope") is None
    # A server pinned to a MIG device by UUID sees that one only.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1111")
    assert [g.uuid for g in discover_gpus()] == ["MIG-1111"]
    plans = plan_servers(gpus, None, 64_000_000_000, 16)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["GPU-aaaa", "MIG-1111", "MIG-3333"]
    assert plans[1].resources["gpu_model:a100"] == 1 and plans[1].resources["gpu_model:mig"] == 1


def test_no_nvml_means_no_gpus(monkeypatch):
    import sys

    from snakemake_executor_context.server.nvml import discover_gpus

    class Broken(FakeNvml):
        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    assert discover_gpus() == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed at all
    assert discover_gpus() == []


def _gpu(index: int, name: str = "NVIDIA H200") -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:04d}-abcd",
        name=name,
        memory_bytes=140_000_000_000,
        compute_capability="9.0",
    )


def test_cuda_visible_devices_restricts_discovery():
    gpus = [_gpu(0), _gpu(1), _gpu(2)]
    assert [g.index for g in _visible(gpus, "2,0")] == [2, 0]
    assert [g.index for g in _visible(gpus, "GPU-0001")] == [1]
    assert _visible(gpus, "") == []
    assert _visible(gpus, None) == gpus


def test_plan_one_server_per_gpu_pinned_by_uuid():
    plans = plan_servers([_gpu(0), _gpu(1, "NVIDIA A100-SXM4-80GB")], 8, 64_000_000_000, 16)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["GPU-0000-abcd", "GPU-0001-abcd"]
    assert plans[0].resources["gpu"] == 1 and plans[0].resources["gpu_model:h200"] == 1
    assert plans[1].resources["gpu_model:a100"] == 1
    assert all(p.memory_bytes == 32_000_000_000 for p in plans)


def test_plan_cpu_servers_stand_in_for_gpus():
    plans = plan_servers([], None, 24_000_000_000, 2)
    assert [p.name for p in plans] == ["cpu0", "cpu1"]
    assert all(p.resources["gpu"] == 1 and p.gpu is None for p in plans)
    assert len(plan_servers([], None, 24_000_000_000, 64)) == 4
    assert len(plan_servers([], 3, 24_000_000_000, 2)) == 3


def _server(name, gpus=(), stand_in=0, memory=12_000_000_000):
    return ServerState(
        f"tcp://{name}", name=name, resources=server_resources(memory, gpus, stand_in_gpus=stand_in)
    )


def test_requirements_from_snakemake_resources():
    req = requirements_from(
        {
            "gpu": 1,
            "gpu_model": "H200",
            "mem_mb": 2000,
            "tmpdir": "<TBD>",
            "context": "m",
            "_cores": 2,
        }
    )
    assert req == Requirements(gpu=1, gpu_model="H200", mem_mb=2000)
    assert job_resources(req) == {"gpu": 1, "gpu_model:h200": 1, "mem_mb": 2000}
    assert requirements_from({"gpu_model": "<TBD>", "mem_mb": "<TBD>"}) == Requirements()


def test_runnable_on_matches_gpu_model_count_and_memory():
    h200, a100 = _server("h", [_gpu(0)]), _server("a", [_gpu(1, "NVIDIA A100-SXM4-80GB")])
    cpu = _server("c", stand_in=1, memory=2_000_000_000)
    fleet = [h200, a100, cpu]
    assert runnable_on(Requirements(gpu=1), fleet) == fleet
    assert runnable_on(Requirements(gpu=1, gpu_model="h200"), fleet) == [h200]
    assert runnable_on(Requirements(gpu=1, gpu_model="a100"), fleet) == [a100]
    assert runnable_on(Requirements(gpu=2), fleet) == []
    assert runnable_on(Requirements(mem_mb=5000), fleet) == [h200, a100]


def test_unrunnable_message_names_rule_resource_servers_and_fix():
    fleet = [_server("cpu0", stand_in=1), _server("cpu1", stand_in=1)]
    message = explain_unrunnable(
        "rule 'score'", Requirements(gpu=1, gpu_model="h100"), fleet, waited=0
    )
    assert message.startswith("No context server can run rule 'score': gpu_model='h100'")
    assert "Servers seen: cpu0 (gpu=1, mem_mb=12000); cpu1" in message
    assert "--set-resources score:" in message
    assert "after waiting 30 s" in explain_unrunnable(
        "rule 'r'", Requirements(gpu=2), fleet, waited=30
    )
    assert "no servers at all" in explain_unrunnable("rule 'r'", Requirements(gpu=1), [], waited=0)


def test_memory_budget():
    assert resolve_budget("0.5", 1000) == 500
    assert resolve_budget("60MB", 1000) == 60_000_000
    with pytest.raises(ValueError):
        resolve_budget("1.5", 1000)


def test_a_groups_members_need_the_widest_of_them_not_their_sum():
    """50 members of gpu=1 need one server of one GPU (Snakemake sums a group's
    resources: gpu=50, which no server has)."""
    members = [Requirements(gpu=1, mem_mb=1000)] * 49 + [
        Requirements(gpu=2, gpu_model="h200", mem_mb=4000)
    ]
    assert widest(members) == Requirements(gpu=2, gpu_model="h200", mem_mb=4000)
    assert widest([Requirements()]) == Requirements()
