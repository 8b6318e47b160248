"""Preflight: the whole missing-list from fakes for NVML, engine envs, the HF cache, tokens and
disk; drafter checks against synthetic checkpoints (config.json + a real safetensors header of
tiny tensors, written with ``safetensors``), read as the engines' loaders would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specstudy.environments import install as envs
from specstudy.environments.drafter_preflight import adapt_for_sglang, check_drafter, safetensors_keys
from specstudy.environments.preflight import DrafterUse, Missing, Probes, Weights, preflight
from specstudy.frameworks.declaration import CellCheck

A100 = {"device": "NVIDIA A100-SXM4-80GB", "kind": "gpu", "memory_gb": 80}
CPU = {"device": "cpu", "kind": "cpu"}


def probes(**kw) -> Probes:
    base = dict(
        gpus=lambda: ["NVIDIA A100-SXM4-80GB"] * 4,
        installed=lambda env: True,
        imports=lambda py, mod: (True, ""),
        cached=lambda repo: "/cache/config.json",
        token=lambda: True,
        disk_free=lambda p: 10**13,
        which=lambda exe: "/usr/bin/" + exe,
        hf_home=lambda: Path("/hf"),
    )
    return Probes(**{**base, **kw})


def kinds(missing: list[Missing]) -> list[tuple[str, str]]:
    return [(m.kind, m.what) for m in missing]


def test_a_ready_machine_has_nothing_missing():
    got = preflight(
        ["vllm", "sglang", "trtllm"], [Weights("meta-llama/Llama-2-70b-chat-hf", 69e9)], [], A100, 4, probes=probes()
    )
    assert got == []


def test_everything_missing_at_once_on_a_bare_box():
    p = probes(
        gpus=lambda: ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"],
        installed=lambda env: env.engine != "vllm",
        imports=lambda py, mod: (False, "ImportError: libcuda.so.1") if mod == "sglang" else (True, ""),
        cached=lambda repo: None,
        token=lambda: False,
        disk_free=lambda p: 50 * 10**9,
        which=lambda exe: None,
    )
    got = preflight(
        ["vllm", "vllm-server", "sglang", "trtllm", "reference"],
        [Weights("meta-llama/Llama-2-70b-chat-hf", 69e9), Weights("lmsys/vicuna-33b-v1.3", 33e9)],
        [DrafterUse("yuhuili/EAGLE-llama2-chat-70B", (("vllm", "eagle"),), 1.6e9)],
        A100,
        4,
        probes=p,
    )
    assert kinds(got) == [
        ("gpu", "NVIDIA A100-SXM4-80GB"),
        ("gpu", "4 GPUs"),
        ("engine", "vllm-cuda environment"),
        ("engine", "sglang environment"),
        ("engine", "trtllm-serve"),
        ("model", "meta-llama/Llama-2-70b-chat-hf"),
        ("token", "meta-llama/Llama-2-70b-chat-hf"),
        ("model", "lmsys/vicuna-33b-v1.3"),
        ("model", "yuhuili/EAGLE-llama2-chat-70B"),
        ("disk", "/hf"),
    ]
    by = {(m.kind, m.what): m for m in got}
    assert "make engine-vllm" in by[("engine", "vllm-cuda environment")].how
    assert (
        "libcuda" in by[("engine", "sglang environment")].why and "--force" in by[("engine", "sglang environment")].how
    )
    assert "A100-SXM4-40GB" in by[("gpu", "NVIDIA A100-SXM4-80GB")].why
    assert "HF_TOKEN" in by[("token", "meta-llama/Llama-2-70b-chat-hf")].how
    assert "about 138 GB" in by[("model", "meta-llama/Llama-2-70b-chat-hf")].why
    assert "207 GB of weights to download, 50 GB free" in by[("disk", "/hf")].why  # 138 + 66 + 3.2


def test_no_gpu_driver_and_the_cpu_profile():
    got = preflight(["vllm"], [], [], A100, 2, probes=probes(gpus=lambda: None))
    assert kinds(got) == [("gpu", "NVIDIA A100-SXM4-80GB")] and "sees no NVIDIA GPU" in got[0].why
    # the CPU study: no GPU check, the CPU vLLM build, TensorRT-LLM cannot run here, SGLang has no CPU build
    got = preflight(["vllm", "trtllm"], ["smollm2-135m"], [], CPU, 1, probes=probes(installed=lambda env: False))
    assert kinds(got) == [("engine", "vllm-cpu environment"), ("engine", "trtllm-serve")]
    assert "cannot run here" in got[1].why
    got = preflight(["sglang"], [], [], CPU, 1, probes=probes())
    assert got[0].kind == "engine" and "no cpu build" in got[0].why


def test_mlc_llm_missing_from_path_says_how_to_install_it():
    got = preflight(["mlc", "vllm"], [], [], A100, 1, probes=probes(which=lambda exe: None))
    assert kinds(got) == [("engine", "mlc_llm")]  # vLLM's environment is there: only MLC is missing
    assert "not on PATH" in got[0].why and "https://mlc.ai/wheels" in got[0].how
    assert preflight(["mlc"], [], [], A100, 1, probes=probes()) == []  # mlc_llm on PATH: nothing missing


def test_bad_model_ids_and_local_paths(tmp_path):
    got = preflight(["hf"], [str(tmp_path), "not-a-hub-id"], [], CPU, 1, probes=probes(cached=lambda r: None))
    assert kinds(got) == [("model", "not-a-hub-id")] and "neither a local path nor a hub id" in got[0].why


def test_the_real_import_probe_spawns_and_times_out():
    import sys

    from specstudy.environments.preflight import import_probe

    assert import_probe(sys.executable, "json") == (True, "")
    ok, err = import_probe(sys.executable, "no_such_module_xyz")
    assert not ok and "No module named 'no_such_module_xyz'" in err


# ---- drafter checkpoints ---------------------------------------------------------------------


def checkpoint(path: Path, architectures, fc_bias: bool, extra_config=None) -> Path:
    """A tiny EAGLE-style head: one Llama layer's names, fc with or without bias (real safetensors)."""
    path.mkdir(parents=True)
    tensors = {
        "fc.weight": torch.zeros(2, 4),
        "layers.0.self_attn.q_proj.weight": torch.zeros(2, 2),
        "layers.0.mlp.gate_proj.weight": torch.zeros(2, 2),
    }
    if fc_bias:
        tensors["fc.bias"] = torch.zeros(2)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps({"architectures": architectures, "hidden_size": 2, **(extra_config or {})})
    )
    return path


def test_safetensors_header_only():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        ck = checkpoint(Path(d) / "h", ["LlamaForCausalLM"], True)
        assert safetensors_keys(ck / "model.safetensors") == [
            "fc.bias",
            "fc.weight",
            "layers.0.mlp.gate_proj.weight",
            "layers.0.self_attn.q_proj.weight",
        ]


def test_eagle1_head_is_refused_by_vllm_and_adapted_for_sglang(tmp_path):
    ck = checkpoint(tmp_path / "eagle1", ["LlamaForCausalLM"], fc_bias=True)
    with pytest.raises(ValueError, match="EAGLE-1 checkpoint.*fc without bias"):
        check_drafter("vllm", "eagle", ck)
    with pytest.raises(ValueError, match=r"silently skips.*LlamaForCausalLMEagle.*adapt_for_sglang"):
        check_drafter("sglang", "eagle", ck)
    fixed = adapt_for_sglang(ck, tmp_path / "eagle1-sglang")
    rep = check_drafter("sglang", "eagle", fixed)
    assert rep.architectures == ["LlamaForCausalLMEagle"] and rep.fc_bias is True
    assert (fixed / "model.safetensors").resolve() == (ck / "model.safetensors").resolve()  # weights untouched
    assert json.loads((ck / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]  # original kept
    assert any("--backend tensorrt" in n for n in check_drafter("trtllm", "eagle", ck).notes)


def test_a_vllm_format_head_passes_and_unknown_keys_are_a_note(tmp_path):
    ok = checkpoint(tmp_path / "vllm-eagle", ["EagleLlamaForCausalLM"], fc_bias=False)
    rep = check_drafter("vllm", "eagle", ok)
    assert rep.fc_bias is False and rep.notes == []
    cfg_only = check_drafter("vllm", "eagle", {"architectures": ["LlamaForCausalLM"]})
    assert cfg_only.fc_bias is None and any("unknown until the weights are local" in n for n in cfg_only.notes)
    with pytest.raises(ValueError, match="EAGLE-1"):
        check_drafter("vllm", "eagle", {"architectures": ["LlamaForCausalLM"], "bias": True})
    far = check_drafter("vllm", "eagle", tmp_path / "not-downloaded")
    assert "not local" in far.notes[0]
    with pytest.raises(ValueError, match="engine='tgi'"):
        check_drafter("tgi", "eagle", ok)


def test_preflight_lists_a_refused_drafter(tmp_path):
    ck = checkpoint(tmp_path / "eagle1", ["LlamaForCausalLM"], fc_bias=True)
    got = preflight(
        ["vllm", "sglang"],
        [],
        [DrafterUse(str(ck), (("vllm", "eagle"), ("sglang", "eagle")))],
        A100,
        1,
        probes=probes(),
    )
    assert [m.kind for m in got] == ["drafter", "drafter"] and "(vllm eagle)" in got[0].what


def test_required_engines_drive_the_engine_checks():
    seen = []
    preflight(
        ["vllm", "vllm-server", "hf"],
        [],
        [],
        A100,
        1,
        probes=probes(imports=lambda py, mod: seen.append((py, mod)) or (True, "")),
    )
    assert seen == [(str(envs.python_of(envs.ENVIRONMENTS["vllm-cuda"])), "vllm")]


# ---- the GPU profiles against every backend's own check (pinned engines) ---------------------


@pytest.mark.parametrize("hw", ["a100", "h100", "h200", "rtx4090"])
def test_gpu_profiles_pass_every_backend_check(hw):
    from specstudy.backends import backend_class
    from specstudy.config.study_matrix import load_study
    from specstudy.run.plan import expand

    cfg = load_study(hw)
    seen = set()
    for plan in expand(cfg):
        c = plan.backend_cell()  # what the backend sees: method options (+ the arrival rate)
        backend = backend_class(c.framework)
        kw = {"cuda": True} if c.framework in ("vllm", "vllm-server") else {}
        opts = dict(c.options)
        backend.check_cell(CellCheck(c.method, c.gamma, opts, plan.target, plan.drafter_id, True, c.batch_size))
        label, what = plan.label, backend.describe(c.method, c.gamma, opts, **kw)
        if "tree" in label.lower():
            assert "tree" in what, (label, what)
        if "chain" in label.lower():
            assert "chain" in what, (label, what)
        seen.add((c.framework, c.method))
    assert ("trtllm-engine", "medusa") in seen and ("trtllm", "draft_target") in seen
    assert ("trtllm", "eagle3") in seen and ("vllm", "eagle3") in seen and ("sglang", "eagle3") in seen
    assert not any(m == "eagle" for _, m in seen)  # no EAGLE-1 head left in a GPU profile
    assert not any(fw in ("vllm", "vllm-server") and m == "medusa" for fw, m in seen)  # vLLM 0.33 has none


def test_a_profile_object_works_like_its_mapping():
    from types import SimpleNamespace

    prof = SimpleNamespace(device="NVIDIA H100 80GB HBM3", kind="gpu", memory_gb=80)
    got = preflight(["vllm"], [], [], prof, 2, probes=probes(gpus=lambda: ["NVIDIA H100 80GB HBM3"]))
    assert kinds(got) == [("gpu", "2 GPUs")]
