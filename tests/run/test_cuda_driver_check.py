"""the CUDA engines' pins need CUDA 13 (vllm 0.33.0's and sglang 0.5.23's Requires-Dist:
nvidia-cutlass-dsl[cu13], cuda-python>=13.0); a driver that supports only CUDA 12.x is found before anything
is installed or started."""

from pathlib import Path

from specstudy.environments.preflight import Probes, Weights, preflight
from specstudy.frameworks import DECLARATIONS

H100 = {"device": "NVIDIA H100 80GB HBM3", "kind": "gpu", "memory_gb": 80}


def _probes(cuda_driver):
    return Probes(
        gpus=lambda: ["NVIDIA H100 80GB HBM3"],
        installed=lambda env: True,
        imports=lambda py, mod: (True, ""),
        cached=lambda repo: "/hf/config.json",
        token=lambda: True,
        disk_free=lambda p: 10**15,
        which=lambda exe: "/usr/bin/" + exe,
        hf_home=lambda: Path("/hf"),
        cuda_driver=cuda_driver,
    )


def test_the_pins_cuda_version_is_a_declaration_fact():
    cuda_envs = [e for d in DECLARATIONS.values() for e in d.environments if e.build == "cuda"]
    assert cuda_envs and all(e.cuda == "13.0" for e in cuda_envs)
    assert "cuda" not in cuda_envs[0].spec()  # not part of an installed environment's stamp


def test_an_old_driver_is_named_with_what_it_supports_and_what_is_needed():
    w = [Weights("meta-llama/Llama-2-7b-chat-hf", 6.7e9)]
    old = preflight(["vllm", "sglang"], w, [], H100, probes=_probes(lambda: (12080, "570.124.06")))
    drivers = [m for m in old if m.kind == "driver"]
    assert [m.what for m in drivers] == ["vllm-cuda environment", "sglang environment"]
    assert "need CUDA 13.0; the driver 570.124.06 supports CUDA 12.8" in drivers[0].why and "R580" in drivers[0].how
    assert preflight(["vllm", "sglang"], w, [], H100, probes=_probes(lambda: (13000, "580.65.06"))) == []
    assert preflight(["vllm"], w, [], H100, cuda=False, probes=_probes(lambda: (12080, "570"))) == []  # CPU build
