"""The llama.cpp backend: request building, command lines, validation, parsing of llama.cpp's real
wire format (fixtures captured from xllamacpp 2026.10.11549 by tests/fixtures/llamacpp/capture.py)
and, marked slow, the embedded SmolLM2 through a kit-started llama.cpp server."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import gguf
import numpy as np
import pytest

from specstudy.backends import get_backend
from specstudy.backends.llamacpp.costs import forward_ms_by_tokens
from specstudy.backends.llamacpp.gguf_meta import file_type_name, read_metadata, vocab_mismatch
from specstudy.backends.llamacpp.llamacpp_backend import (
    LlamaCppBackend,
    chunk_trace,
    counter_acceptance,
    forward_ms,
    steps_from_trace,
)
from specstudy.backends.llamacpp.llamacpp_spec import GgufFile, Plan, SpecConfig, server_argv, spec_config
from specstudy.backends.prometheus import parse_prometheus
from specstudy.backends.rss import TreeRssSampler
from specstudy.backends.sse import StreamState
from specstudy.data import fetch, model_files
from specstudy.records import Cell, Request, RequestRecord, Sampling

FIXTURES = Path(__file__).parents[1] / "fixtures" / "llamacpp"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"completion_{name}.json").read_text())


def write_gguf(path: Path, tokens: list[str], file_type: int = 3, eos: int = 1) -> Path:
    """A synthetic GGUF with just the header fields the backend reads (no usable weights)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_bos_token_id(0)
    w.add_eos_token_id(eos)
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cell(method="ngram", gamma=4, drafter=None, batch=1, **options):
    return Cell(
        "t",
        "cpu",
        "llamacpp",
        method,
        "adhoc",
        "m",
        drafter=drafter,
        gamma=gamma,
        batch_size=batch,
        options=tuple(sorted(options.items())),
    )


def plan(spec: SpecConfig, draft: bool = False) -> Plan:
    f = GgufFile("m", "/models/t.gguf", "0" * 64, "Q4_1", 4)
    return Plan(spec=spec, model=f, draft=GgufFile("d", "/models/d.gguf", "1" * 64, "Q4_1", 4) if draft else None)


# ---- request building ----------------------------------------------------------------------


def test_only_a_server_the_kit_starts_skips_the_studys_warm_up():
    assert LlamaCppBackend("m").warms_itself  # started with llama.cpp's own warm-up at load
    assert not LlamaCppBackend("m", base_url="http://127.0.0.1:9").warms_itself  # someone else's: maybe --no-warmup


def test_request_sends_template_ids_cache_prompt_and_every_sampling_field():
    b = LlamaCppBackend("m", base_url="http://127.0.0.1:9", threads=2, prefix_cache=False)
    s = Sampling(temperature=0.7, top_p=0.9, top_k=0, seed=11, max_new_tokens=33, ignore_eos=True)
    body = b.request_body(Request("p", "hi", prompt_ids=(5, 6, 7)), s)
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 33
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (0.7, 0.9, 0, 11)
    assert body["min_p"] == 0.0  # llama.cpp's default 0.05 would cut the distribution
    assert body["ignore_eos"] is True and body["cache_prompt"] is False
    assert body["stream"] and body["timings_per_token"] and body["return_tokens"]
    on = LlamaCppBackend("m", base_url="http://127.0.0.1:9", prefix_cache=True)
    assert on.request_body(Request("p", "x", prompt_ids=(1,)), Sampling(ignore_eos=False, top_k=5)) == {
        **body,
        "prompt": [1],
        "cache_prompt": True,
        "ignore_eos": False,
        "top_k": 5,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": 0,
        "n_predict": 64,
    }


def test_chat_requests_use_the_kit_chat_template():
    class Tok:
        def apply_chat_template(self, msgs, add_generation_prompt=True, tokenize=True):
            return [len(m["content"]) for m in msgs] + [9]

    b = LlamaCppBackend("m", base_url="http://127.0.0.1:9")
    b._tokenizer = Tok()
    body = b.request_body(Request("p", "hello", messages=(("user", "hello"),)), Sampling())
    assert body["prompt"] == [5, 9]


def test_constructor_rejects_bad_options():
    with pytest.raises(ValueError, match="threads=0"):
        LlamaCppBackend("m", threads=0)
    with pytest.raises(ValueError, match="prefix_cache"):
        LlamaCppBackend("m", prefix_cache="off")
    with pytest.raises(FileNotFoundError, match="llama_server=/no/such"):
        LlamaCppBackend("m", llama_server="/no/such/llama-server")
    assert get_backend("llamacpp", model="m", base_url="http://127.0.0.1:9").framework == "llamacpp"


# ---- configuration and command lines -------------------------------------------------------


def val(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_kit_entry_point_argv_per_method():
    ar = server_argv(plan(spec_config("ar", None)), threads=2, ctx_size=1024, parallel=1, python="/py")
    assert ar[:3] == ["/py", "-m", "specstudy.backends.llamacpp.serve"]
    assert val(ar, "--model") == "/models/t.gguf" and val(ar, "--port") == "{port}" and val(ar, "--host") == "{host}"
    assert val(ar, "--threads") == "2" and "--spec-type" not in ar
    ng = server_argv(plan(spec_config("ngram", 4)), threads=1, ctx_size=1024, parallel=2)
    assert val(ng, "--spec-type") == "ngram-simple" and val(ng, "--draft-max") == "4"
    assert (val(ng, "--ngram-size-n"), val(ng, "--ngram-size-m")) == ("3", "4")  # defaults: 3 and m = γ
    assert val(ng, "--ctx-size") == "2048" and val(ng, "--parallel") == "2"  # ctx_size is per slot
    dt = server_argv(plan(spec_config("draft_target", 3, {"draft_p_min": 0.5}), draft=True), 1, 512, 1)
    assert val(dt, "--spec-type") == "draft-simple" and val(dt, "--draft") == "/models/d.gguf"
    assert (val(dt, "--draft-max"), val(dt, "--draft-min"), val(dt, "--draft-p-min")) == ("3", "0", "0.5")


def test_user_llama_server_argv_uses_its_own_flag_names():
    argv = server_argv(
        plan(spec_config("ngram", 6, {"ngram_size_n": 2, "ngram_size_m": 5})),
        4,
        1024,
        1,
        llama_server="/opt/llama-server",
    )
    assert argv[0] == "/opt/llama-server" and val(argv, "--model") == "/models/t.gguf"
    assert val(argv, "--spec-type") == "ngram-simple" and val(argv, "--spec-draft-n-max") == "6"
    assert (val(argv, "--spec-ngram-simple-size-n"), val(argv, "--spec-ngram-simple-size-m")) == ("2", "5")
    with pytest.raises(ValueError, match="ngram_size_m=8 > gamma=6"):
        spec_config("ngram", 6, {"ngram_size_m": 8})
    assert val(argv, "--threads") == val(argv, "--threads-batch") == "4" and "--metrics" in argv
    dt = server_argv(plan(spec_config("draft_target", 2), draft=True), 2, 1024, 1, llama_server="/opt/llama-server")
    assert val(dt, "--spec-draft-model") == "/models/d.gguf" and val(dt, "--spec-draft-threads") == "2"
    k4v = server_argv(
        plan(spec_config("ngram", 3, {"spec_type": "ngram-map-k4v", "ngram_min_hits": 2})), 1, 64, 1, llama_server="/x"
    )
    assert val(k4v, "--spec-ngram-map-k4v-min-hits") == "2" and val(k4v, "--spec-ngram-map-k4v-size-n") == "3"


def test_synthetic_acceptance_maps_to_llamacpp_synth_flags():
    """alpha=a → --spec-synth-rates a, a², …, a^γ (llama.cpp's unconditional rates); length=L → --spec-synth-len L."""
    rates = spec_config("ngram", 3, {"synthetic_acceptance": "alpha=0.5"})
    assert rates.synthetic == (("synth_rates", (0.5, 0.25, 0.125)),)
    assert val(server_argv(plan(rates), 1, 64, 1), "--synth-rates") == "0.5,0.25,0.125"
    user = server_argv(plan(rates), 1, 64, 1, llama_server="/x")
    assert val(user, "--spec-synth-rates") == "0.5,0.25,0.125" and "--synth-rates" not in user
    length = spec_config("draft_target", 4, {"synthetic_acceptance": "length=2.5"})
    assert val(server_argv(plan(length, draft=True), 1, 64, 1, llama_server="/x"), "--spec-synth-len") == "2.5"
    assert length.as_dict()["synthetic"] == {"synth_len": 2.5}
    plain = server_argv(plan(spec_config("ngram", 3)), 1, 64, 1)
    assert not any("synth" in a for a in plain)
    with pytest.raises(ValueError, match=r"length=5.0 cannot be reached with gamma=3"):
        spec_config("ngram", 3, {"synthetic_acceptance": "length=5"})
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        spec_config("draft_target", 3, {"synthetic_acceptance": "alpha=1.5"})
    with pytest.raises(ValueError, match="not understood"):
        spec_config("ar", None, {"synthetic_acceptance": "alpha=0.5"})


def test_backend_argv_follows_the_cell_and_restarts_per_configuration(tmp_path):
    g = str(write_gguf(tmp_path / "t.gguf", ["a", "b"]))
    b = LlamaCppBackend(g, threads=3, ctx_size=256)
    a1, a2 = b.server_argv(cell("ngram", 4)), b.server_argv(cell("ngram", 4, batch=2))
    assert val(a1, "--model") == str(Path(g).resolve()) and val(a1, "--threads") == "3"
    assert val(a2, "--parallel") == "2" and val(a2, "--ctx-size") == "512"
    keys = {b.server_key(c) for c in (cell("ngram", 4), cell("ngram", 4, rate=3.0), cell("ngram", 5), cell("ar", None))}
    assert len(keys) == 3  # the offered rate does not restart the server; γ and the method do


def test_the_study_run_options_on_every_cell_are_not_server_options(tmp_path):
    run = {
        "max_new_tokens": 64,
        "prompts": 3,
        "prefix_cache": False,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "ignore_eos": True,
        "dtype": "float32",
        "tp": 1,
        "request_rate": "inf",
    }
    assert spec_config("ngram", 4, {**run, "ngram_max": 3}) == spec_config("ngram", 4, {"ngram_max": 3})
    b = LlamaCppBackend(str(write_gguf(tmp_path / "t.gguf", ["a", "b"])), prefix_cache=False)
    assert b.server_key(cell("ar", None, **run)) == b.server_key(cell("ar", None))
    with pytest.raises(
        ValueError, match="asks prefix_cache=True but this llamacpp backend was built with prefix_cache=False"
    ):
        b.server_argv(cell("ar", None, prefix_cache=True))


def test_ngram_options_map_to_llamacpp_sizes():
    assert dict(spec_config("ngram", 4, {"ngram_max": 2}).ngram) == {"size_n": 2, "size_m": 4}
    # llama.cpp never drafts when m < n, so a short γ shortens the default n-gram and a long one is refused
    short = spec_config("ngram", 2)
    assert dict(short.ngram) == {"size_n": 2, "size_m": 2} and "shortened from 3" in short.ngram_note
    assert dict(spec_config("ngram", 1).ngram) == {"size_n": 1, "size_m": 1}
    assert dict(spec_config("ngram", 8, {"ngram_min": 2, "ngram_max": 2}).ngram) == {"size_n": 2, "size_m": 8}
    mod = spec_config("ngram", 4, {"spec_type": "ngram-mod", "ngram_mod_n_match": 8, "rate": 2.0})
    assert mod.spec_type == "ngram-mod" and dict(mod.ngram) == {"n_match": 8, "mod_n_min": 1, "mod_n_max": 4}
    argv = server_argv(plan(mod), 1, 64, 1, llama_server="/x")
    assert (val(argv, "--spec-ngram-mod-n-max"), val(argv, "--spec-draft-n-max")) == ("4", "4")


@pytest.mark.parametrize(
    "method, gamma, options, match",
    [
        ("eagle", 4, {}, r"draft-eagle3\) is refused: runs EAGLE-3 heads only \(method eagle3"),
        ("medusa", 4, {}, r"method='medusa' is not known; allowed: \['ar', 'ngram', 'draft_target', 'eagle3'\]"),
        ("ngram", None, {}, "needs gamma >= 1"),
        ("ngram", 4, {"ngram_min": 1, "ngram_max": 3}, "exactly one n-gram length"),
        ("ngram", 4, {"prompt_lookup_max": 3}, r"\['prompt_lookup_max'\] not understood; allowed: \["),
        (
            "ngram",
            4,
            {"spec_type": "draft-mtp"},
            r"spec_type='draft-mtp' .*multi-token-prediction.*allowed: \['ngram-simple'",
        ),
        ("ngram", 4, {"spec_type": "ngram-mod", "ngram_size_n": 3}, r"does not use option\(s\) \['ngram_size_n'\]"),
        ("ngram", 2, {"spec_type": "ngram-mod", "ngram_mod_n_min": 3}, "ngram_mod_n_min=3 > gamma=2"),
        ("ngram", 4, {"spec_type": "ngram-cache"}, r"'ngram-cache' .*ignores the draft n_max.*allowed: \["),
        ("ngram", 4, {"ngram_size_n": 0}, "ngram_size_n=0: must be an integer >= 1"),
        ("ngram", 2, {"ngram_max": 4}, r"n-gram length 4 > ngram_size_m=2: .*allowed: ngram_max \(ngram_size_n\) <= 2"),
        ("draft_target", 4, {"draft_p_min": 2}, r"draft_p_min=2: must be a number in \[0, 1\]"),
        (
            "draft_target",
            4,
            {"dynamic_gamma": "cost"},
            r"\['dynamic_gamma'\] not understood; allowed: \['draft_min', 'draft_p_min', 'synthetic_acceptance'\]",
        ),
        ("ar", None, {"ngram_max": 3}, r"\['ngram_max'\] not understood; allowed: \[\]"),
        ("ar", None, {"tp": 2}, "tp=2: the llamacpp backend runs one CPU process"),
    ],
)
def test_bad_cells_are_refused_naming_value_and_allowed(method, gamma, options, match):
    with pytest.raises(ValueError, match=match):
        spec_config(method, gamma, options)


# ---- files: precision, sha256, vocabulary --------------------------------------------------


def test_gguf_metadata_names_precision_and_vocab(tmp_path):
    meta = read_metadata(write_gguf(tmp_path / "t.gguf", ["a", "b", "c"], file_type=15))
    assert file_type_name(meta) == "Q4_K_M" and meta["tokenizer.ggml.tokens"] == ["a", "b", "c"]
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="junk.gguf: not a readable GGUF"):
        read_metadata(bad)


def test_check_refuses_a_draft_with_another_vocabulary(tmp_path):
    t = write_gguf(tmp_path / "t.gguf", ["a", "b", "c", "d"])
    small = write_gguf(tmp_path / "small.gguf", ["a", "b", "c"])
    other = write_gguf(tmp_path / "other.gguf", ["a", "X", "c", "d"])
    with pytest.raises(
        ValueError, match=r"vocabulary sizes differ: target .*t.gguf has 4 tokens, draft .*small.gguf has 3"
    ):
        LlamaCppBackend.check("draft_target", 4, {}, str(t), str(small))
    with pytest.raises(ValueError, match=r"token id 1 differs: target .* 'b', draft .* 'X'"):
        LlamaCppBackend.check("draft_target", 4, {}, str(t), str(other))
    eos = write_gguf(tmp_path / "eos.gguf", ["a", "b", "c", "d"], eos=2)
    assert "eos_token_id differs" in vocab_mismatch(read_metadata(t), read_metadata(eos))
    ok = LlamaCppBackend.check(
        "draft_target", 4, {}, str(t), str(write_gguf(tmp_path / "d.gguf", ["a", "b", "c", "d"]))
    )
    assert ok.draft.precision == "Q4_1" and ok.model.sha256 == fetch.sha256_file(t)
    with pytest.raises(ValueError, match="needs a drafter"):
        LlamaCppBackend.check("draft_target", 4, {}, str(t), None)


def test_check_refuses_missing_and_corrupt_gguf_before_loading(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="GGUF /no/such.gguf: no such file"):
        LlamaCppBackend.check("ar", None, {}, "/no/such.gguf")
    g = write_gguf(tmp_path / "t.gguf", ["a", "b"])
    params = tmp_path / "params"
    (params / "models").mkdir(parents=True)
    (params / "models" / "pinned.yaml").write_text(
        f"name: pinned\nsource: gguf_path\npath: {g}\nsha256: '{'0' * 64}'\n"
    )
    monkeypatch.setenv("SPECSTUDY_PARAMS", str(params))
    with pytest.raises(
        ValueError, match=rf"{re.escape(str(g))}: sha256 [0-9a-f]{{64}} does not match the pinned {'0' * 64}"
    ):
        LlamaCppBackend.check("ar", None, {}, "pinned")


# ---- parsing llama.cpp's real responses ----------------------------------------------------


def replay(b: LlamaCppBackend, events: list[str]) -> StreamState:
    st = StreamState()
    for e in events:
        b.consume(json.loads(e), st)
    return st


def metric_deltas(fx: dict) -> dict:
    return counter_acceptance(
        parse_prometheus("\n".join(fx["metrics_before"])), parse_prometheus("\n".join(fx["metrics_after"]))
    )


def test_fixture_steps_equal_llamacpp_own_counters():
    fx = fixture("ngram")
    b = LlamaCppBackend("m", base_url="http://127.0.0.1:9")
    st = replay(b, fx["events"])
    final = json.loads(fx["events"][-1])
    steps, why = steps_from_trace(chunk_trace(st), [0.01 * i for i in range(len(chunk_trace(st)))], st.timings)
    assert why == "ok"
    c = metric_deltas(fx)
    drafted = [s for s in steps if s.drafted]
    assert (
        (len(drafted), sum(s.drafted for s in steps), sum(s.accepted for s in steps))
        == (c["drafts"], c["drafted_tokens"], c["accepted_tokens"])
        == (c["drafts"], final["timings"]["draft_n"], final["timings"]["draft_n_accepted"])
    )
    depth = max(s.drafted for s in steps)
    assert [sum(1 for s in drafted if s.accepted >= k) for k in range(1, depth + 1)] == c["accepted_per_position"]
    assert sum(s.emitted for s in steps) == final["tokens_predicted"] == len(st.output_ids)
    ms = forward_ms(chunk_trace(st), [0.0] * len(chunk_trace(st)))
    assert len(ms) == len(steps) - 1 and all(m > 0 for m in ms)
    rec = RequestRecord(
        "s", "cpu", "llamacpp", "ngram", "adhoc", "p", 0, "c", "m", steps=steps, extra={"llamacpp_forward_ms": ms}
    )
    by_k = forward_ms_by_tokens([rec])
    assert sum(len(v) for v in by_k.values()) == len(ms) and len(by_k[5]) == len(drafted)  # 4 drafts + 1
    assert st.finish_reason == "length" and st.usage["prompt_tokens"] == len(fx["request"]["prompt"])


def test_fixture_ar_has_one_forward_per_token_and_no_drafts():
    fx = fixture("ar")
    st = replay(LlamaCppBackend("m", base_url="http://127.0.0.1:9"), fx["events"])
    steps, why = steps_from_trace(chunk_trace(st), [0.0] * len(chunk_trace(st)), st.timings)
    assert why == "ok" and len(steps) == len(st.output_ids) and not any(s.drafted for s in steps)
    assert "draft_n" not in st.timings and metric_deltas(fx)["drafts"] == 0


def test_inconsistent_traces_are_not_turned_into_steps():
    final = {"draft_n": 4, "draft_n_accepted": 2}
    ok = [(1, 0.0, 0, 0), (1, 5.0, 4, 2), (1, 5.0, 4, 2), (1, 5.0, 4, 2)]
    assert steps_from_trace(ok, [0.0, 1, 2, 3], final)[1] == "ok"
    assert "per-token timings" in steps_from_trace([(1, None, 0, 0)], [0.0], {})[1]
    assert "emitted 2 tokens for 2 accepted" in steps_from_trace(ok[:3] + [(1, 6.0, 4, 2)], [0.0, 1, 2, 3], final)[1]
    assert "final timings say (5, 2)" in steps_from_trace(ok, [0.0, 1, 2, 3], {"draft_n": 5, "draft_n_accepted": 2})[1]
    assert "changed inside one forward" in steps_from_trace([(1, 0.0, 0, 0), (1, 0.0, 4, 2)], [0.0, 1], final)[1]


class _Replay(BaseHTTPRequestHandler):
    """Serves a captured llama.cpp exchange verbatim: /health, /props, /metrics, streamed /completion."""

    fx: ClassVar[dict] = {}
    posted = False
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, body: str, ctype="application/json"):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send('{"status":"ok"}')
        elif self.path == "/props":
            self._send(json.dumps({"build_info": "b0-unknown", "model_ftype": "Q4_1", "model_path": "/m.gguf"}))
        elif self.path == "/metrics":
            self._send(
                "\n".join(self.fx["metrics_after" if type(self).posted else "metrics_before"]) + "\n", "text/plain"
            )
        else:
            self.send_error(404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posted = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for e in self.fx["events"]:
            self.wfile.write(f"data: {e}\n\n".encode())
        self.close_connection = True


def test_attached_server_goes_through_the_same_parsing():
    fx = fixture("ngram")
    handler = type("H", (_Replay,), {"fx": fx, "posted": False})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        b = LlamaCppBackend("m", base_url=f"http://127.0.0.1:{httpd.server_address[1]}")
        [rec] = b.run(
            [Request("p", "x", prompt_ids=tuple(fx["request"]["prompt"]))], Sampling(max_new_tokens=24), cell()
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    c = metric_deltas(fx)
    assert rec.status == "ok" and rec.output_tokens == 24 and rec.chunk_tokens == [1] * 24
    assert (rec.draft_steps, rec.drafted_tokens, rec.accepted_tokens) == (
        c["drafts"],
        c["drafted_tokens"],
        c["accepted_tokens"],
    )
    assert rec.accepted_per_position == c["accepted_per_position"]
    assert rec.target_forwards == 24 - rec.accepted_tokens and rec.peak_memory_bytes is None
    assert rec.extra["precision"] == "Q4_1" and rec.extra["llamacpp"]["build"]["launcher"] == "attached"
    assert b.last_run_acceptance["counters_match"] is True
    # cache_prompt goes with every request, so even an attached server's prefix cache is the kit's setting
    assert rec.extra["engine_prefix_cache"] is False
    assert LlamaCppBackend("m", base_url="http://127.0.0.1:1", prefix_cache=True).effective_prefix_cache is True


def test_tree_rss_sampler_reads_this_process():
    import os

    with TreeRssSampler(os.getpid(), 0.01) as s:
        bytearray(10_000_000)
    assert s.peak > 10_000_000 and s.samples >= 2


def test_entry_point_builds_xllamacpp_params_without_loading():
    import xllamacpp as xl

    from specstudy.backends.llamacpp.serve import build_params, parser

    a = parser().parse_args(
        [
            "--model",
            "/m.gguf",
            "--port",
            "5",
            "--threads",
            "2",
            "--ctx-size",
            "512",
            "--spec-type",
            "ngram-simple",
            "--draft-max",
            "4",
            "--draft-min",
            "0",
            "--ngram-size-n",
            "3",
            "--ngram-size-m",
            "6",
        ]
    )
    p = build_params(a)
    assert p.model.path == "/m.gguf" and p.port == 5 and p.n_ctx == 512 and p.endpoint_metrics
    assert p.warmup is True  # llama.cpp warms itself up at load: the study sends this server no warm-up
    assert p.cpuparams.n_threads == p.cpuparams_batch.n_threads == p.speculative.draft.cpuparams.n_threads == 2
    assert p.speculative.types == [xl.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
    assert (p.speculative.draft.n_max, p.speculative.ngram_simple.size_n, p.speculative.ngram_simple.size_m) == (
        4,
        3,
        6,
    )
    d = build_params(
        parser().parse_args(
            [
                "--model",
                "/t.gguf",
                "--port",
                "5",
                "--threads",
                "1",
                "--spec-type",
                "draft-simple",
                "--draft",
                "/d.gguf",
                "--draft-p-min",
                "0.25",
            ]
        )
    )
    assert d.speculative.draft.mparams.path == "/d.gguf" and d.speculative.draft.p_min == 0.25
    base = ["--model", "/t.gguf", "--port", "5", "--threads", "1", "--spec-type", "draft-simple", "--draft-max", "3"]
    synth = build_params(parser().parse_args([*base, "--synth-rates", "0.5,0.25,0.125"]))
    assert list(synth.speculative.synth_rates) == [0.5, 0.25, 0.125] and synth.speculative.synth_len == -1
    assert build_params(parser().parse_args([*base, "--synth-len", "2.5"])).speculative.synth_len == 2.5


# ---- live: the embedded SmolLM2 through a kit-started llama.cpp server ---------------------


def _log_mean_lens(path: str) -> list[tuple[int, int, float]]:
    """llama.cpp's own per-request line: 'draft acceptance = x (a accepted / d generated), mean len = m'."""
    pat = re.compile(r"draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([\d.]+)")
    return [(int(a), int(d), float(m)) for a, d, m in pat.findall(Path(path).read_text(errors="replace"))]


@pytest.mark.slow
def test_live_smollm2_ar_and_ngram_counts_equal_llamacpp_own(tmp_path):
    ids = json.loads((FIXTURES / "prompt_ids.json").read_text())["ids"]
    reqs = [Request(k, "", prompt_ids=tuple(v)) for k, v in ids.items()]
    sampling = Sampling(max_new_tokens=40)  # greedy, ignore_eos
    b = LlamaCppBackend("smollm2-135m", threads=1, log_dir=tmp_path)
    try:
        ar = list(b.run(reqs, sampling, cell("ar", None)))
        ng = list(b.run(reqs, sampling, cell("ngram", 4)))
        ng2 = list(b.run(reqs, sampling, cell("ngram", 2)))
        log, pid = b.server_info.log_path, b.server.proc.pid
    finally:
        b.close()
    # γ bounds every draft (llama.cpp's n-gram drafts are m tokens, so the kit sets m = γ)
    for gamma, rows in ((4, ng), (2, ng2)):
        assert sum(r.draft_steps for r in rows) > 0
        assert all(len(r.drafts_per_position) <= gamma and r.drafted_tokens <= gamma * r.draft_steps for r in rows)
    run = ng[0].extra["run_scope"]["acceptance"]
    for r in ar + ng:
        assert r.status == "ok" and r.output_tokens == 40 == len(r.output_ids), r.error
        assert r.extra["llamacpp_timings"]["cache_n"] == 0 and r.extra["llamacpp_timings"]["prompt_n"] == r.input_tokens
        assert r.memory_source == "server_rss" and r.peak_memory_bytes > 50e6
        assert (
            r.extra["precision"] == "Q4_1"
            and r.extra["llamacpp"]["model"]["sha256"] == model_files.get_entry("smollm2-135m").sha256
        )
        assert r.target_forwards == r.output_tokens - r.accepted_tokens
    assert all(r.drafted_tokens == 0 and r.draft_steps == 0 for r in ar)
    # the kit's counts are the per-request timings' and the server's own counters
    assert (
        sum(r.drafted_tokens for r in ng)
        == sum(r.extra["llamacpp_timings"].get("draft_n", 0) for r in ng)
        == run["drafted_tokens"]
    )
    assert (
        sum(r.accepted_tokens for r in ng)
        == sum(r.extra["llamacpp_timings"].get("draft_n_accepted", 0) for r in ng)
        == run["accepted_tokens"]
    )
    assert sum(r.draft_steps for r in ng) == run["drafts"] > 0 and run["counters_match"] is True
    depth = max(len(r.accepted_per_position) for r in ng)
    assert [sum((r.accepted_per_position + [0] * depth)[k] for r in ng) for k in range(depth)] == run[
        "accepted_per_position"
    ]
    # the kit's AL is llama.cpp's own "mean len", per request (the γ=2 server's log) and over the run (counters)
    logged = _log_mean_lens(log)
    assert [(r.accepted_tokens, r.drafted_tokens) for r in ng2 if r.drafted_tokens] == [(a, d) for a, d, _ in logged]
    assert [round(1 + r.accepted_tokens / r.draft_steps, 2) for r in ng2 if r.draft_steps] == [m for _, _, m in logged]
    assert 1 + run["accepted_tokens"] / run["drafts"] == run["acceptance_length"]
    # greedy: llama.cpp's speculative output equals its AR output on these prompts (Q4_1 target)
    assert [a.output_ids for a in ar] == [n.output_ids for n in ng]
    import psutil

    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_live_synthetic_acceptance_sets_llamacpp_acceptance(tmp_path):
    """SmolLM2 drafting for itself accepts nearly every greedy draft (AL near γ + 1); with llama.cpp's
    --spec-synth-len 2 the same server accepts what the rule says, and the records carry the rule."""
    ids = json.loads((FIXTURES / "prompt_ids.json").read_text())["ids"]
    reqs = [Request(k, "", prompt_ids=tuple(v)) for k, v in ids.items()]
    sampling = Sampling(max_new_tokens=40)
    b = LlamaCppBackend("smollm2-135m", threads=1, log_dir=tmp_path)
    try:
        real = list(b.run(reqs, sampling, cell("draft_target", 4, drafter="smollm2-135m")))
        synth = list(
            b.run(reqs, sampling, cell("draft_target", 4, drafter="smollm2-135m", synthetic_acceptance="length=2"))
        )
    finally:
        b.close()

    def al(rows):
        return 1 + sum(r.accepted_tokens for r in rows) / sum(r.draft_steps for r in rows)

    assert all(r.status == "ok" and r.output_tokens == 40 for r in real + synth), [r.error for r in real + synth]
    # Q4_1 drafting for itself accepts nearly every greedy draft (batched verification rounds differently)
    assert al(real) > 4.0 and all(r.synthetic_acceptance is None for r in real)
    assert 1.3 < al(synth) < 2.9, al(synth)  # ~30 verification steps: the rule's mean 2 within sampling noise
    assert all(r.synthetic_acceptance == "length=2.0" for r in synth)
    assert all(r.extra["llamacpp"]["spec"]["synthetic"] == {"synth_len": 2.0} for r in synth)


def _cached_gguf(name: str) -> bool:
    return (fetch.cache_dir() / "gguf" / name / f"{name}.gguf").is_file()


@pytest.mark.engines
@pytest.mark.skipif(
    not (_cached_gguf("qwen2.5-coder-1.5b") and _cached_gguf("qwen2.5-coder-0.5b")),
    reason="the opt-in Qwen2.5-Coder pair is not downloaded (bench/llamacpp_costs.py --pair fetches it)",
)
def test_live_qwen_pair_draft_target(tmp_path):
    b = LlamaCppBackend("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", threads=2, log_dir=tmp_path)
    req = [Request("prime", "x", messages=(("user", "Write a Python function is_prime(n)."),))]
    try:
        ar = list(b.run(req, Sampling(max_new_tokens=24), cell("ar", None)))
        dt = list(b.run(req, Sampling(max_new_tokens=24), cell("draft_target", 4, drafter="qwen2.5-coder-0.5b")))
    finally:
        b.close()
    run = dt[0].extra["run_scope"]["acceptance"]
    assert dt[0].status == "ok" and run["counters_match"] is True and dt[0].draft_steps == run["drafts"] > 0
    assert dt[0].extra["llamacpp"]["draft"]["precision"] == "Q4_K_M" and dt[0].extra["llamacpp"]["spec"]["n_max"] == 4
    assert max(dt[0].drafts_per_position and [len(dt[0].drafts_per_position)]) <= 4
    print("greedy exact match AR vs draft_target:", ar[0].output_ids == dt[0].output_ids)


# ---- cost measurement logic (a stub server answers in llama.cpp's timings format) ----------


class _StubServer:
    """Answers like a llama.cpp slot whose cache holds the previous prompt: prompt_n = tokens past
    the common prefix, prompt_ms = 10 + 2 per evaluated token (a fixed rule, not a measurement)."""

    model, prefix_cache = "stub", True

    def __init__(self):
        self.cached: list[int] = []

    def ensure_server(self, cell):
        return None

    def send(self, request, sampling, cell):
        from specstudy.records import RequestRecord

        ids = list(request.prompt_ids)
        common = 0
        while common < min(len(ids), len(self.cached)) and ids[common] == self.cached[common]:
            common += 1
        common = min(common, len(ids) - 1) if self.prefix_cache else 0
        self.cached = ids
        rec = RequestRecord("s", "cpu", "llamacpp", "ar", "adhoc", "p", 0, "c", "stub")
        rec.extra["llamacpp_timings"] = {
            "prompt_n": len(ids) - common,
            "cache_n": common,
            "prompt_ms": 10.0 + 2.0 * (len(ids) - common),
            "predicted_per_token_ms": 5.0,
        }
        return rec


def test_verification_curve_times_exact_k_token_extensions_of_the_cached_prompt():
    from specstudy.backends.llamacpp.costs import verification_curve

    res = verification_curve(_StubServer(), list(range(100, 140)), ks=range(1, 5), repeats=3)
    assert res["verify_ms"] == {1: 12.0, 2: 14.0, 3: 16.0, 4: 18.0} and res["verify_ratio"][4] == 1.5
    assert all(len(v) == 3 for v in res["samples_ms"].values()) and res["prompt_tokens"] == 40
    stub = _StubServer()
    stub.prefix_cache = False
    with pytest.raises(ValueError, match="prefix_cache=True"):
        verification_curve(stub, [1, 2, 3])
    with pytest.raises(ValueError, match="including k = 1"):
        verification_curve(_StubServer(), [1, 2, 3], ks=[2, 4])
