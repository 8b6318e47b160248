"""MLC-LLM backend against fixtures in its formats (MLC-LLM cannot run here: its PyPI names are
placeholders and its wheels need mlc.ai's index).  ``tests/fixtures/mlc/`` holds, each naming the
mlc-ai/mlc-llm source it follows (main at 79d603f): ``serve-args.json`` (the options of
``python/mlc_llm/cli/serve.py``, replayed as an argparse parser, and its ``--overrides`` keys),
``completions_stream.txt`` (a streamed ``/v1/completions``: ``serve/engine_base.py``,
``protocol/openai_api_protocol.py``) and ``engine_metrics_{before,after}.json``
(``POST /debug/dump_engine_metrics``: ``cpp/serve/metrics.{h,cc}``).  Parsing, not measurement."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from fake_servers import ACCEPT_CYCLE, FakeServer, Handler, K
from fixtures.replay_argparse import parse

from specstudy import metrics
from specstudy.backends import backend_class, get_backend
from specstudy.backends.mlc.mlc_server import (
    MlcServerBackend,
    describe_mlc,
    engine_metrics,
    quantization_of,
    spec_decode_acceptance,
)
from specstudy.config import load_study
from specstudy.environments.preflight import Probes
from specstudy.frameworks import DECLARATIONS
from specstudy.frameworks.declaration import CellCheck
from specstudy.frameworks.mlc import MLC
from specstudy.records import Cell, Request, Sampling
from specstudy.run.environment import machine_needs
from specstudy.run.plan import check_backends, expand

FIXTURES = Path(__file__).parents[1] / "fixtures" / "mlc"
ARGS = FIXTURES / "serve-args.json"
TARGET, DRAFT = "meta-llama/Llama-2-7b-chat-hf", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
WEIGHTS = {TARGET: "HF://mlc-ai/Llama-2-7b-chat-hf-q4f16_1-MLC", DRAFT: "/mlc/TinyLlama-q4f16_1-MLC"}
# what specstudy.run.pool.BackendPool._options builds for framework "mlc" (tp 2), plus the profile's options
RUNNER_OPTIONS = {"model": TARGET, "drafter": DRAFT, "prefix_cache": False, "tensor_parallel_size": 2}


def cell(method="draft_target", gamma=K, drafter=DRAFT, **opts):
    return Cell("t", "a100", "mlc", method, "chat", "m", drafter=drafter, gamma=gamma, options=tuple(opts.items()))


def overrides(argv: list[str]) -> dict[str, str]:
    """``--overrides`` as MLC's EngineConfigOverride.from_str reads it, each key checked against its table."""
    known = json.loads(ARGS.read_text())["overrides"]
    pairs = dict(kv.split("=", 1) for kv in argv[argv.index("--overrides") + 1].split(";") if kv)
    for key, value in pairs.items():
        assert key in known, f"{key} is not an EngineConfigOverride field"
        {"int": int, "float": float, "str": str}[known[key]](value)  # typed as MLC parses it
    return pairs


@pytest.mark.parametrize(
    ("method", "mode"), [("draft_target", "small_draft"), ("eagle", "eagle"), ("medusa", "medusa")]
)
def test_argv_for_each_method_parses_with_mlcs_own_options(method, mode):
    b = get_backend("mlc", **RUNNER_OPTIONS, weights=WEIGHTS, model_lib={DRAFT: "/lib/tiny.so"}, mode="local")
    argv = b.server_argv(cell(method, 5))
    assert argv[:3] == ["mlc_llm", "serve", WEIGHTS[TARGET]]  # MLC's compiled weights, not the HF checkpoint
    ns = parse(ARGS, argv[3:])  # every option known to mlc_llm serve, with its choices
    assert (ns.speculative_mode, ns.mode, ns.prefix_cache_mode, ns.enable_debug) == (mode, "local", "disable", True)
    assert ns.additional_models == [f"{WEIGHTS[DRAFT]},/lib/tiny.so"] and ns.model_lib is None
    assert overrides(argv) == {"tensor_parallel_shards": "2", "spec_draft_length": "5", "spec_tree_width": "1"}
    assert b.server_key(cell(method, 5)) != b.server_key(cell(method, 4))


def test_ar_argv_and_the_prefix_cache():
    b = get_backend(
        "mlc", model=TARGET, drafter=None, prefix_cache=True, max_model_len=4096, gpu_memory_utilization=0.8
    )
    argv = b.server_argv(cell("ar", None, drafter=None))
    ns = parse(ARGS, argv[3:])
    assert argv[2] == TARGET and ns.speculative_mode is None and ns.additional_models is None  # MLC's default: disable
    assert ns.mode == "server"  # MLC's own default, local, would queue a batch of 8 at 4
    assert ns.prefix_cache_mode == "radix" and b.effective_prefix_cache is True
    assert overrides(argv) == {"context_window_size": "4096", "gpu_memory_utilization": "0.8"}
    with pytest.raises(ValueError, match="options the engine does not know"):  # the replayed parser can refuse
        parse(ARGS, [*argv[3:], "--speculative-draft-length", "4"])


def test_bad_options_are_refused_before_any_server_starts():
    with pytest.raises(ValueError, match=r"option 'topk' is read by no code; mlc reads: none"):
        MlcServerBackend.check_cell(CellCheck("eagle", 4, {"topk": 2}, model=TARGET, drafter="/e", cuda=True))
    with pytest.raises(ValueError, match=r"method='ngram' is not available in mlc; allowed: \['ar', 'draft_target'"):
        MlcServerBackend.check_cell(CellCheck("ngram", 4, {}, model=TARGET, drafter=None, cuda=True))
    with pytest.raises(ValueError, match="method='medusa' needs a drafter"):
        MlcServerBackend.check_cell(CellCheck("medusa", 4, {}, model=TARGET, drafter=None, cuda=True))
    with pytest.raises(ValueError, match="needs gamma >= 1"):
        MlcServerBackend.check_cell(CellCheck("eagle", 0, {}, model=TARGET, drafter="/e", cuda=True))
    with pytest.raises(ValueError, match=r"mlc mode='fast': allowed \['interactive', 'local', 'server'\]"):
        get_backend("mlc", model=TARGET, mode="fast")
    with pytest.raises(ValueError, match="option 'dtype' is read by no code"):  # the precision is the weights'
        get_backend("mlc", model=TARGET, dtype="float16")
    with pytest.raises(ValueError, match="weights must map model names"):
        get_backend("mlc", model=TARGET, weights="HF://mlc-ai/x")
    b = get_backend("mlc", model=TARGET, mlc_llm="/nonexistent/mlc_llm")
    assert b.server is None  # building the backend starts nothing
    with pytest.raises(ValueError, match="has no top_k"):  # MLC's CompletionRequest would drop it silently
        b.request_body(Request("p", "hi"), Sampling(max_new_tokens=4, top_k=20))


def test_the_declaration_is_the_backends():
    assert DECLARATIONS["mlc"] is MLC and backend_class("mlc") is MlcServerBackend
    assert MlcServerBackend.methods == MLC.methods == ("ar", "draft_target", "eagle", "medusa")
    assert MLC.server and MLC.tensor_parallel and not MLC.takes_dtype and MLC.needs_drafter == set(MLC.methods) - {"ar"}
    assert "INT4 q4f16_1" in describe_mlc("medusa", 3)
    assert "--speculative-mode small_draft: a chain of 4" in describe_mlc("draft_target", 4)
    assert quantization_of(WEIGHTS[TARGET]) == "q4f16_1" and quantization_of("/w/Llama-q0f16-MLC") == "q0f16"
    assert quantization_of("/w/plain") is None


class Replay(Handler):
    """Answers as ``mlc_llm serve --enable-debug`` from the fixture files (not the fake's script):
    the stream for a completion, the two engine-metrics dumps in turn (before the run, after it)."""

    dumps: list[str] = []
    bodies: list[dict] = []

    def do_GET(self):
        if self.path != "/v1/models":
            self._send(404, "not found")  # MLC serves no /health, /version
            return
        self._send(200, json.dumps({"object": "list", "data": [{"id": WEIGHTS[TARGET]}]}), "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/debug/dump_engine_metrics":
            self._send(200, self.dumps.pop(0), "application/json")
            return
        type(self).bodies.append(body)
        self._send(200, (FIXTURES / "completions_stream.txt").read_text(), "text/event-stream")


def test_the_fixtures_served_as_mlc_serves_them_make_a_record_and_the_runs_acceptance():
    handler = type("R", (Replay,), {"bodies": []})
    handler.dumps = [(FIXTURES / f"engine_metrics_{w}.json").read_text() for w in ("before", "after")]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        b = get_backend("mlc", model=TARGET, weights=WEIGHTS, base_url=f"http://127.0.0.1:{httpd.server_address[1]}")
        (rec,) = b.run([Request("p", "def fib")], Sampling(max_new_tokens=9, ignore_eos=True), cell("draft_target", 4))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert rec.status == "ok", rec.error
    assert handler.bodies[0]["model"] == WEIGHTS[TARGET] and handler.bodies[0]["debug_config"] == {"ignore_eos": True}
    assert rec.output_text == "def fib(n):\n    return n" and rec.extra["finish_reason"] == "length"
    assert (rec.output_tokens, rec.input_tokens) == (9, 12)  # from the final usage, not the chunk count
    assert rec.chunk_tokens == [1, 1, 1, 1] and rec.extra["chunk_token_count"].startswith("text_chunks")
    assert rec.extra["mlc_request_metrics"]["ttft_s"] == pytest.approx(0.0127)
    assert rec.extra["mlc_quantization"] == "q4f16_1" and rec.extra["mlc_enable_debug"] is True
    assert rec.drafted_tokens is None  # MLC's usage has no per-request speculative counts: not guessed
    run = b.last_run_acceptance  # the dumps' deltas: 20 steps, 80 drafted, 33 accepted
    assert (run["drafts"], run["drafted_tokens"], run["accepted_tokens"]) == (20, 80, 33)
    assert rec.extra["run_scope"]["acceptance"] is run


def _dump(name: str) -> dict:
    return engine_metrics(json.loads((FIXTURES / name).read_text()))


def test_acceptance_from_the_engine_metrics_fixture():
    before, after = _dump("engine_metrics_before.json"), _dump("engine_metrics_after.json")
    a = spec_decode_acceptance(before, after)
    assert (a["drafts"], a["drafted_tokens"], a["accepted_tokens"]) == (20, 80, 33)
    assert a["accepted_per_position"] == [15, 9, 6, 3] and a["drafts_per_position"] == [20] * 4
    assert a["alpha"] == pytest.approx(33 / 80) and a["acceptance_length"] == pytest.approx(1 + 33 / 20)
    assert a["per_position"] == pytest.approx([0.75, 0.45, 0.3, 0.15])  # unconditional: / draft steps
    assert a["per_position_conditional"] == pytest.approx([15 / 20, 9 / 15, 6 / 9, 3 / 6])
    assert a["mlc_accept_len"] == pytest.approx(a["acceptance_length"])
    # MLC's own accept_len at the last position counts the bonus token: it equals the kit's AL
    since_start = spec_decode_acceptance({}, after)
    last = max(after["spec_decode"]["accept_len"], key=lambda k: int(k.split("=")[1].rstrip("}")))
    assert after["spec_decode"]["accept_len"][last] == pytest.approx(since_start["acceptance_length"])
    # its accept_rate is the conditional form: accept_count[i] / accept_count[i - 1]
    assert after["spec_decode"]["accept_rate"]["accept_rate{step=2}"] == pytest.approx(14 / 22)
    assert spec_decode_acceptance(before, before) is None  # nothing drafted in between
    assert spec_decode_acceptance(after, before) is None  # counts went back: an engine reset, not a run
    assert spec_decode_acceptance({}, {"completion_tokens_sum": 3}) is None  # AR: no spec_decode block
    assert engine_metrics(after) == after  # a bare metrics object reads the same as FastAPI's wrapped one


def _expected(n: int) -> tuple[int, int, int]:
    """(verification steps, accepted, output tokens) of one fake MLC request of max_tokens n."""
    done, steps, acc = 1, 0, 0
    while done < n:
        a = ACCEPT_CYCLE[(steps + 1) % len(ACCEPT_CYCLE)]
        done, steps, acc = done + a + 1, steps + 1, acc + a
    return steps, acc, done


def test_run_against_a_fake_mlc_server():
    with FakeServer(mode="mlc") as fake:
        b = get_backend("mlc", model=TARGET, base_url=fake.url, request_timeout_s=10)
        sampling = Sampling(max_new_tokens=13, ignore_eos=True)
        list(b.run([Request("w", "warm")], sampling, cell()))  # earlier traffic: scoped out by the deltas
        recs = list(b.run([Request("a", "hello"), Request("b", "", prompt_ids=(1, 2))], sampling, cell()))
        body = fake.state.last_body
    steps, acc, out = _expected(13)
    assert out > 13  # a verification step commits past max_tokens (request_state.cc finishes after it)
    for r in recs:
        assert r.status == "ok", r.error
        assert r.output_tokens == out and len(r.chunk_tokens) == steps + 1
        assert r.extra["mlc_request_metrics"]["completion_tokens"] == out and r.drafted_tokens is None
        assert r.extra["mlc_enable_debug"] is True  # attached: its metrics dump answered
    assert body["debug_config"] == {"ignore_eos": True} and "ignore_eos" not in body and "top_k" not in body
    assert body["prompt"] == [1, 2] and body["stream_options"] == {"include_usage": True}
    run = b.last_run_acceptance
    assert (run["drafts"], run["drafted_tokens"], run["accepted_tokens"]) == (2 * steps, 2 * K * steps, 2 * acc)
    assert run["acceptance_length"] == pytest.approx(metrics.acceptance_length(2 * acc, 2 * steps))
    assert recs[0].extra["run_scope"]["acceptance"] is run
    assert metrics.acceptance_summary(recs)["alpha"] is None  # no per-request counts to pool


def test_an_ar_server_reports_no_acceptance():
    with FakeServer(mode="mlc", spec=False) as fake:
        b = get_backend("mlc", model=TARGET, base_url=fake.url, request_timeout_s=10)
        recs = list(b.run([Request("a", "hello")], Sampling(max_new_tokens=5), cell("ar", None, drafter=None)))
    assert recs[0].status == "ok" and recs[0].output_tokens == 5 and b.last_run_acceptance is None


def test_the_profiles_commented_mlc_rows_validate(tmp_path, no_model_work):
    src = Path(__file__).parents[2] / "params" / "hardware" / "rtx4090.yaml"
    text = src.read_text()
    assert "#mlc " in text
    path = tmp_path / "rtx4090.yaml"
    workloads = src.parents[1] / "workloads"  # the copy lives elsewhere: its relative task paths made absolute
    path.write_text(text.replace("#mlc ", "").replace("../workloads/", f"{workloads}/"))
    cfg = check_backends(load_study("rtx4090", path))
    plans = [p for p in expand(cfg) if p.cell.framework == "mlc"]
    spec = [p for p in plans if p.cell.method == "draft_target"]
    assert spec and all(p.baseline_cell_id in {q.cell_id for q in plans} for p in spec)  # paired on MLC itself
    opts = yaml.safe_load(path.read_text())["study"]["framework_options"]["mlc"]
    assert all(quantization_of(w) == "q4f16_1" for w in opts["weights"].values())


def test_an_mlc_only_study_needs_mlc_llm_not_the_checkpoints(tmp_path):
    study = {
        "name": "m",
        "device": "cuda",
        "models": [
            {
                "name": "llama",
                "target": TARGET,
                "dtype": "float16",
                "drafters": {"tiny": DRAFT},
                "vocab_size": {"target": 32000, "tiny": 32000},
            }
        ],
        "methods": [{"method": "ar"}, {"method": "draft_target", "drafter": "tiny"}],
        "frameworks": ["mlc"],
        "framework_options": {"mlc": {"weights": WEIGHTS}},
        "tasks": ["chat"],
        "gammas": [4],
        "prompts_per_task": 5,
        "max_new_tokens": 16,
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"study": study}))
    bare = Probes(
        gpus=lambda: ["NVIDIA GeForce RTX 4090"],
        installed=lambda env: True,
        imports=lambda py, mod: (True, ""),
        cached=lambda repo: None,  # nothing in the HF cache, no token: MLC fetches its own weights
        token=lambda: False,
        disk_free=lambda p: 10**13,
        which=lambda exe: None,
        hf_home=lambda: Path("/hf"),
    )
    got = machine_needs(load_study("rtx4090", path), bare)
    assert [(m.kind, m.what) for m in got] == [("engine", "mlc_llm")]
