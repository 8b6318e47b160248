"""ar: plain autoregressive decoding, the paired baseline of every speculative method.

Same KV cache (:class:`~specstudy.engine.kv.KVState`), same sampling transform and the same
per-step bookkeeping as the speculative methods, so a speedup compares decoding strategies, not
implementations.  One target forward per token: each step has drafted = accepted = 0, emitted = 1.
"""

from __future__ import annotations

from ..kv import KVState
from ..sampling import next_tokens
from ..speculate import prefill
from ..trace import BatchTrace, RowTrace, Timer
from . import DecodeJob, EngineMethod

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "ar",
    "family": "ar",
    "order": 0,
    "needs_drafter": False,
    "uses_gamma": False,
    "max_batch": None,
    "options": (),
    "title": "Baseline (AR)",
    "seed_row": "Baseline",
    "describe": "autoregressive decoding (no speculation)",
}


def decode(job: DecodeJob) -> list[RowTrace]:
    s, device = job.sampling, job.device
    gen = job.generator()
    trace = BatchTrace(job.prompts, s.max_new_tokens, job.eos_token_ids, s.ignore_eos, device)
    state = KVState(job.target, len(job.prompts), device)
    with Timer(device) as t:
        logits = prefill(state, [r.prompt_ids for r in trace.rows])
    while True:
        tok = next_tokens(logits, s, gen)
        keep = trace.emit([[x] for x in tok.tolist()], logits[:, None], 0, 0, None, t.s)
        if trace.done:
            return trace.rows
        if len(keep) < state.batch_size:
            state.select_rows(keep)
            tok = tok[keep]
        with Timer(device) as t:
            logits = state.forward(tok[:, None])[:, -1]


SPEC = EngineMethod.from_header(
    HEADER,
    decode=decode,
    description="plain autoregressive decoding (baseline)",
)
