"""The kit's EAGLE-3 head as llama.cpp's ``eagle3`` GGUF (issue 37): keys, tensors, the d2t and
rotary conventions; and, under ``make test-engines``, the pinned llama.cpp loading it and drafting.

* the file read back with gguf-py has llama.cpp's architecture, keys and tensor names, the
  feature layers as trained, and ``d2t`` as target ids (llama.cpp scatters draft logits with
  it), not the checkpoint's offsets;
* the q/k row permutation turns rotate-half rotary into interleaved-pair rotary exactly: every
  attention score q·k is the same under both (a wrong permutation, or none, changes them);
* live: llama.cpp's ``draft-eagle3`` loads the file beside the target GGUF and drafts tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specstudy.backends.llamacpp.eagle3_gguf import ARCH, TENSOR_NAMES, interleave_rotary, write_eagle3_gguf
from specstudy.data.model_files import tiny_model
from specstudy.engine.eagle3_drafter import Eagle3Draft, save_eagle3


@pytest.fixture(scope="module")
def target_gguf(tmp_path_factory):
    """A stand-in target GGUF holding only tokenizer keys (what the writer copies from it)."""
    from gguf import GGUFWriter

    path = tmp_path_factory.mktemp("t") / "target.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(96)])
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    target = tiny_model(seed=0, num_layers=8)
    torch.manual_seed(1)
    d = Eagle3Draft.for_target(target.config, torch.tensor([0, 3, 4, 9, 50, 95]))
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return d, save_eagle3(d, tmp_path_factory.mktemp("h") / "e3", {"target": "tiny"})


def test_keys_tensors_and_d2t_are_llamacpps(head, target_gguf, tmp_path):
    from gguf import GGUFReader

    module, folder = head
    out = write_eagle3_gguf(folder, target_gguf, tmp_path / "d.gguf", module.aux_layers)
    r = GGUFReader(str(out))
    kv = {f.name: f.contents() for f in r.fields.values()}
    assert kv["general.architecture"] == ARCH and kv[f"{ARCH}.block_count"] == 1
    assert kv[f"{ARCH}.target_layers"] == list(module.aux_layers) == [2, 4, 5]
    assert kv[f"{ARCH}.target_hidden_size"] == module.hidden_size and kv[f"{ARCH}.norm_before_residual"] is False
    assert kv["tokenizer.ggml.tokens"][:2] == ["t0", "t1"] and kv["tokenizer.ggml.eos_token_id"] == 2
    tensors = {t.name: t for t in r.tensors}
    assert set(tensors) == set(TENSOR_NAMES.values()) | {"d2t"}
    assert tensors["d2t"].data.tolist() == [0, 3, 4, 9, 50, 95]  # target ids, not the offsets [0, 2, 2, 6, 46, 90]
    want = module.engine_state_dict()["lm_head.weight"].float().numpy()
    assert np.array_equal(tensors["output.weight"].data, want)


def _rope_half(x, pos, base=10000.0):
    """Rotate-half rotary (transformers' Llama): dims i and i + d/2 form a pair."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = pos * inv
    cos, sin = np.concatenate([np.cos(ang)] * 2), np.concatenate([np.sin(ang)] * 2)
    rot = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def _rope_pairs(x, pos, base=10000.0):
    """Interleaved rotary (llama.cpp's Llama): dims 2i and 2i+1 form a pair."""
    d = x.shape[-1]
    ang = pos * base ** (-np.arange(0, d, 2) / d)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)
    return out


@pytest.mark.parametrize("permute", [True, False])
def test_the_permutation_keeps_every_attention_score(permute):
    rng = np.random.default_rng(0)
    n_head, head_dim, h = 3, 8, 12
    wq, wk = rng.normal(size=(n_head * head_dim, h)), rng.normal(size=(n_head * head_dim, h))
    x, y = rng.normal(size=h), rng.normal(size=h)
    wq2, wk2 = (interleave_rotary(wq, n_head), interleave_rotary(wk, n_head)) if permute else (wq, wk)
    same = []
    for pq, pk in [(3, 1), (12, 5), (40, 2)]:  # distinct positions: at equal ones rotary cancels anyway
        q, k = (wq @ x).reshape(n_head, head_dim), (wk @ y).reshape(n_head, head_dim)
        q2, k2 = (wq2 @ x).reshape(n_head, head_dim), (wk2 @ y).reshape(n_head, head_dim)
        hf = (_rope_half(q, pq) * _rope_half(k, pk)).sum(-1)
        cpp = (_rope_pairs(q2, pq) * _rope_pairs(k2, pk)).sum(-1)
        same.append(bool(np.allclose(hf, cpp)))
    assert same == [permute] * 3  # without the permutation every score changes


@pytest.mark.engines
def test_llamacpp_loads_the_head_and_drafts(tmp_path):
    """The committed head beside the target's GGUF in the pinned llama.cpp: it loads and drafts."""
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    from specstudy.data.model_files import get_entry, gguf_file
    from specstudy.paths import REPO_ROOT

    folder = REPO_ROOT / "params/drafters/smollm2-135m-eagle3"
    aux = json.loads((folder / "specstudy.json").read_text())["aux_layers"]
    target = str(gguf_file(get_entry("smollm2-135m")))
    draft = write_eagle3_gguf(folder, target, tmp_path / "d.gguf", aux)
    cmd = [sys.executable, "-m", "specstudy.backends.llamacpp.serve", "--model", target, "--port", "18799"]
    cmd += ["--threads", "2", "--spec-type", "draft-eagle3", "--draft", str(draft), "--draft-max", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while "ready" not in (line := proc.stdout.readline()):
            assert line, "llama.cpp exited before it was ready"
        body = json.dumps({"prompt": "def add(a, b):\n", "n_predict": 24, "temperature": 0, "ignore_eos": True})
        req = urllib.request.Request("http://127.0.0.1:18799/completion", body.encode(), method="POST")
        t = json.loads(urllib.request.urlopen(req, timeout=120).read())["timings"]
        assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
    finally:
        proc.terminate()
        proc.wait(timeout=300)
        time.sleep(0.1)
