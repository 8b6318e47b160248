"""SGLang backend against SGLang 0.5.23's own option table and a response fixture (SGLang cannot
run here: no CPU build installs).  ``tests/fixtures/sglang-0.5.23-server-args.json`` was dumped
from the real ``ServerArgs.add_cli_args`` (command inside; a ``--no-deps`` install of the wheel);
``fake_servers.py`` answers in SGLang's native ``/generate`` format.  Parsing, not measurement.
"""

import dataclasses
from pathlib import Path

import pytest
from fake_servers import FakeServer, K, script
from fixtures.replay_argparse import parse

from specstudy import metrics
from specstudy.backends import get_backend
from specstudy.backends.sglang.sglang_server import SglangServerBackend, describe_sglang, meta_fields, speculative_flags
from specstudy.frameworks.declaration import CellCheck
from specstudy.records import Cell, Request, Sampling

ARGS = Path(__file__).parents[1] / "fixtures" / "sglang-0.5.23-server-args.json"
# what specstudy.run.pool.BackendPool._options builds for framework "sglang" (a100 profile, tp 4)
RUNNER_OPTIONS = {
    "max_model_len": 4096,
    "model": "meta-llama/Llama-2-70b-chat-hf",
    "drafter": None,
    "dtype": "bfloat16",
    "prefix_cache": False,
    "server_args": ["--tp-size", "4"],
}


def cell(method="eagle", gamma=K, **opts):
    return Cell(
        "t", "cpu", "sglang", method, "adhoc", "m", drafter="/d", gamma=gamma, options=tuple(sorted(opts.items()))
    )


def test_runner_options_parse_with_sglangs_own_argparse():
    b = get_backend("sglang", **{**RUNNER_OPTIONS, "python": "/py"})
    argv = b.server_argv(cell("eagle", 4))
    assert argv[:3] == ["/py", "-m", "sglang.launch_server"]
    ns = parse(ARGS, argv[3:])
    assert ns.disable_radix_cache is True  # prefix_cache False reaches SGLang (its radix cache is on by default)
    assert (ns.dtype, ns.context_length, ns.tp_size, ns.random_seed) == ("bfloat16", "4096", 4, 0)
    assert (
        ns.speculative_algorithm,
        ns.speculative_num_steps,
        ns.speculative_eagle_topk,
        ns.speculative_num_draft_tokens,
        ns.speculative_draft_model_path,
    ) == ("EAGLE", 4, 1, 5, "/d")
    on = parse(ARGS, SglangServerBackend("m", python="/py", prefix_cache=True).server_argv(cell("ar", None))[3:])
    assert not on.disable_radix_cache and on.speculative_algorithm is None


def test_ngram_is_a_chain_and_labelled_as_its_own_algorithm():
    ns = parse(ARGS, speculative_flags("ngram", 4, None, {}))
    assert (ns.speculative_algorithm, ns.speculative_num_draft_tokens) == ("NGRAM", 5)
    assert ns.speculative_ngram_min_bfs_breadth == ns.speculative_ngram_max_bfs_breadth == 1  # default would be 10
    d = SglangServerBackend.describe("ngram", 4, {})
    assert "its own algorithm" in d and "chain" in d and "flushed" in d
    assert "tree of breadth up to 10" in SglangServerBackend.describe("ngram", 4, {"ngram_breadth": 10})


def test_tree_budgets_are_explicit_and_described_as_trees():
    assert "5-node tree" in SglangServerBackend.describe("eagle", 4, {"topk": 4, "num_draft_tokens": 5})
    assert "chain" in SglangServerBackend.describe("eagle", 4, {})
    with pytest.raises(ValueError, match="topk=4 is a tree: give its budget num_draft_tokens explicitly"):
        SglangServerBackend.check_cell(CellCheck("eagle", 4, {"topk": 4}, drafter="/d"))
    with pytest.raises(ValueError, match="num_draft_tokens=99: allowed 2..17"):
        speculative_flags("eagle", 4, "/d", {"topk": 4, "num_draft_tokens": 99})
    ns = parse(ARGS, speculative_flags("eagle", 4, "/d", {"topk": 4, "num_draft_tokens": 16}))
    assert (ns.speculative_eagle_topk, ns.speculative_num_draft_tokens) == (4, 16)


def test_check_refuses_what_sglang_lacks():
    with pytest.raises(
        ValueError, match=r"method='medusa' is not available in SGLang 0.5.23; allowed: \['ar', 'eagle'"
    ):
        SglangServerBackend.check_cell(CellCheck("medusa", 4, {}, drafter="/d"))
    with pytest.raises(ValueError, match=r"'ngram_min' is read by no code.*\['ngram_breadth', 'ngram_max_trie_depth'"):
        SglangServerBackend.check_cell(CellCheck("ngram", 4, {"ngram_min": 2}, drafter=None))
    with pytest.raises(ValueError, match=r"dtype='float64': allowed \['auto', 'bfloat16', 'float16', 'float32'\]"):
        SglangServerBackend("m", dtype="float64")
    with pytest.raises(ValueError, match=r"option 'gpu_memory_fraction' is read by no code"):
        SglangServerBackend("m", gpu_memory_fraction=0.9)


def test_meta_fields_normalise_sglangs_nominal_counts():
    """SGLang 0.5.23 (tokenizer_manager): proposed = verify_ct × (draft tokens − 1), accept length =
    completion_tokens / verify_ct (prefill and bonus included); histogram up to the longest accept."""
    tree = {
        "completion_tokens": 21,
        "spec_verify_ct": 8,
        "spec_num_correct_drafts": 12,
        "spec_num_proposed_drafts": 8 * 15,
        "spec_correct_drafts_histogram": [2, 1, 1, 4],
        "spec_accept_length": 21 / 8,
    }
    f = meta_fields(tree, depth=4)  # top-k 4, 16 draft tokens: 15 nodes per step, a path of at most 4
    assert (f["draft_steps"], f["target_forwards"], f["drafted_tokens"], f["accepted_tokens"]) == (8, 9, 32, 12)
    assert f["accepted_per_position"] == [6, 5, 4, 0]  # position 4 never accepted: 0, not missing
    assert f["drafts_per_position"] == [8, 8, 8, 8]
    rec = Cell("t", "cpu", "sglang", "eagle", "x", "m", gamma=4).new_record(
        Request("a", "x"), Sampling(), output_tokens=21
    )
    for k, v in f.items():
        setattr(rec, k, v)
    s = metrics.acceptance_summary([rec])
    assert s["alpha"] == pytest.approx(12 / 32)
    assert 1 + f["accepted_tokens"] / f["draft_steps"] == pytest.approx(2.5) != tree["spec_accept_length"]
    old = {"spec_verify_ct": 8, "spec_accept_token_num": 12, "spec_draft_token_num": 24}
    assert meta_fields(old)["drafted_tokens"] == 24 and meta_fields(old, depth=3)["drafted_tokens"] == 24
    assert meta_fields({"completion_tokens": 5}) is None and meta_fields({"spec_verify_ct": 0}) is None


@pytest.mark.parametrize("names", ["new", "old"])
def test_native_stream_parsing_and_a_flush_per_cell(names):
    with FakeServer(mode="sglang", sglang_names=names) as fake:
        b = get_backend("sglang", model="m", base_url=fake.url, request_timeout_s=10)
        recs = list(
            b.run([Request("a", "hello"), Request("b", "", prompt_ids=(1, 2, 3))], Sampling(max_new_tokens=11), cell())
        )
        list(b.run([Request("c", "again")], Sampling(max_new_tokens=11), dataclasses.replace(cell(), repeat=1)))
        assert fake.state.flushes == 2  # once per cell: repeats start with a cold radix cache
    steps = [c for c in script(11, True) if c["drafted"] is not None]
    for r in recs:
        assert r.status == "ok", r.error
        assert r.output_tokens == 11 == sum(r.chunk_tokens) and r.output_ids == [
            i for c in script(11, True) for i in c["ids"]
        ]
        assert r.output_text.count("t") == 11
        assert r.target_forwards == len(steps) + 1 and r.draft_steps == len(steps)
        assert r.extra["sglang_tau"] == pytest.approx(11 / len(steps))
        assert (r.drafted_tokens, r.accepted_tokens) == (K * len(steps), sum(c["accepted"] for c in steps))
        assert r.extra["cache_flushed"] is True and r.extra["engine_prefix_cache"] is None  # attached: unknown
    assert metrics.acceptance_summary(recs)["tokens_per_forward"] == pytest.approx(11 / (len(steps) + 1))


def test_request_body_native_format():
    body = SglangServerBackend("m").request_body(
        Request("a", "", prompt_ids=(5, 6)), Sampling(max_new_tokens=7, temperature=0.5)
    )
    assert body["input_ids"] == [5, 6] and body["stream"] is True
    assert body["sampling_params"] == {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": -1,
        "ignore_eos": True,
    }


def test_the_warm_up_prefix_is_not_flushed_before_the_measured_requests():
    """One flush per cell, before its warm-up: with the prefix cache on, what the warm-up filled stays."""
    with FakeServer(mode="sglang") as fake:
        b = get_backend("sglang", model="m", base_url=fake.url, request_timeout_s=10)
        c = cell()
        b.send(Request("w", "warm up"), Sampling(max_new_tokens=3), c)  # the warm-up of the cell
        list(b.run([Request("a", "hello")], Sampling(max_new_tokens=5), c))
        assert fake.state.flushes == 1
        off = get_backend("sglang", model="m", base_url=fake.url, request_timeout_s=10, flush_cache=False)
        rec = next(iter(off.run([Request("b", "x")], Sampling(max_new_tokens=3), cell(gamma=K))))
        assert fake.state.flushes == 1 and rec.extra["cache_flushed"] is False
    assert "not flushed" in describe_sglang("ngram", 4, {}, flush=False)
    assert "flushed before every cell" in describe_sglang("ngram", 4, {})


def test_the_version_is_read_from_sglangs_current_endpoint():
    """N12: SGLang 0.5.23 serves /server_info and logs /get_server_info as deprecated; the fake serves
    only the current path, so a probe of the old one alone would read no version."""
    from specstudy.backends.sglang.sglang_server import SGLANG_INFO_PATHS

    assert SGLANG_INFO_PATHS[0] == "/server_info"
    with FakeServer(mode="sglang") as fake:
        b = get_backend("sglang", model="m", base_url=fake.url, request_timeout_s=10)
        assert b.version_probe(fake.url) == "0.5.23-fake"


def test_the_trtllm_declaration_says_what_eagle3_rows_write():
    """N12: TensorRT-LLM's sources declare an Eagle3 decoding type; the docstring no longer says there is none."""
    import specstudy.frameworks.trtllm as t

    assert "there is no ``Eagle3`` type" not in (t.__doc__ or "")
    assert "Eagle3DecodingConfig" in (t.__doc__ or "") and t.PYTORCH_DECODING["eagle3"] == "Eagle"


def test_a_request_that_accepted_nothing_keeps_its_per_position_counts():
    """N11: every step accepted nothing, so SGLang's histogram has one entry ([steps]); the request still
    counts, with zero accepted at each position: dropping it lifted α̂ for weak drafters."""
    meta = {
        "completion_tokens": 7,
        "spec_verify_ct": 6,
        "spec_num_correct_drafts": 0,
        "spec_correct_drafts_histogram": [6],
    }
    f = meta_fields(meta, depth=3)
    assert f["accepted_per_position"] == [0, 0, 0] and f["drafts_per_position"] == [6, 6, 6]
    strong = meta_fields({**meta, "spec_num_correct_drafts": 9, "spec_correct_drafts_histogram": [0, 3, 3]}, depth=3)
    recs = []
    for i, fields in enumerate((f, strong)):
        rec = Cell("t", "cpu", "sglang", "eagle3", "x", "m", gamma=3).new_record(Request(f"r{i}", "x"), Sampling())
        for k, v in fields.items():
            setattr(rec, k, v)
        recs.append(rec)
    pooled = metrics.acceptance_summary(recs)
    alone = metrics.acceptance_summary(recs[1:])
    assert pooled["alpha"] == pytest.approx(9 / 36) and alone["alpha"] == pytest.approx(9 / 18)
    # per position (unconditional: accepted at k / drafting steps): the weak request's 6 steps count
    assert pooled["per_position_unconditional"][0] == pytest.approx(6 / 12)
    assert alone["per_position_unconditional"][0] == pytest.approx(6 / 6)
    assert pooled["alpha_hat"] < alone["alpha_hat"]


def test_an_eagle_rows_label_says_the_head_runs_at_the_targets_context():
    """N3: decided (the override SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is never set; a longer
    context than the head's is refused at validation: tests/run/test_model_configs.py), labelled."""
    assert "the head runs at the target's context" in describe_sglang("eagle3", 3, {})
    assert "target's context" not in describe_sglang("draft_target", 3, {})
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in " ".join(speculative_flags("eagle3", 3, "h", {}))


def test_dflash_is_a_block_of_gamma_in_sglangs_own_flags():
    """Issue 46: SGLang 0.5.23's DFLASH verifies a window of γ + 1 (--speculative-dflash-block-size)."""
    ns = parse(ARGS, speculative_flags("dflash", 7, "/dflash", {}))
    assert (ns.speculative_algorithm, ns.speculative_dflash_block_size, ns.speculative_draft_model_path) == (
        "DFLASH",
        8,
        "/dflash",
    )
    assert "one forward" in describe_sglang("dflash", 7, {})
    with pytest.raises(ValueError, match="needs a drafter"):
        speculative_flags("dflash", 7, None, {})


def test_sglangs_own_adaptive_steps_reach_its_parser_and_only_for_a_chain():
    """``adaptive_steps: true`` is SGLang's --speculative-adaptive (draft steps chosen per batch-size tier
    from observed acceptance), parsed by SGLang's own argparse; SGLang runs it for EAGLE chains only."""
    ns = parse(ARGS, speculative_flags("eagle3", 3, "/d", {"adaptive_steps": True}))
    assert ns.speculative_adaptive is True and (ns.speculative_algorithm, ns.speculative_eagle_topk) == ("EAGLE3", 1)
    assert not parse(ARGS, speculative_flags("eagle3", 3, "/d", {})).speculative_adaptive  # its default: off
    assert "adaptive draft steps" in SglangServerBackend.describe("eagle3", 3, {"adaptive_steps": True})
    with pytest.raises(ValueError, match=r"adaptive_steps=true with method='eagle3', topk=4: allowed only"):
        SglangServerBackend.check_cell(
            CellCheck("eagle3", 3, {"adaptive_steps": True, "topk": 4, "num_draft_tokens": 8}, drafter="/d")
        )
    with pytest.raises(ValueError, match=r"'adaptive_steps' is read by no code"):
        SglangServerBackend.check_cell(CellCheck("ngram", 3, {"adaptive_steps": True}, drafter=None))


def test_a_targets_own_mtp_layers_are_sglangs_nextn_with_the_target_as_its_draft():
    """SGLang 0.5.23 runs MiMo's MTP layer as NEXTN (an EAGLE chain) whose draft is the target's own
    checkpoint: the server's argv names the target twice and no separate drafter."""
    b = SglangServerBackend("/mimo", python="py", dtype="bfloat16", prefix_cache=False)
    argv = b.server_argv(Cell("t", "h", "sglang", "mtp", "x", "m", gamma=3))
    ns = parse(ARGS, argv[argv.index("--speculative-algorithm") :])
    assert (ns.speculative_algorithm, ns.speculative_num_steps, ns.speculative_eagle_topk) == ("NEXTN", 3, 1)
    target = argv[argv.index("--model-path") + 1]
    assert ns.speculative_num_draft_tokens == 4 and ns.speculative_draft_model_path == target
