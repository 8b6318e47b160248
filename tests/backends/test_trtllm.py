"""TensorRT-LLM backend against fixtures written from its documented formats (TensorRT-LLM cannot
run here: it needs an NVIDIA GPU).  The YAML keys and ``decoding_type`` spellings follow
``tensorrt_llm/llmapi/llm_args.py`` and docs/source/features/speculative-decoding.md; the
``/metrics`` iteration stats follow ``SpecDecodingStats`` (numDraftTokens, numAcceptedTokens,
numRequestsWithDraftTokens, acceptanceLength) as the 1.x PyExecutor fills them.  Parsing, not
measurement."""

import json
from pathlib import Path

import pytest
import yaml
from fake_servers import FakeServer, K, script

from specstudy import metrics
from specstudy.backends import get_backend
from specstudy.backends.trtllm.trtllm_server import (
    TrtllmEngineServerBackend,
    TrtllmServerBackend,
    chain,
    iteration_acceptance,
    parse_iteration_stats,
    speculative_config,
)
from specstudy.frameworks.declaration import CellCheck
from specstudy.records import Cell, Request, Sampling

RUNNER_OPTIONS = {
    "model": "meta-llama/Llama-2-70b-chat-hf",
    "drafter": None,
    "dtype": "bfloat16",
    "prefix_cache": False,
    "tensor_parallel_size": 4,
    "max_model_len": 4096,
}


def cell(method="draft_target", gamma=4, drafter="/d", **opts):
    return Cell(
        "t", "a100", "trtllm", method, "chat", "m", drafter=drafter, gamma=gamma, options=tuple(sorted(opts.items()))
    )


def test_decoding_types_as_the_docs_spell_them():
    assert speculative_config("ar", None, None, {}) is None
    assert speculative_config("draft_target", 4, "/d", {}) == {
        "decoding_type": "DraftTarget",
        "max_draft_len": 4,
        "speculative_model_dir": "/d",
    }
    med = speculative_config("medusa", 3, "/heads", {})
    assert med["decoding_type"] == "Medusa" and med["medusa_choices"] == [[0], [0, 0], [0, 0, 0]]
    assert med["num_medusa_heads"] == 3
    eg = speculative_config("eagle", 4, "/e", {})
    assert (eg["decoding_type"], eg["eagle_choices"], eg["num_eagle_layers"]) == ("Eagle", chain(4), 4)
    assert (
        speculative_config("eagle3", 4, "/e3", {})["decoding_type"] == "Eagle"
    )  # EAGLE-3 heads: no "Eagle3" type in 1.2
    ng = speculative_config("ngram", 4, None, {"ngram_max": 3})
    assert ng == {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 3,
        "is_public_pool": False,
        "is_keep_all": True,
        "is_use_oldest": True,
    }


TORCH_ONLY = json.loads((Path(__file__).parents[1] / "fixtures/trtllm/torch_only_llm_args.json").read_text())


def _yaml(argv):
    return yaml.safe_load(open(argv[argv.index("--extra_llm_api_options") + 1]))


def test_yaml_and_command_line_from_the_runners_options(tmp_path):
    eng = get_backend("trtllm-engine", **RUNNER_OPTIONS, log_dir=tmp_path, gpu_memory_utilization=0.85)
    argv = eng.server_argv(cell("medusa", 4, drafter="FasterDecoding/medusa-vicuna-33b-v1.3"))
    assert argv[:2] == ["trtllm-serve", "meta-llama/Llama-2-70b-chat-hf"]
    assert argv[argv.index("--backend") + 1] == "tensorrt"  # Medusa needs the TensorRT engine backend
    assert argv[argv.index("--tp_size") + 1] == "4" and argv[argv.index("--max_seq_len") + 1] == "4096"
    opts = _yaml(argv)
    assert opts["dtype"] == "bfloat16"
    assert opts["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.85}
    assert opts["speculative_config"]["speculative_model_dir"] == "FasterDecoding/medusa-vicuna-33b-v1.3"
    # TrtLlmArgs forbids the PyTorch backend's keys: none is written for the engine backend
    assert not set(opts) & set(TORCH_ONLY["torch_only"]), opts
    ar = eng.server_argv(cell("ar", None))  # the AR baseline of a Medusa cell: the same backend
    assert ar[ar.index("--backend") + 1] == "tensorrt" and not set(_yaml(ar)) & set(TORCH_ONLY["torch_only"])
    assert eng.run_acceptance([], [{"specDecodingStats": {}}], []) is None  # not exposed there: unseen
    b = get_backend("trtllm", **RUNNER_OPTIONS, log_dir=tmp_path, gpu_memory_utilization=0.85)
    dt = b.server_argv(cell("draft_target", 4))
    assert dt[dt.index("--backend") + 1] == "pytorch"
    assert _yaml(dt)["disable_overlap_scheduler"] is True and _yaml(dt)["enable_iter_perf_stats"] is True
    assert b.effective_prefix_cache is False
    with pytest.raises(ValueError, match=r"llm_api_options \['kv_cache_config'\] duplicate"):
        TrtllmServerBackend("m", llm_api_options={"kv_cache_config": {}}).llm_api_options(cell())


def test_check_and_describe():
    TrtllmEngineServerBackend.check_cell(CellCheck("medusa", 4, {}, drafter="/heads"))
    with pytest.raises(ValueError, match=r"method='medusa' is not available in TensorRT-LLM 1.2 \(trtllm\)"):
        TrtllmServerBackend.check_cell(
            CellCheck("medusa", 4, {}, drafter="/heads")
        )  # the PyTorch backend: trtllm-engine runs it
    with pytest.raises(
        ValueError,
        match=r"method='mtp' is not available in TensorRT-LLM 1.2 \(trtllm\); allowed: \['ar', 'draft_target'",
    ):
        TrtllmServerBackend.check_cell(CellCheck("mtp", 4, {}, drafter="/d"))
    with pytest.raises(ValueError, match=r"'topk' is read by no code.*\['eagle_choices'\]"):
        TrtllmEngineServerBackend.check_cell(CellCheck("eagle", 4, {"topk": 4}, drafter="/e"))
    with pytest.raises(ValueError, match="option 'tp' is read by no code"):
        TrtllmServerBackend("m", tp=2)
    assert "Medusa (tensorrt backend: α and AL not exposed): a chain of 4" in TrtllmServerBackend.describe(
        "medusa", 4, {}
    )
    assert "Eagle with an EAGLE-3 head (pytorch backend)" in TrtllmServerBackend.describe("eagle3", 4, {})
    assert "a tree of 3 nodes" in TrtllmServerBackend.describe("eagle", 2, {"eagle_choices": [[0], [1], [0, 0]]})


def test_iteration_stats_give_the_kits_alpha_and_al():
    # two iterations of a batch of 2 (PyExecutor convention: acceptanceLength = (acc + reqs) / reqs)
    stats = [
        {
            "iter": 1,
            "specDecodingStats": {
                "numDraftTokens": 0,
                "numAcceptedTokens": 0,
                "numRequestsWithDraftTokens": 0,
                "acceptanceLength": 0.0,
            },
        },
        {
            "iter": 2,
            "specDecodingStats": {
                "numDraftTokens": 8,
                "numAcceptedTokens": 5,
                "numRequestsWithDraftTokens": 2,
                "acceptanceLength": 3.5,
            },
        },
        {
            "iter": 3,
            "specDecodingStats": {
                "numDraftTokens": 8,
                "numAcceptedTokens": 3,
                "numRequestsWithDraftTokens": 2,
                "acceptanceLength": 2.5,
            },
        },
    ]
    a = iteration_acceptance(stats)
    assert (a["drafted_tokens"], a["accepted_tokens"], a["draft_steps"], a["iterations"]) == (16, 8, 4, 2)
    assert a["alpha"] == pytest.approx(0.5) and a["acceptance_length"] == pytest.approx(3.0)
    assert a["trtllm_convention"].startswith("includes the bonus")
    # a release that reports AL − 1 (accepted per drafting step): detected, the kit's AL unchanged
    minus1 = [
        dict(
            s,
            specDecodingStats={
                **s["specDecodingStats"],
                "acceptanceLength": s["specDecodingStats"]["acceptanceLength"] - 1,
            },
        )
        for s in stats[1:]
    ]
    b = iteration_acceptance(minus1)
    assert b["acceptance_length"] == pytest.approx(3.0) and b["trtllm_convention"].startswith("AL - 1")
    assert iteration_acceptance(stats[:1]) is None
    assert parse_iteration_stats(json.dumps([json.dumps(stats[1])])) == [stats[1]]  # stringified entries


def test_stream_and_run_scoped_iteration_stats():
    with FakeServer(mode="trtllm") as fake:
        b = get_backend("trtllm", model="m", base_url=fake.url, request_timeout_s=10)
        list(b.run([Request("w", "warm")], Sampling(max_new_tokens=13), cell()))  # earlier traffic, drained
        recs = list(
            b.run([Request("a", "hello"), Request("b", "", prompt_ids=(1, 2))], Sampling(max_new_tokens=13), cell())
        )
    steps = [c for c in script(13, True) if c["drafted"] is not None]
    for r in recs:
        assert r.status == "ok", r.error
        assert r.output_tokens == 13 == sum(r.chunk_tokens) and r.extra["chunk_token_count"] == "usage"
        assert max(r.chunk_tokens) > 1  # several tokens per verify step, counted from the usage deltas
        assert r.drafted_tokens is None  # trtllm-serve reports no per-request acceptance: not guessed
        assert r.extra["engine_prefix_cache"] is None  # attached: unknown
    run = b.last_run_acceptance
    assert run["drafted_tokens"] == 2 * K * len(steps)  # this run only: the warm-up was drained before it
    assert run["accepted_tokens"] == 2 * sum(c["accepted"] for c in steps)
    assert run["acceptance_length"] == pytest.approx(1 + run["accepted_tokens"] / run["draft_steps"])
    assert metrics.acceptance_summary(recs)["alpha"] is None


def test_the_kits_gamma_per_batch_is_trtllms_draft_len_schedule():
    """The kit's batch ranges become TensorRT-LLM's thresholds, which must start at {1: max_draft_len}."""
    cfg = speculative_config("eagle3", 4, "/e3", {"gamma_per_batch": "1-4:4,5-16:3,17-1024:1"})
    assert cfg["draft_len_schedule"] == {1: 4, 5: 3, 17: 1} and cfg["max_draft_len"] == 4
    assert "draft_len_schedule" not in speculative_config("eagle3", 4, "/e3", {})
    assert "its own draft length by batch size" in TrtllmServerBackend.describe(
        "eagle3", 4, {"gamma_per_batch": "1-4:4,5-16:3"}
    )
    for bad in ("1-4:3,5-16:2", "2-4:4", "1-4:4,6-16:2"):  # batch 1 not at γ; not from 1; a gap
        with pytest.raises(ValueError, match="contiguous ranges from batch 1 whose first γ is the cell's γ 4"):
            TrtllmServerBackend.check_cell(CellCheck("eagle3", 4, {"gamma_per_batch": bad}, drafter="/e3"))
    with pytest.raises(ValueError, match="'gamma_per_batch' is read by no code"):
        TrtllmEngineServerBackend.check_cell(CellCheck("medusa", 4, {"gamma_per_batch": "1-4:4"}, drafter="/m"))
