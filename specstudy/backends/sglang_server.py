"""SGLang's server: ``--speculative-algorithm EAGLE|EAGLE3|NGRAM|STANDALONE``, acceptance per request.

Requests go to SGLang's native streaming ``/generate`` (``data: {json}`` events, then
``data: [DONE]``) because only its ``meta_info`` carries the per-request speculative counters:
``completion_tokens`` (cumulative), ``spec_verify_ct`` (verification steps), and the drafted /
accepted counts under the names of the version at hand — ``spec_num_proposed_drafts`` /
``spec_num_correct_drafts`` (with ``spec_proposed_drafts`` / ``spec_accepted_drafts`` aliases),
older ``spec_draft_token_num`` / ``spec_accept_token_num`` — plus, where offered,
``spec_num_*_drafts_by_position`` and ``spec_correct_drafts_histogram`` / ``spec_accept_histogram``.
Every SGLang decode forward is a verification when speculation is on, so a record counts
``target_forwards = spec_verify_ct + 1`` target forwards (the prefill is the first, as in the
reference engine and the vLLM backend); SGLang's own τ = completion_tokens / spec_verify_ct is
kept in ``extra["sglang_tau"]``.

SGLang has no CPU build that installs here: this module is tested against responses in the
documented format only; the live check belongs on a GPU machine.
"""

from __future__ import annotations

import sys
from typing import Any

from ..records import Cell, Request, RequestRecord, Sampling
from ..data.models import resolve_for_engine as resolve_model
from .server import ServerBackend
from .sse import StreamState

SGLANG_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM", "draft_target": "STANDALONE"}

_DRAFTED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_HIST_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def speculative_flags(method: str, gamma: int | None, drafter: str | None, options: dict[str, Any]) -> list[str]:
    """SGLang launch flags for a study method (chain drafts: top-k 1, γ steps, γ+1 draft tokens)."""
    if method == "ar":
        return []
    if method not in SGLANG_ALGORITHMS:
        raise ValueError(f"method={method!r} has no SGLang equivalent; allowed: {['ar', *SGLANG_ALGORITHMS]}")
    if not gamma or gamma < 1:
        raise ValueError(f"method={method!r} needs gamma >= 1, got {gamma!r}")
    flags = ["--speculative-algorithm", SGLANG_ALGORITHMS[method],
             "--speculative-num-draft-tokens", str(gamma + 1)]
    if method != "ngram":
        flags += ["--speculative-num-steps", str(gamma), "--speculative-eagle-topk", str(options.get("topk", 1))]
        if not drafter:
            raise ValueError(f"method={method!r} needs a drafter (--speculative-draft-model-path)")
        flags += ["--speculative-draft-model-path", resolve_model(drafter)]
    return flags


def _first(meta: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if meta.get(k) is not None:
            return meta[k]
    return None


def meta_fields(meta: dict[str, Any]) -> dict[str, Any] | None:
    """Record fields from a final ``meta_info``; None when the request ran without speculation."""
    steps = meta.get("spec_verify_ct")
    if not steps:
        return None
    out: dict[str, Any] = {"target_forwards": int(steps) + 1, "draft_steps": int(steps), "drafted_tokens": None,
                           "accepted_tokens": None,
                           "accepted_per_position": None, "drafts_per_position": None}
    drafted, accepted = _first(meta, _DRAFTED_KEYS), _first(meta, _ACCEPTED_KEYS)
    if drafted is not None and accepted is not None:
        out["drafted_tokens"], out["accepted_tokens"] = int(drafted), int(accepted)
    by_d, by_a = meta.get("spec_num_proposed_drafts_by_position"), meta.get("spec_num_correct_drafts_by_position")
    if by_d and by_a and len(by_d) == len(by_a):
        out["drafts_per_position"] = [int(x) for x in by_d]
        out["accepted_per_position"] = [int(x) for x in by_a]
        return out
    hist = _first(meta, _HIST_KEYS)
    if isinstance(hist, list) and len(hist) > 1:
        out["accepted_per_position"] = [int(sum(hist[j:])) for j in range(1, len(hist))]
        depth = len(hist) - 1
        if out["drafted_tokens"] == int(steps) * depth:
            out["drafts_per_position"] = [int(steps)] * depth
    return out


class SglangServerBackend(ServerBackend):
    """``python -m sglang.launch_server`` per speculative configuration, or attach via ``base_url``."""

    framework = "sglang"
    methods = ("ar", *SGLANG_ALGORITHMS)
    api_path = "/generate"

    def server_argv(self, cell: Cell) -> list[str]:
        argv = [self.python or sys.executable, "-m", "sglang.launch_server",
                "--model-path", resolve_model(self.model), "--host", "{host}", "--port", "{port}",
                "--random-seed", "0"]
        argv += speculative_flags(cell.method, cell.gamma, cell.drafter or self.drafter, dict(cell.options))
        return argv + self.server_args

    def server_key(self, cell: Cell) -> Any:
        return tuple(speculative_flags(cell.method, cell.gamma, cell.drafter or self.drafter, dict(cell.options)))

    def version_probe(self, url: str) -> str | None:
        import json

        from .lifecycle import http_get

        try:
            status, body = http_get(url + "/get_server_info", 10.0)
            return str(json.loads(body).get("version")) if status == 200 else None
        except (OSError, ValueError):
            return None

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        params: dict[str, Any] = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                                  "top_p": sampling.top_p, "top_k": sampling.top_k if sampling.top_k > 0 else -1,
                                  "ignore_eos": sampling.ignore_eos}
        body: dict[str, Any] = {"sampling_params": params, "stream": True}
        ids = self.prompt_ids(request)
        if ids is not None:
            body["input_ids"] = ids
        else:
            body["text"] = request.prompt
        return {**body, **self.extra_body}

    def consume(self, obj: dict[str, Any], st: StreamState) -> int:
        """One native chunk: ``completion_tokens`` is cumulative; text is cumulative unless the
        server runs with incremental streaming output (then each chunk holds only the new text)."""
        meta = obj.get("meta_info") or {}
        st.meta_info = meta or st.meta_info
        n = 0
        if meta.get("completion_tokens") is not None:
            n = max(int(meta["completion_tokens"]) - st.tokens, 0)
            st.count_source = "usage"
        text = obj.get("text") or ""
        prev = st.text
        if st.cumulative_text is None and not st.text_parts and text:
            st.cumulative_text = text  # first chunk: cumulative and incremental look alike
        elif st.cumulative_text is not None and text.startswith(prev):
            st.cumulative_text = text
        elif text:
            if st.cumulative_text is not None:  # turned out incremental
                st.text_parts, st.cumulative_text = [st.cumulative_text], None
            st.text_parts.append(text)
        ids = obj.get("output_ids")
        if isinstance(ids, list) and meta.get("completion_tokens") is not None:
            if len(ids) == int(meta["completion_tokens"]):
                st.output_ids = [int(i) for i in ids]
            elif len(ids) == n:
                st.output_ids.extend(int(i) for i in ids)
        fr = meta.get("finish_reason")
        if isinstance(fr, dict):
            st.finish_reason = str(fr.get("type"))
        st.tokens += n
        if meta:
            st.usage = {"completion_tokens": meta.get("completion_tokens", st.tokens),
                        "prompt_tokens": meta.get("prompt_tokens")}
        return n

    def fill_acceptance(self, rec: RequestRecord, st: StreamState) -> None:
        fields = meta_fields(st.meta_info or {})
        if fields is None:
            return
        for k, v in fields.items():
            setattr(rec, k, v)
        meta = st.meta_info or {}
        rec.extra["sglang_spec"] = {k: v for k, v in meta.items() if k.startswith("spec_")}
        if meta.get("completion_tokens") and meta.get("spec_verify_ct"):
            rec.extra["sglang_tau"] = int(meta["completion_tokens"]) / int(meta["spec_verify_ct"])
        rec.extra["acceptance_source"] = "sglang meta_info"
