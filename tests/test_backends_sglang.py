"""SGLang backend against a format fixture (SGLang cannot run here): parsing, not measurement."""

import pytest

from specstudy import metrics
from specstudy.backends import get_backend
from specstudy.backends.sglang_server import SglangServerBackend, meta_fields, speculative_flags
from specstudy.records import Cell, Request, Sampling

from fake_servers import K, FakeServer, script


def cell(method="eagle", gamma=3):
    return Cell("t", "cpu", "sglang", method, "adhoc", "m", drafter="/d", gamma=gamma)


def test_launch_flags():
    assert speculative_flags("ar", None, None, {}) == []
    f = speculative_flags("eagle3", 3, "/d", {})
    assert f[:4] == ["--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "4"]
    assert f[f.index("--speculative-num-steps") + 1] == "3" and f[f.index("--speculative-eagle-topk") + 1] == "1"
    assert f[-2:] == ["--speculative-draft-model-path", "/d"]
    assert speculative_flags("ngram", 5, None, {}) == ["--speculative-algorithm", "NGRAM",
                                                        "--speculative-num-draft-tokens", "6"]
    assert "STANDALONE" in speculative_flags("draft_target", 2, "/d", {})
    with pytest.raises(ValueError, match="medusa"):
        speculative_flags("medusa", 2, "/d", {})
    with pytest.raises(ValueError, match="drafter"):
        speculative_flags("eagle", 2, None, {})
    argv = SglangServerBackend("/m", python="/py").server_argv(cell())
    assert argv[:3] == ["/py", "-m", "sglang.launch_server"] and "--model-path" in argv


def test_meta_fields_both_name_generations_and_by_position():
    new = {"completion_tokens": 20, "spec_verify_ct": 8, "spec_num_correct_drafts": 12,
           "spec_num_proposed_drafts": 24, "spec_correct_drafts_histogram": [2, 1, 1, 4]}
    f = meta_fields(new)
    assert (f["target_forwards"], f["drafted_tokens"], f["accepted_tokens"]) == (9, 24, 12)  # + the prefill
    assert f["accepted_per_position"] == [6, 5, 4] and f["drafts_per_position"] == [8, 8, 8]
    old = {"spec_verify_ct": 8, "spec_accept_token_num": 12, "spec_draft_token_num": 24}
    assert meta_fields(old)["accepted_tokens"] == 12 and meta_fields(old)["accepted_per_position"] is None
    by_pos = dict(new, spec_num_proposed_drafts_by_position=[8, 8, 7], spec_num_correct_drafts_by_position=[6, 5, 1])
    assert meta_fields(by_pos)["drafts_per_position"] == [8, 8, 7]
    assert meta_fields({"completion_tokens": 5}) is None  # no speculation: nothing invented
    assert meta_fields({"spec_verify_ct": 0}) is None


@pytest.mark.parametrize("names", ["new", "old"])
def test_native_stream_parsing(names):
    with FakeServer(mode="sglang", sglang_names=names) as fake:
        b = get_backend("sglang", model="m", base_url=fake.url, request_timeout_s=10)
        recs = list(b.run([Request("a", "hello"), Request("b", "", prompt_ids=(1, 2, 3))], Sampling(max_new_tokens=11), cell()))
    steps = [c for c in script(11, True) if c["drafted"] is not None]
    for r in recs:
        assert r.status == "ok", r.error
        assert r.output_tokens == 11 == sum(r.chunk_tokens) and r.output_ids == [i for c in script(11, True) for i in c["ids"]]
        assert r.output_text.count("t") == 11  # cumulative text kept once, not concatenated
        assert r.input_tokens == 5
        assert r.target_forwards == len(steps) + 1  # the prefill forward + spec_verify_ct
        assert r.extra["sglang_tau"] == pytest.approx(11 / len(steps))  # SGLang's own convention
        assert (r.drafted_tokens, r.accepted_tokens) == (K * len(steps), sum(c["accepted"] for c in steps))
        assert r.extra["server"]["version"] == "0.5.23-fake"
    assert metrics.acceptance_summary(recs)["tau"] == pytest.approx(11 / (len(steps) + 1))
    assert b.last_run_acceptance["source"] == "per_request_sum"


def test_request_body_native_format():
    b = SglangServerBackend("m")
    body = b.request_body(Request("a", "", prompt_ids=(5, 6)), Sampling(max_new_tokens=7, temperature=0.5, top_k=0))
    assert body["input_ids"] == [5, 6] and body["stream"] is True
    assert body["sampling_params"] == {"max_new_tokens": 7, "temperature": 0.5, "top_p": 1.0, "top_k": -1,
                                       "ignore_eos": True}
