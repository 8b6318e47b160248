"""rtx4090.yaml describes one RTX 4090 and gives vicuna-13b tensor_parallel_size 2; on a machine with
one such GPU only vicuna-13b's rows are refused, the Llama-2-13B AWQ rows still run."""

from pathlib import Path

from specstudy.config import load_study
from specstudy.environments.preflight import Probes
from specstudy.run.environment import keep_rows, prepare_machine
from specstudy.run.plan import check_backends, expand


def _probes(gpus):
    return Probes(
        gpus=lambda: list(gpus),
        installed=lambda env: True,
        imports=lambda py, mod: (True, ""),
        cached=lambda repo: "/hf/config.json",
        token=lambda: True,
        disk_free=lambda p: 10**15,
        which=lambda exe: "/usr/bin/" + exe,
        hf_home=lambda: Path("/hf"),
        node_memory=lambda: None,
    )


def test_one_gpu_refuses_only_the_tensor_parallel_model():
    cfg = check_backends(load_study("rtx4090", check_tokenizers=False), files=False)
    notes = prepare_machine(cfg, probes=_probes(["NVIDIA GeForce RTX 4090"]), log=lambda m: None)
    assert [(n.kind, n.target) for n in notes] == [("gpu", "lmsys/vicuna-13b-v1.3")]
    assert "tensor_parallel_size=2 needs 2 GPUs; 1 here" in notes[0].why
    plans = expand(cfg)
    kept = keep_rows(plans, notes)
    assert {p.target for p in kept} == {"TheBloke/Llama-2-13B-chat-AWQ"}
    assert len(kept) == len([p for p in plans if p.target != "lmsys/vicuna-13b-v1.3"])
    assert prepare_machine(cfg, probes=_probes(["NVIDIA GeForce RTX 4090"] * 2), log=lambda m: None) == []
