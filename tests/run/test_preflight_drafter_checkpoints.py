"""preflight looks for every drafter checkpoint in the cache, not only those an engine with its own
drafter format loads: the Medusa heads (trtllm-engine) and the reference engine's draft models (the
h200 profile's SpecInfer pair, each model of the merged tree), while the Makefile runs offline."""

from pathlib import Path

from specstudy.config import load_study
from specstudy.environments.preflight import Probes
from specstudy.run.environment import machine_needs

ABSENT = {"FasterDecoding/medusa-vicuna-33b-v1.3", "JackFram/llama-68m", "JackFram/llama-160m"}


def test_medusa_heads_and_reference_drafters_missing_from_the_cache_are_found():
    probes = Probes(
        gpus=lambda: ["NVIDIA H200"] * 8,
        installed=lambda env: True,
        imports=lambda py, mod: (True, ""),
        cached=lambda repo: None if repo in ABSENT else "/hf/config.json",
        token=lambda: True,
        disk_free=lambda p: 10**13,
        which=lambda exe: "/usr/bin/" + exe,
        hf_home=lambda: Path("/hf"),
    )
    cfg = load_study("h200", check_tokenizers=False)
    missing = {m.what for m in machine_needs(cfg, probes) if m.kind == "model"}
    assert missing == ABSENT
