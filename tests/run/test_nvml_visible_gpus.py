"""GPU memory is read for the GPUs this process may use (CUDA_VISIBLE_DEVICES, indices or UUIDs),
a server's figure says it includes its reserved pool, and an NVML error at start empties the GPU
figures instead of failing the cell.  pynvml is replaced by a fake of four GPUs."""

import sys
import types

import pytest

from specstudy.backends.watch import SERVER_DEVICE_MEMORY, ServerWatch, WatchResult
from specstudy.telemetry import Nvml, visible_devices

USED = [10, 20, 30, 40]  # bytes used on GPUs 0..3


def _fake_pynvml(fail_count=False):
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM = 0, 0, 1
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlSystemGetDriverVersion = lambda: "580.65"

    def count():
        if fail_count:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return 4

    nv.nvmlDeviceGetCount = count
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: f"NVIDIA H100 #{h}"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}aaa-uuid"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=USED[h])
    return nv


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(**kw):
        monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(**kw))

    return install


def test_visible_devices_follows_cudas_rules():
    assert visible_devices(None, 4) == [0, 1, 2, 3]
    assert visible_devices("2,3", 4) == [2, 3] and visible_devices("3,0", 4) == [3, 0]
    assert visible_devices("1,7,2", 4) == [1]  # CUDA stops at the first index that names no GPU
    assert visible_devices("", 4) == [] and visible_devices("-1", 4) == []
    assert visible_devices("GPU-2aaa", 4, [f"GPU-{i}aaa-uuid" for i in range(4)]) == [2]


def test_only_the_visible_gpus_are_read(fake_nvml, monkeypatch):
    fake_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    nv = Nvml()
    assert nv.names == ["NVIDIA H100 #2", "NVIDIA H100 #3"]
    assert [s["gpu_mem_used_bytes"] for s in nv.sample()] == [30, 40]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1aaa-uuid")
    assert Nvml().names == ["NVIDIA H100 #1"]


def test_a_servers_peak_is_the_visible_gpus_and_says_it_includes_the_pool(fake_nvml, monkeypatch):
    fake_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with ServerWatch(None, gauge_period_s=0.01) as w:
        pass
    assert w.result.device_peak_bytes == [10, 20]
    assert w.result.memory() == (30, SERVER_DEVICE_MEMORY) and "reserved_pool" in SERVER_DEVICE_MEMORY


def test_an_nvml_error_at_start_leaves_no_gpu_figures_and_no_failed_cell(fake_nvml):
    fake_nvml(fail_count=True)
    nv = Nvml()
    assert nv.handles == [] and "GPU_IS_LOST" in nv.error
    with ServerWatch(None, gauge_period_s=0.01) as w:  # raised before: the cell failed
        pass
    assert w.result.device_peak_bytes is None and WatchResult(peak_rss_bytes=5).memory() == (5, "server_rss")
