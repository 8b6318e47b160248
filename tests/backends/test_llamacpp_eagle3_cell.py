"""llama.cpp's ``eagle3`` as a study method (issue 37): the EAGLE-3 folder checked against the
target GGUF before any server starts (every problem at once), converted once per checksum under
the kit's cache, and the server started with ``draft-eagle3`` and the converted file."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specstudy.backends.llamacpp.eagle3_draft import check_folder, converted_gguf
from specstudy.backends.llamacpp.gguf_meta import read_metadata
from specstudy.backends.llamacpp.llamacpp_backend import LlamaCppBackend
from specstudy.backends.llamacpp.llamacpp_spec import GgufFile, check, server_argv, spec_config
from specstudy.data.model_files import tiny_model
from specstudy.engine.eagle3_drafter import Eagle3Draft, save_eagle3
from specstudy.frameworks.declaration import CellCheck
from specstudy.frameworks.llamacpp import LLAMACPP

VOCAB = 96


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A stand-in target GGUF: the Llama keys the check reads and a tokenizer (what the writer copies)."""
    from gguf import GGUFWriter

    model = tiny_model(seed=0, num_layers=8)
    path = tmp_path_factory.mktemp("t") / "target.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_embedding_length(model.config.hidden_size)
    w.add_block_count(model.config.num_hidden_layers)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = read_metadata(path)
    return model, GgufFile("tiny", str(path), "0" * 64, None, VOCAB, meta)


@pytest.fixture(scope="module")
def folder(target, tmp_path_factory):
    model, _ = target
    torch.manual_seed(1)
    d = Eagle3Draft.for_target(model.config, torch.tensor([0, 3, 4, 9, 50, 95]))
    return save_eagle3(d, tmp_path_factory.mktemp("h") / "e3", {"target": "tiny", "aux_layers": list(d.aux_layers)})


def test_eagle3_is_a_declared_method_with_a_drafter():
    assert "eagle3" in LLAMACPP.methods and "eagle3" in LLAMACPP.needs_drafter
    assert LLAMACPP.drafter_format == "llamacpp" and "draft_p_min" in LLAMACPP.reads("eagle3")
    s = spec_config("eagle3", 4, {"draft_p_min": 0.0})
    assert (s.spec_type, s.n_max, s.n_min, s.p_min) == ("draft-eagle3", 4, 0, 0.0)
    with pytest.raises(ValueError, match=r"ngram_max.*allowed"):
        spec_config("eagle3", 4, {"ngram_max": 3})


def test_the_folder_passes_for_its_target(target, folder):
    assert check_folder(str(folder), "tiny", target[1].meta) == folder


def test_a_bad_folder_is_refused_naming_every_problem(target, folder, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}))
    (bad / "model.safetensors").unlink()
    with pytest.raises(ValueError) as e:
        check_folder(str(bad), "tiny", target[1].meta)
    assert all(s in str(e.value) for s in ("LlamaForCausalLMEagle3", "num_hidden_layers=2", "no model.safetensors"))
    with pytest.raises(ValueError, match="no such folder"):
        check_folder(str(tmp_path / "nowhere"), "tiny", None)


def test_a_head_for_another_target_is_refused(target, folder, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "vocab_size": 49152, "target_hidden_size": 576}))
    rec = json.loads((other / "specstudy.json").read_text())
    (other / "specstudy.json").write_text(json.dumps({**rec, "target": "qwen2.5-1.5b", "aux_layers": [2, 4, 30]}))
    with pytest.raises(ValueError) as e:
        check_folder(str(other), "tiny", target[1].meta)
    msg = str(e.value)
    assert all(s in msg for s in ("target_hidden_size 576", "vocab_size 49152", "[30]", "'qwen2.5-1.5b'")), msg


def test_the_conversion_is_cached_by_checksum(target, folder, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))
    model, t = target
    first = converted_gguf(folder, t.path, t.sha256, model.config.num_hidden_layers)
    assert first.parent == tmp_path / "cache" / "gguf" / "eagle3"
    stamp = first.stat().st_mtime_ns
    assert converted_gguf(folder, t.path, t.sha256, 8) == first and first.stat().st_mtime_ns == stamp  # reused
    assert converted_gguf(folder, t.path, "1" * 64, 8) != first  # another target GGUF: another file
    changed = tmp_path / "changed"
    shutil.copytree(folder, changed)
    cfg = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-5}))
    assert converted_gguf(changed, t.path, t.sha256, 8) != first  # another head: another file
    assert read_metadata(first)["general.architecture"] == "eagle3"
    assert not list(first.parent.glob("*.tmp"))


def test_the_server_starts_with_draft_eagle3_and_the_converted_file(target, folder, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("specstudy.backends.llamacpp.llamacpp_spec.gguf_file", lambda name: target[1])
    plan = check("eagle3", 4, {}, "tiny", str(folder))
    argv = server_argv(plan, threads=2, ctx_size=1024, parallel=1)
    assert argv[argv.index("--spec-type") + 1] == "draft-eagle3"
    assert argv[argv.index("--draft") + 1] == plan.draft.path and "/gguf/eagle3/" in plan.draft.path
    assert argv[argv.index("--draft-max") + 1] == "4"
    assert plan.provenance()["draft"]["name"] == str(folder)
    assert check("eagle3", 4, {}, "tiny", str(folder), convert=False).draft is None  # study load writes nothing
    assert len(list((tmp_path / "cache").rglob("*.gguf"))) == 1  # the one cell's file, no other


def test_study_load_refuses_a_bad_drafter_before_any_server(target, tmp_path, monkeypatch):
    monkeypatch.setattr("specstudy.backends.llamacpp.llamacpp_backend.needs_download", lambda f: False)
    monkeypatch.setattr("specstudy.backends.llamacpp.llamacpp_spec.gguf_file", lambda name: target[1])
    with pytest.raises(ValueError, match="no such folder"):
        LlamaCppBackend.check_cell(CellCheck("eagle3", 4, {}, "tiny", str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="needs a drafter"):
        LlamaCppBackend.check_cell(CellCheck("eagle3", 4, {}, "tiny", None))
    monkeypatch.setattr(
        "specstudy.backends.llamacpp.llamacpp_backend.needs_download", lambda f: True
    )  # target not here yet
    with pytest.raises(ValueError, match="no such folder"):
        LlamaCppBackend.check_cell(CellCheck("eagle3", 4, {}, "tiny", str(tmp_path / "nowhere")))
