"""Benchmark of the reference engine on the embedded default model (a benchmark, not a test).

Side by side in one run, on code and summarization prompts, per method: tokens/s, speedup over
the engine's own AR, α, α̂, τ, c (measured draft cost per drafted token / target step cost),
the target's verification-cost curve T(k)/T(1), the cost model's predicted speedup
(:func:`specstudy.costmodel.speedup_with_verify_cost` from α̂, γ, c and T(γ+1)/T(1)) and
measured / predicted; beside each, HF transformers' own implementation of the same idea on
the same prompts (plain ``generate``, ``prompt_lookup_num_tokens``, ``assistant_early_exit``,
``assistant_model`` with a constant draft length) and whether its greedy tokens equal ours.
Last, the AR baseline's achieved memory bandwidth (model bytes × tokens/s) against the CPU's
measured copy bandwidth.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/engine.py [--max-new-tokens 64] [--prompts 3]

Run it on a quiet machine: every number is a wall-clock measurement.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: spinning threads cost 4x
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specstudy import costmodel, metrics  # noqa: E402
from specstudy.records import Cell, Request, Sampling  # noqa: E402

FALLBACK_PROMPTS = {  # used only when specstudy.tasks cannot serve the categories
    "code": [
        "Add type hints and a docstring to this function:\n\ndef moving_average(values, window):\n"
        "    out = []\n    for i in range(len(values) - window + 1):\n"
        "        out.append(sum(values[i:i + window]) / window)\n    return out\n",
        "Write a Python function is_palindrome(s) that ignores case and punctuation, with tests.",
        "Refactor this code to use a dictionary instead of the if chain:\n\ndef color(code):\n"
        "    if code == 1:\n        return 'red'\n    if code == 2:\n        return 'green'\n"
        "    if code == 3:\n        return 'blue'\n    return 'unknown'\n",
    ],
    "summarization": [
        "Summarize in two sentences: The town library will extend its opening hours from March. "
        "It will open at 8 am instead of 10 am on weekdays and stay open until 9 pm on Thursdays. "
        "The change follows a survey in which most residents asked for earlier opening times.",
        "Summarize: Researchers tested a new battery made from sodium instead of lithium. It stored "
        "slightly less energy but kept 90 percent of its capacity after 5000 charging cycles, and its "
        "materials are cheaper and easier to find.",
        "Summarize the following notes: the team missed the March deadline because two suppliers "
        "delivered late; the new plan moves testing to April and launches in May; the budget is unchanged.",
    ],
}


def build_requests(tasks: list[str], n: int, tokenizer) -> tuple[list[Request], str]:
    try:
        from specstudy.tasks import load_requests

        reqs = [r for t in tasks for r in load_requests(t, n=n, tokenizer=tokenizer)]
        return reqs, "specstudy.tasks"
    except Exception as e:  # the task registry is optional for this benchmark
        print(f"(specstudy.tasks unavailable: {type(e).__name__}: {e}; using the inline prompts)")
        reqs = [Request(f"{t}-{i}", p, task=t, messages=(("user", p),))
                for t in tasks for i, p in enumerate(FALLBACK_PROMPTS[t][:n])]
        return reqs, "inline"


def verify_cost_curve(model, prompt_ids: list[int], ks: list[int], repeats: int) -> dict[int, float]:
    """Median time of one target forward over k new tokens on a cached prefix, for each k."""
    from specstudy.engine.kv import KVState

    state = KVState(model, 1)
    state.forward(torch.tensor([prompt_ids]))
    out: dict[int, float] = {}
    for k in ks:
        block = torch.tensor([prompt_ids[-k:] if len(prompt_ids) >= k else (prompt_ids * k)[:k]])
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            state.forward(block)
            times.append(time.perf_counter() - t0)
            state.rollback(k)
        out[k] = statistics.median(times[1:])
    return out


def hf_generate(model, tokenizer, ids_list: list[list[int]], max_new: int, **kw) -> tuple[float, list[list[int]]]:
    """tokens/s of HF generate (greedy, EOS ignored) over the prompts, and its output ids."""
    assistant = kw.pop("assistant_model", None)
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None  # fixed-length outputs, like the engine's ignore_eos
    gc.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gc.do_sample, gc.max_new_tokens, gc.min_new_tokens = False, max_new, None
    for k, v in kw.items():
        setattr(gc, k, v)
    extra = {"assistant_model": assistant} if assistant is not None else {}
    total_t, total_n, outs = 0.0, 0, []
    for ids in ids_list:
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        y = model.generate(x, generation_config=gc, **extra)
        total_t += time.perf_counter() - t0
        new = y[0, len(ids):].tolist()
        total_n += len(new)
        outs.append(new)
    return total_n / total_t, outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="a draft model entry for draft_target / HF assistant_model")
    ap.add_argument("--heads", default="params/drafters/smollm2-135m-heads.json",
                    help="a trained heads drafter for the heads method ('' to skip)")
    ap.add_argument("--tasks", default="code,summarization")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per task")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--ngram-max", type=int, default=3)
    ap.add_argument("--exit-layer", type=int, default=None, help="layer_skip exit layer (default L/2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 ≈ 2 for memory-bound decoding here)")
    ap.add_argument("--curve", default="1,2,3,4,5,6,8,12,16", help="k values of the T(k)/T(1) curve")
    ap.add_argument("--curve-repeats", type=int, default=7)
    ap.add_argument("--skip-hf", action="store_true", help="skip the HF transformers comparison")
    ap.add_argument("--chat", choices=("yes", "no"), default="yes")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    from specstudy.backends.reference import ReferenceBackend
    from specstudy.models import load_model, model_bytes
    from specstudy.params import measure_cpu

    model, tok = load_model(args.model)
    drafter = load_model(args.drafter)[0] if args.drafter else None
    n_layers = model.config.num_hidden_layers
    exit_layer = args.exit_layer or n_layers // 2
    backend = ReferenceBackend(model, tokenizer=tok)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    requests, source = build_requests(tasks, args.prompts, tok)
    chat = args.chat == "yes"
    prompt_ids = [backend.encode(r, chat) for r in requests]
    requests = [Request(r.prompt_id, r.prompt, task=r.task, prompt_ids=tuple(p)) for r, p in zip(requests, prompt_ids)]
    sampling = Sampling(temperature=0.0, max_new_tokens=args.max_new_tokens)
    load0 = os.getloadavg()

    # (method, gamma, options, drafter model object or None, drafter name for the cell)
    methods: list[tuple[str, int | None, dict, object, str | None]] = [
        ("ar", None, {}, None, None),
        ("ngram", args.gamma, {"ngram_max": args.ngram_max}, None, None),
        ("layer_skip", args.gamma, {"exit_layer": exit_layer}, None, None),
    ]
    if drafter is not None:
        methods.append(("draft_target", args.gamma, {}, drafter, args.drafter))
    if args.heads and Path(args.heads).exists():
        methods.append(("heads", args.gamma, {}, None, args.heads))

    def cell(name, gamma, opts, dname):
        return Cell(study="bench", hardware="local", framework="reference", method=name, task="mixed",
                    model=args.model, drafter=dname, gamma=gamma, options=tuple(sorted(opts.items())))

    # warm-up (untimed): one full-length request per method
    warm = Sampling(temperature=0.0, max_new_tokens=args.max_new_tokens)  # full length: CPU kernel set-up is per shape
    for name, gamma, opts, d, dname in methods:
        if d is not None:
            backend._drafters[(name, dname)] = d
        list(backend.run(requests[:1], warm, cell(name, gamma, opts, dname)))

    print(f"model {args.model}: {n_layers} layers, {model_bytes(model) / 1e6:.0f} MB fp32; prompts: "
          f"{len(requests)} from {source} ({', '.join(tasks)}), {args.max_new_tokens} new tokens, greedy, "
          f"gamma {args.gamma}, threads {args.threads}, load avg {load0[0]:.2f}")

    ks = sorted({int(k) for k in args.curve.split(",")} | {args.gamma + 1})
    curve = verify_cost_curve(model, prompt_ids[0], ks, args.curve_repeats)
    ratio = {k: curve[k] / curve[1] for k in ks}
    print("verification cost T(k)/T(1): " + "  ".join(f"k={k}:{ratio[k]:.2f}" for k in ks)
          + f"   (T(1) = {curve[1] * 1e3:.1f} ms)")

    results = {}
    records = {}
    for name, gamma, opts, d, dname in methods:
        recs = list(backend.run(requests, sampling, cell(name, gamma, opts, dname)))
        bad = [r for r in recs if r.status != "ok"]
        if bad:
            print(f"{name}: {len(bad)} failed requests: {bad[0].error.splitlines()[0]}")
            continue
        records[name] = recs
        acc = metrics.acceptance_summary(recs)
        steps = [s for r in recs for s in r.steps[1:]]  # without the prefill step
        drafted = sum(s.drafted for s in steps)
        results[name] = {"tokens_per_s": metrics.per_request_throughput(recs), "alpha": acc["alpha"],
                         "alpha_hat": acc["alpha_hat"], "tau": acc["tau"], "gamma": gamma,
                         "draft_s_per_token": (sum(s.draft_s or 0.0 for s in steps) / drafted) if drafted else None,
                         "verify_s_per_step": statistics.median([s.verify_s for s in steps if s.verify_s])}

    base = results.get("ar")
    t1 = base["verify_s_per_step"] if base else curve[1]  # the target's one-token step, measured in AR decoding
    hf_kw = {
        "ar": {},
        "ngram": {"prompt_lookup_num_tokens": args.gamma, "max_matching_ngram_size": args.ngram_max},
        "layer_skip": {"assistant_early_exit": exit_layer, "num_assistant_tokens": args.gamma,
                       "num_assistant_tokens_schedule": "constant"},
        "draft_target": {"assistant_model": drafter, "num_assistant_tokens": args.gamma,
                         "num_assistant_tokens_schedule": "constant"},
    }
    for name, r in results.items():
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        r["exact_match_vs_ar"] = metrics.exact_match_rate(records["ar"], records[name]) if base else float("nan")
        if r["gamma"]:
            r["c"] = (r["draft_s_per_token"] or 0.0) / t1
            k = r["gamma"] + 1
            r["verify_ratio"] = ratio.get(k, float("nan"))
            a = r["alpha_hat"]
            r["predicted"] = (costmodel.speedup_with_verify_cost(min(max(a, 0.0), 1.0), r["gamma"], r["c"], r["verify_ratio"])
                              if a == a else float("nan"))
            r["measured_over_predicted"] = r["speedup"] / r["predicted"] if r["predicted"] else float("nan")
        if not args.skip_hf and name in hf_kw:
            try:
                tps, outs = hf_generate(model, tok, prompt_ids, args.max_new_tokens, **dict(hf_kw[name]))
                r["hf_tokens_per_s"] = tps
                r["ours_over_hf"] = r["tokens_per_s"] / tps
                r["hf_same_tokens"] = sum(o == rec.output_ids for o, rec in zip(outs, records[name])) / len(outs)
            except Exception as e:  # an HF feature missing for this model is a row note, not a crash
                r["hf_error"] = f"{type(e).__name__}: {e}"

    cpu = measure_cpu()
    if base:
        bw = model_bytes(model) * base["tokens_per_s"] / 1e9
        base["achieved_bandwidth_gbps"] = bw
    f = lambda v, p=2: "-" if v is None or v != v else f"{v:.{p}f}"  # noqa: E731
    head = (f"{'method':<12}{'tok/s':>8}{'speedup':>9}{'alpha':>7}{'a_hat':>7}{'tau':>6}{'c':>7}{'T(g+1)/T1':>10}"
            f"{'pred':>7}{'meas/pred':>10}{'HF tok/s':>10}{'ours/HF':>9}{'HF=ours':>8}{'=ar':>5}")
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        print(f"{name:<12}{f(r['tokens_per_s']):>8}{f(r['speedup']):>9}{f(r['alpha']):>7}{f(r['alpha_hat']):>7}"
              f"{f(r['tau']):>6}{f(r.get('c'), 3):>7}{f(r.get('verify_ratio')):>10}{f(r.get('predicted')):>7}"
              f"{f(r.get('measured_over_predicted')):>10}{f(r.get('hf_tokens_per_s')):>10}{f(r.get('ours_over_hf')):>9}"
              f"{f(r.get('hf_same_tokens')):>8}{f(r['exact_match_vs_ar']):>5}")
        if "hf_error" in r:
            print(f"    HF comparison failed: {r['hf_error']}")
    if base:
        print(f"AR achieved bandwidth {base['achieved_bandwidth_gbps']:.2f} GB/s (model bytes x tok/s) vs measured "
              f"CPU copy bandwidth {cpu['copy_bandwidth_gbps']:.2f} GB/s "
              f"({base['achieved_bandwidth_gbps'] / cpu['copy_bandwidth_gbps']:.0%})")
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "verify_ratio": ratio, "curve_s": curve,
                                               "cpu": cpu, "load_avg": [load0, load1], "args": vars(args)},
                                              indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
