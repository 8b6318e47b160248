"""SGLang's server: ``--speculative-algorithm EAGLE|EAGLE3|NEXTN|NGRAM|STANDALONE|DFLASH``, acceptance per request.

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
from collections.abc import Mapping
from typing import Any

from ...data.model_files import resolve_for_engine as resolve_model
from ...environments.install import ENVIRONMENTS, is_installed, python_of
from ...frameworks.declaration import CellCheck, check_choice, constraint_body
from ...frameworks.sglang import KIT_TO_SGLANG, SGLANG, SGLANG_FLAGS, SGLANG_VERSION, sglang_synthetic_env
from ...records import Cell, Request, RequestRecord, Sampling
from ..lifecycle import ServerInfo, http_get, split_url
from ..server_base import ServerBackend
from ..sse import StreamState

SGLANG_ALGORITHMS = KIT_TO_SGLANG
#: kit dtype -> SGLang --dtype (its choices: auto, bfloat16, float, float16, float32, half)
SGLANG_DTYPES = {"auto": "auto", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}

_DRAFTED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_HIST_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def tree_shape(method: str, gamma: int, options: dict[str, Any]) -> tuple[int, int]:
    """(top-k, draft tokens verified per step): a chain unless ``topk`` > 1, whose tree budget
    ``num_draft_tokens`` must then be given explicitly (SGLang's default would silently size it)."""
    topk = int(options.get("topk", 1))
    if topk < 1:
        raise ValueError(f"SGLang {method} topk={topk}: must be >= 1")
    if topk == 1:
        n = int(options.get("num_draft_tokens", gamma + 1))
        if n != gamma + 1:
            raise ValueError(
                f"SGLang {method} chain (topk 1) verifies gamma+1={gamma + 1} tokens, got num_draft_tokens={n}"
            )
        return 1, n
    if "num_draft_tokens" not in options:
        raise ValueError(
            f"SGLang {method} topk={topk} is a tree: give its budget num_draft_tokens explicitly "
            f"(2..{topk * gamma + 1})"
        )
    n = int(options["num_draft_tokens"])
    if not 2 <= n <= topk * gamma + 1:
        raise ValueError(
            f"SGLang {method} num_draft_tokens={n}: allowed 2..{topk * gamma + 1} for topk={topk}, {gamma} steps"
        )
    return topk, n


def speculative_flags(method: str, gamma: int | None, drafter: str | None, options: dict[str, Any]) -> list[str]:
    """SGLang launch flags for a study method: chains unless a tree is asked for explicitly."""
    if method == "ar":
        return []
    if method not in SGLANG_ALGORITHMS:
        raise ValueError(f"method={method!r} has no SGLang equivalent; allowed: {['ar', *SGLANG_ALGORITHMS]}")
    if not gamma or gamma < 1:
        raise ValueError(f"method={method!r} needs gamma >= 1, got {gamma!r}")
    flags = ["--speculative-algorithm", SGLANG_ALGORITHMS[method]]
    if method == "ngram":  # SGLang's own algorithm: a trie over prompts and outputs, a BFS tree by default
        breadth = int(options.get("ngram_breadth", 1))
        flags += [
            "--speculative-num-draft-tokens",
            str(gamma + 1),
            "--speculative-ngram-min-bfs-breadth",
            "1",
            "--speculative-ngram-max-bfs-breadth",
            str(breadth),
        ]
        if options.get("ngram_max_trie_depth") is not None:
            flags += ["--speculative-ngram-max-trie-depth", str(int(options["ngram_max_trie_depth"]))]
        return flags
    if method == "dflash":  # one block of γ drafted in one forward; SGLang's window is the block + the bonus
        if not drafter:
            raise ValueError("method='dflash' needs a drafter (--speculative-draft-model-path)")
        return flags + [
            "--speculative-dflash-block-size",
            str(gamma + 1),
            "--speculative-draft-model-path",
            resolve_model(drafter),
        ]
    topk, n = tree_shape(method, gamma, options)
    if not drafter:
        raise ValueError(f"method={method!r} needs a drafter (--speculative-draft-model-path)")
    return flags + [
        "--speculative-num-draft-tokens",
        str(n),
        "--speculative-num-steps",
        str(gamma),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-draft-model-path",
        resolve_model(drafter),
        *adaptive_flags(method, topk, options),
    ]


def adaptive_flags(method: str, topk: int, options: Mapping[str, Any]) -> list[str]:
    """SGLang's own schedule of draft steps (``adaptive_steps: true``): ``--speculative-adaptive``, which
    moves the step count among candidates per batch-size tier by the acceptance it observes (0.5.23's
    ``speculative/adaptive_spec_params.py``: its built-in tiers 1, 8, 32, 64).  SGLang runs it for an
    EAGLE/EAGLE-3 chain only (top-k 1), so a tree asking for it is refused here, before the server."""
    if not options.get("adaptive_steps"):
        return []
    if method not in ("eagle", "eagle3") or topk != 1:
        raise ValueError(
            f"adaptive_steps=true with method={method!r}, topk={topk}: allowed only for an eagle/eagle3 chain "
            "(topk 1; SGLang's --speculative-adaptive)"
        )
    return ["--speculative-adaptive"]


def describe_sglang(method: str, gamma: int | None, options: Mapping[str, Any], flush: bool = True) -> str:
    """What SGLang 0.5.23 actually runs for a study method (``flush``: the framework's ``flush_cache``)."""
    opts = dict(options)
    if method == "ar":
        return f"SGLang {SGLANG_VERSION} autoregressive decoding (no speculation)"
    if method == "ngram":
        breadth = int(opts.get("ngram_breadth", 1))
        shape = "a chain" if breadth == 1 else f"a BFS tree of breadth up to {breadth}"
        return (
            f"SGLang {SGLANG_VERSION} NGRAM, its own algorithm (not vLLM's prompt lookup): a trie over prompts "
            f"and earlier outputs, {shape} of {gamma} draft tokens; "
            + ("the cache is flushed before every cell" if flush else "the cache is not flushed between cells")
        )
    if method == "dflash":
        return (
            f"SGLang {SGLANG_VERSION} DFLASH: a block of {gamma} draft tokens drafted in one forward, "
            f"verified as a window of {int(gamma or 0) + 1}"
        )
    name = {"eagle": "EAGLE", "eagle3": "EAGLE-3", "draft_target": "draft model (STANDALONE)"}[method]
    topk, n = tree_shape(method, int(gamma or 0), opts)
    # N3: SGLang gives an EAGLE head the target's context; the kit never sets the override that lets it
    # exceed the head's own (validation refuses that), so the label says which context the head runs at
    head = "; the head runs at the target's context (--context-length)" if method in ("eagle", "eagle3") else ""
    if topk == 1 and opts.get("adaptive_steps"):
        return (
            f"SGLang {SGLANG_VERSION} {name} chain with its own adaptive draft steps (--speculative-adaptive: "
            f"the step count chosen per batch-size tier from observed acceptance, {gamma} to start){head}"
        )
    if topk == 1:
        return f"SGLang {SGLANG_VERSION} {name} chain: {gamma} draft steps, top-k 1, {n} tokens verified per step{head}"
    return (
        f"SGLang {SGLANG_VERSION} {name} tree: {gamma} draft steps, top-k {topk}, {n} tokens verified per step "
        f"(a {n}-node tree){head}"
    )


def _first(meta: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if meta.get(k) is not None:
            return meta[k]
    return None


def meta_fields(meta: dict[str, Any], depth: int | None = None) -> dict[str, Any] | None:
    """Record fields from a final ``meta_info``, normalised to the kit's definitions; None when
    the request ran without speculation.

    SGLang's ``spec_num_proposed_drafts`` is nominal (verify steps × (draft tokens − 1): tree nodes,
    not positions on a path) and its ``spec_accept_length`` (completion tokens / verify steps)
    counts the prefill token and the bonus.  The kit counts ``draft_steps`` = verify steps,
    ``target_forwards`` = verify steps + the prefill, drafted tokens = verify steps × ``depth``
    (γ: the positions a step can accept), so α = accepted / drafted and AL = 1 + accepted /
    draft steps.  The histogram stops at the longest accept seen: positions up to ``depth`` are
    filled with zeros.  SGLang's own figures stay in ``extra``.
    """
    steps = meta.get("spec_verify_ct")
    if not steps:
        return None
    steps = int(steps)
    out: dict[str, Any] = {
        "target_forwards": steps + 1,
        "draft_steps": steps,
        "drafted_tokens": None,
        "accepted_tokens": None,
        "accepted_per_position": None,
        "drafts_per_position": None,
    }
    drafted, accepted = _first(meta, _DRAFTED_KEYS), _first(meta, _ACCEPTED_KEYS)
    if accepted is not None:
        out["accepted_tokens"] = int(accepted)
        out["drafted_tokens"] = steps * depth if depth else (int(drafted) if drafted is not None else None)
    by_d, by_a = meta.get("spec_num_proposed_drafts_by_position"), meta.get("spec_num_correct_drafts_by_position")
    if by_d and by_a and len(by_d) == len(by_a):
        out["drafts_per_position"] = [int(x) for x in by_d]
        out["accepted_per_position"] = [int(x) for x in by_a]
        return out
    hist = _first(meta, _HIST_KEYS)
    k = (depth or len(hist) - 1) if isinstance(hist, list) else 0
    # one entry: every step accepted nothing (kept: dropping it would lift α̂ for a weak drafter)
    if isinstance(hist, list) and hist and k > 0:
        counts = [int(x) for x in hist] + [0] * max(k + 1 - len(hist), 0)
        out["accepted_per_position"] = [sum(counts[j:]) for j in range(1, k + 1)]
        if depth:
            out["drafts_per_position"] = [steps] * depth
    return out


#: where a server says its version: the current endpoint first, then the deprecated one
SGLANG_INFO_PATHS = ("/server_info", "/get_server_info")


class SglangServerBackend(ServerBackend):
    """``python -m sglang.launch_server`` per speculative configuration, or attach via ``base_url``.

    Options: ``python`` (default: the kit's SGLang env), ``dtype`` (passed as ``--dtype``, so every
    framework runs the study's precision), ``max_model_len`` (``--context-length``),
    ``tensor_parallel_size`` (``--tp-size``), ``gpu_memory_utilization`` (``--mem-fraction-static``),
    ``prefix_cache`` (False, the default, adds ``--disable-radix-cache``), ``flush_cache``
    (default True: ``/flush_cache`` before every cell, so repeats and NGRAM's corpus start cold).
    """

    framework = "sglang"
    sets_prefix_cache = True
    methods = SGLANG.methods
    api_path = "/generate"

    @classmethod
    def check_cell(cls, cell: CellCheck) -> None:
        """Refuse a method SGLang 0.5.23 lacks, a bad γ or tree budget, a missing drafter, an unread option
        (``cell.cuda`` is not read: SGLang has one, CUDA, build)."""
        cell.against(SGLANG, engine=f"SGLang {SGLANG_VERSION}")
        if cell.method not in ("ar", "ngram"):
            topk, _ = tree_shape(cell.method, int(cell.gamma or 0), dict(cell.options))
            adaptive_flags(cell.method, topk, dict(cell.options))

    @classmethod
    def check_engine_options(cls, options: dict[str, Any]) -> None:
        super().check_engine_options(options)
        check_choice("sglang", "dtype", options.get("dtype", "auto"), SGLANG_DTYPES)

    @classmethod
    def describe(cls, method: str, gamma: int | None, options: Mapping[str, Any], cuda: bool | None = None) -> str:
        return describe_sglang(method, gamma, options)

    def server_env(self, cell: Cell) -> dict[str, str]:
        """The server's environment; a synthetic-acceptance cell sets SGLang's simulated acceptance length."""
        return {**super().server_env(cell), **sglang_synthetic_env(dict(cell.options), cell.gamma)}

    def server_argv(self, cell: Cell) -> list[str]:
        argv = [
            self.python or self.default_python(),
            "-m",
            "sglang.launch_server",
            "--model-path",
            resolve_model(self.model),
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--random-seed",
            "0",
            "--dtype",
            SGLANG_DTYPES[self.options.get("dtype", "auto")],
        ]
        for opt in SGLANG_FLAGS:
            flag = str(SGLANG.engine_options[opt])
            if self.options.get(opt) is not None:
                argv += [flag, str(self.options[opt])]
        if not self.options.get("prefix_cache"):
            argv.append("--disable-radix-cache")
        argv += speculative_flags(cell.method, cell.gamma, self.draft_of(cell), dict(cell.options))
        return argv + self.server_args

    def draft_of(self, cell: Cell) -> str | None:
        """The cell's drafter; for ``mtp`` the target itself (its MTP layers live in its checkpoint)."""
        return self.model if cell.method == "mtp" else cell.drafter or self.drafter

    def default_python(self) -> str:
        env = ENVIRONMENTS["sglang"]
        return str(python_of(env)) if is_installed(env) else sys.executable

    def ensure_server(self, cell: Cell) -> ServerInfo:
        """Start or attach, then flush the radix cache (and NGRAM's corpus) once per cell, before its
        warm-up, so no cell starts warm from another's traffic and its own warm-up's prefix (with
        ``prefix_cache`` on) is still there when its measured requests run."""
        info = super().ensure_server(cell)
        if self.options.get("flush_cache", True) and getattr(self, "_flushed_for", None) != cell:
            self.last_flush = self.flush_cache()
            self._flushed_for = cell
        return info

    def flush_cache(self, attempts: int = 5) -> bool:
        """POST /flush_cache; SGLang refuses while requests run, so retry briefly. True when flushed."""
        import http.client
        import time

        host, port, base = split_url(self.url or "")
        for i in range(attempts):
            conn = http.client.HTTPConnection(host, port, timeout=30)
            try:
                conn.request("POST", base + "/flush_cache")
                if conn.getresponse().status == 200:
                    return True
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.5 * (i + 1))
        return False

    def server_key(self, cell: Cell) -> Any:
        return tuple(speculative_flags(cell.method, cell.gamma, self.draft_of(cell), dict(cell.options)))

    def version_probe(self, url: str) -> str | None:
        """The server's version from ``/server_info`` (SGLang 0.5.23's endpoint; it logs ``/get_server_info``
        as deprecated), falling back to the old path for an older server the kit attaches to."""
        import json

        for path in SGLANG_INFO_PATHS:
            try:
                status, body = http_get(url + path, 10.0)
                if status == 200:
                    return str(json.loads(body).get("version"))
            except (OSError, ValueError):
                continue
        return None

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "ignore_eos": sampling.ignore_eos,
            **constraint_body(SGLANG, request.json_schema, request.grammar).get("sampling_params", {}),
        }
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
            st.usage = {
                "completion_tokens": meta.get("completion_tokens", st.tokens),
                "prompt_tokens": meta.get("prompt_tokens"),
            }
        return n

    def fill_acceptance(self, rec: RequestRecord, st: StreamState) -> None:
        rec.extra["cache_flushed"] = (
            getattr(self, "last_flush", None) if self.options.get("flush_cache", True) else False
        )
        fields = meta_fields(st.meta_info or {}, depth=rec.gamma if rec.method != "ar" else None)
        if fields is None:
            return
        for k, v in fields.items():
            setattr(rec, k, v)
        meta = st.meta_info or {}
        rec.extra["sglang_spec"] = {k: v for k, v in meta.items() if k.startswith("spec_")}
        if meta.get("completion_tokens") and meta.get("spec_verify_ct"):
            # SGLang's accept length: completion tokens / verify steps (prefill token and bonus included)
            rec.extra["sglang_tau"] = int(meta["completion_tokens"]) / int(meta["spec_verify_ct"])
        rec.extra["acceptance_source"] = "sglang meta_info"
