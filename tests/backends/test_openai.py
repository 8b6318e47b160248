"""Generic OpenAI-compatible backend against a llama.cpp-format fixture (not a measurement; the
live llama-server is not built here)."""

import asyncio

import pytest
from fake_servers import FakeServer, K, script

from specstudy.backends import get_backend
from specstudy.backends.openai.openai_server import OpenAIBackend
from specstudy.backends.sse import aiter_sse
from specstudy.records import Cell, Request, Sampling


def cell(method="draft_target", gamma=4):
    return Cell("t", "cpu", "openai", method, "adhoc", "m", gamma=gamma)


def test_llamacpp_timings_give_drafted_and_accepted_but_no_steps():
    with FakeServer(mode="llamacpp") as fake:
        b = get_backend("openai", model="m", base_url=fake.url, request_timeout_s=10)
        recs = list(b.run([Request("a", "hi"), Request("b", "ho")], Sampling(max_new_tokens=9), cell()))
    steps = [c for c in script(9, True) if c["drafted"] is not None]
    for r in recs:
        assert r.status == "ok", r.error
        assert r.output_tokens == 9 == len(r.chunk_times_s) and r.extra["chunk_token_count"] == "one_per_chunk"
        assert (r.drafted_tokens, r.accepted_tokens) == (K * len(steps), sum(c["accepted"] for c in steps))
        assert r.target_forwards is None and r.accepted_per_position is None  # not reported: not invented
        assert r.input_tokens == 5
    acc = b.last_run_acceptance
    assert acc["source"] == "per_request_sum" and acc["acceptance_length"] is None  # draft steps unknown
    assert acc["alpha"] == pytest.approx(sum(c["accepted"] for c in steps) / (K * len(steps)))


def test_server_without_acceptance_reports_none():
    with FakeServer(mode="llamacpp", spec=False) as fake:
        b = get_backend("openai", model="m", base_url=fake.url)
        recs = list(b.run([Request("a", "hi")], Sampling(max_new_tokens=4), cell("ar", None)))
    assert recs[0].status == "ok" and recs[0].drafted_tokens is None and b.last_run_acceptance is None


def test_llama_cpp_preset_is_refused_with_the_new_framework_named():
    with pytest.raises(ValueError, match="framework 'llamacpp'"):
        OpenAIBackend("/m.gguf", preset="llama.cpp")
    assert OpenAIBackend("m", preset=None, command="x --port {port}").server_argv(cell("ar", None))[0] == "x"


def test_generic_needs_a_url_or_a_command():
    with pytest.raises(ValueError, match="base_url"):
        OpenAIBackend("m").server_argv(cell())
    argv = OpenAIBackend("m", command="trtllm-serve {model} --port {port} --max_draft_len {gamma}").server_argv(
        cell("draft_target", 3)
    )
    assert argv == ["trtllm-serve", "m", "--port", "{port}", "--max_draft_len", "3"]


def test_bad_request_timeout_and_url_fail_fast():
    with pytest.raises(ValueError, match="request_timeout_s"):
        OpenAIBackend("m", request_timeout_s=0)
    with pytest.raises(ValueError, match="https"):
        OpenAIBackend("m", base_url="https://x")


async def _lines(text):
    for line in text.splitlines():
        yield line


async def _events(text):
    return [e async for e in aiter_sse(_lines(text))]


def test_sse_events_comments_and_multiline_data():
    text = ': keep-alive\n\ndata: {"a": 1}\n\ndata: line1\ndata: line2\n\nevent: x\ndata: [DONE]\n\n'
    assert asyncio.run(_events(text)) == ['{"a": 1}', "line1\nline2", "[DONE]"]
    # a stream that ends without the last blank line still yields its last event
    assert asyncio.run(_events("data: a\n\ndata: b")) == ["a", "b"]


class _ChatTokenizer:
    """A stand-in tokenizer: renders messages to ids deterministically (no files needed)."""

    def apply_chat_template(self, msgs, add_generation_prompt=True, tokenize=True):
        return [len(m["content"]) for m in msgs] + [7]


def test_chat_requests_are_sent_as_template_ids_like_the_in_process_engines():
    from specstudy.backends.base import encode_request
    from specstudy.backends.openai.openai_server import OpenAIBackend
    from specstudy.backends.sglang.sglang_server import SglangServerBackend
    from specstudy.records import Request, Sampling

    chat = Request("p", "hello", messages=(("system", "be brief"), ("user", "hello")))
    plain = Request("q", "just text")
    for cls in (OpenAIBackend, SglangServerBackend):
        b = cls("some-model", base_url="http://127.0.0.1:9")
        b._tokenizer = _ChatTokenizer()
        body = b.request_body(chat, Sampling())
        sent = body.get("prompt", body.get("input_ids"))
        assert sent == encode_request(b._tokenizer, chat) == [8, 5, 7]
        body = b.request_body(plain, Sampling())
        assert body.get("prompt", body.get("text")) == "just text"
