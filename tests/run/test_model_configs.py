"""§2, N2, N3: each GPU profile against its models' own config.json (fixtures written from the published
configs: tests/fixtures/model_configs/README.md says where each value comes from), every problem at once,
each naming the model, the key, the value and what is allowed."""

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specstudy.config import ParamsProblems, load_study
from specstudy.config.model_configs import config_problems, params_of, read_config
from specstudy.run.plan import check_backends

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"
GPUS = ("a100", "h100", "h200", "rtx4090")


@pytest.fixture(autouse=True)
def fixture_configs(monkeypatch):
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))


def _with_options(cfg, **per_framework):
    opts = {k: dict(v) for k, v in cfg.framework_options.items()}
    for fw, o in per_framework.items():
        opts[fw] = {**opts.get(fw, {}), **o}
    return dataclasses.replace(cfg, framework_options=opts)


@pytest.mark.parametrize("gpu", GPUS)
def test_the_shipped_profiles_pass_their_models_configs(gpu):
    cfg = load_study(gpu, check_tokenizers=False)
    check_backends(cfg, files=False)  # raises on any problem
    assert config_problems(cfg, 80)[1] == []  # every model had its config: nothing left unchecked


@pytest.mark.parametrize("gpu", GPUS)
def test_a_4096_context_for_the_vicuna_targets_is_refused_all_at_once(gpu):
    """N2 planted: the profiles as they were (max_model_len 4096 for every engine)."""
    cfg = load_study(gpu, check_tokenizers=False)
    bad = _with_options(cfg, **{fw: {"max_model_len": 4096} for fw in cfg.framework_options})
    with pytest.raises(ParamsProblems) as e:
        check_backends(bad, files=False)
    text = str(e.value)
    vicuna = "lmsys/vicuna-13b-v1.3" if gpu == "rtx4090" else "lmsys/vicuna-33b-v1.3"
    for fw in ("vllm", "trtllm", "trtllm-engine"):
        assert (
            f"study.framework_options.{fw}.max_model_len=4096 is not allowed; allowed: <= 2048 ({vicuna}: max_position_embeddings=2048"
            in text
        )
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in text  # N3 found in the same pass


def test_sglang_gives_an_eagle3_head_the_targets_context_and_vllm_does_not():
    """SGLang with no max_model_len runs Llama-3.3 at 131072: its 2048-position EAGLE-3 head is refused;
    vLLM's draft takes min(target, draft), so the same row on vLLM passes."""
    cfg = load_study("h100", check_tokenizers=False)
    opts = {k: {kk: vv for kk, vv in v.items() if kk != "max_model_len"} for k, v in cfg.framework_options.items()}
    problems, _ = config_problems(dataclasses.replace(cfg, framework_options=opts), 80)
    assert len(problems) == 1, [str(p) for p in problems]
    p = problems[0]
    assert (p.key, p.value, p.allowed) == ("study.framework_options.sglang.max_model_len", None, "<= 2048")
    assert "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B: max_position_embeddings=2048" in p.hint


def _reader(**edits):
    """read_config with some models' keys changed: {repo: {key: value}}."""

    def read(model):
        cfg = read_config(model)
        return None if cfg is None else {**copy.deepcopy(cfg), **edits.get(model, {})}

    return read


def test_tensor_parallel_draft_vocabulary_head_width_and_memory_are_all_named():
    cfg = load_study("a100", check_tokenizers=False)
    pairs = [m.model_copy(update={"tensor_parallel_size": 8}) if m.name == "vicuna-33b" else m for m in cfg.models]
    cfg = dataclasses.replace(cfg, models=tuple(pairs))
    read = _reader(
        **{
            "meta-llama/Llama-2-7b-chat-hf": {"vocab_size": 32001},
            "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B": {"hidden_size": 4096},
        }
    )
    problems, _ = config_problems(cfg, 24, read=read)
    text = "\n".join(map(str, problems))
    assert (
        "tensor_parallel_size=8 is not allowed; allowed: [1, 2, 4] (lmsys/vicuna-33b-v1.3: num_attention_heads=52"
        in text
    )
    assert (
        "meta-llama/Llama-2-7b-chat-hf: vocab_size=32001, its target meta-llama/Llama-2-70b-chat-hf: vocab_size=32000"
        in text
    )
    assert (
        "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B: hidden_size=4096, its target meta-llama/Llama-3.3-70B-Instruct: hidden_size=8192"
        in text
    )
    assert (
        "on vllm='34.5 GB per GPU' is not allowed; allowed: <= 21.6 GB" in text
    )  # 24 GB x 0.9: 70B over 4 GPUs does not fit


def test_weights_from_the_config_match_the_published_parameter_counts():
    """Llama-2-70B has 69.0e9 parameters, Llama-2-7B 6.74e9, TinyLlama 1.10e9 (their model cards)."""
    for repo, published in [
        ("meta-llama/Llama-2-70b-chat-hf", 68.98e9),
        ("meta-llama/Llama-2-7b-chat-hf", 6.74e9),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 1.10e9),
    ]:
        assert params_of(read_config(repo)) == pytest.approx(published, rel=0.01), repo


def test_models_without_a_config_here_are_listed_not_guessed(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    problems, unchecked = config_problems(load_study("rtx4090", check_tokenizers=False), 24)
    assert problems == [] and "lmsys/vicuna-13b-v1.3" in unchecked and "yuhuili/EAGLE3-Vicuna1.3-13B" in unchecked


def test_models_configs_command(tmp_path):
    env = {"SPECSTUDY_MODEL_CONFIGS": str(FIXTURES), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "specstudy.cli", "models", "configs", "--hardware", "h200", "--json"]
    import os

    r = subprocess.run(run, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "JackFram/llama-160m" in out["models"] and out["problems"] == [] and out["not_checked"] == []
    text = (Path("params/hardware/h200.yaml")).read_text().replace("max_model_len: 2048", "max_model_len: 4096")
    (tmp_path / "hardware").mkdir()
    (tmp_path / "workloads").symlink_to(Path("params/workloads").resolve())  # its task paths are relative
    (tmp_path / "hardware" / "h200.yaml").write_text(text)
    r = subprocess.run(
        [*run[:-1], "--params", str(tmp_path / "hardware" / "h200.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert r.returncode == 2 and "lmsys/vicuna-33b-v1.3: max_position_embeddings=2048" in r.stderr
