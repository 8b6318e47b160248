"""Benchmark of the reference engine on the embedded default model (a benchmark, not a test).

Side by side in one run, on code and summarization prompts, per method: tokens/s, speedup over
the engine's own AR (tokens/s, prefill included) and decode speedup (AR's TPOT / the method's),
α, α̂, AL (acceptance length), c (measured draft cost per drafted token / target step cost),
the target's verification-cost curve T(k)/T(1), the cost model's predicted speedup
(:func:`specstudy.costmodel.mix_speedup` over the measured draft lengths, c and T(k+1)/T(1)) and
measured / predicted (the decode speedup over the prediction: the cost model describes decoding
steps, not the prefill); beside each, HF transformers' own implementation of the same idea on
the same prompts through the kit's ``hf`` backend (plain ``generate``, ``prompt_lookup_num_tokens``,
``assistant_early_exit``, ``assistant_model``, at the row's γ with a constant schedule and no
confidence cut-off), prompt by prompt in turn with the engine's rows, its AL, and whether its
greedy tokens equal ours.
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
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specstudy import costmodel, metrics  # noqa: E402
from specstudy.analysis.drafts import draft_mix  # noqa: E402
from specstudy.analysis.stats import verify_curve  # noqa: E402
from specstudy.records import Cell, Request, RequestRecord, Sampling  # noqa: E402

FALLBACK_PROMPTS = {  # used only when specstudy.data.tasks cannot serve the categories
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


def build_requests(tasks: list[str], n: int, tokenizer: Any) -> tuple[list[Request], str]:
    reqs: list[Request]
    try:
        from specstudy.data.tasks import load_requests

        reqs = [r for t in tasks for r in load_requests(t, n=n, tokenizer=tokenizer)]
        return reqs, "specstudy.tasks"
    except Exception as e:  # the task registry is optional for this benchmark
        print(f"(specstudy.tasks unavailable: {type(e).__name__}: {e}; using the inline prompts)")
        reqs = [
            Request(f"{t}-{i}", p, task=t, messages=(("user", p),))
            for t in tasks
            for i, p in enumerate(FALLBACK_PROMPTS[t][:n])
        ]
        return reqs, "inline"


#: the rows --methods can name: a method, "+cost" its cost-aware γ, "@2" static γ = 2, "+prefill"
#: drafts verified in the prompt pass
ROWS = (
    "ar",
    "ngram",
    "ngram+cost",
    "ngram@2",
    "layer_skip",
    "draft_target",
    "draft_target+cost",
    "heads",
    "eagle",
    "eagle3",
    "mtp",
    "ngram+prefill",
    "ngram+cost+prefill",
    "draft_target+prefill",
    "draft_target+cost+prefill",
)
PREFILL = "+prefill"  # a row suffix: the same row with draft_in_prefill: on (HF's first step)
TF = " [tf]"  # a row suffix (--forward both): the same row through transformers' own forward at batch 1


def method_of(label: str) -> str:
    """The engine method of a row label: "ngram+cost", "ngram@2", "ar [tf]" -> "ngram", "ngram", "ar"."""
    return label.removesuffix(TF).split("+")[0].split("@")[0]


def baseline_of(label: str) -> str:
    """The AR row a row is paired with: the one through the same forward."""
    return "ar" + (TF if label.endswith(TF) else "")


def drafter_target(path: str) -> str | None:
    """The target a committed drafter was trained for: its .json beside the weights, or a folder's
    specstudy.json (EAGLE-3, MTP); None when there is no such drafter."""
    p = Path(path)
    doc = p / "specstudy.json" if p.is_dir() else p
    return json.loads(doc.read_text()).get("target") if doc.is_file() else None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options, checked before any model loads (the make targets' argument lists are tested with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="a draft model entry for draft_target / HF assistant_model")
    ap.add_argument(
        "--draft-quantization",
        choices=("none", "int8"),
        default="none",
        help="draft_target's draft model in int8 dynamic quantization (HF's assistant gets the same module)",
    )
    ap.add_argument(
        "--methods",
        default=",".join(r for r in ROWS if not r.endswith(PREFILL)),
        help="which rows to run (ar is always run: it is the baseline); ngram+cost is ngram with "
        "dynamic_gamma: cost (draft length chosen from the measured verification-cost curve), "
        "ngram@2 static ngram at γ = 2 (HF's prompt lookup at the same γ beside it); a "
        "+prefill row also verifies drafts in the prompt pass (draft_in_prefill: on), as HF does",
    )
    ap.add_argument(
        "--heads",
        default="params/drafters/smollm2-135m-heads.json",
        help="a trained heads drafter for the heads method ('' to skip)",
    )
    ap.add_argument(
        "--eagle",
        default="params/drafters/smollm2-135m-eagle.json",
        help="a trained EAGLE-style drafter for the eagle method ('' to skip)",
    )
    ap.add_argument(
        "--eagle3",
        default="params/drafters/smollm2-135m-eagle3",
        help="a trained EAGLE-3 head folder for the eagle3 method ('' to skip)",
    )
    ap.add_argument(
        "--mtp",
        default="params/drafters/smollm2-135m-mtp",
        help="a trained MTP layer folder (MiMo layout) for the mtp method ('' to skip)",
    )
    ap.add_argument("--tasks", default="code,summarization")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per task")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--ngram-max", type=int, default=3)
    ap.add_argument("--exit-layer", type=int, default=None, help="layer_skip exit layer (default L/2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 ≈ 2 for memory-bound decoding here)")
    ap.add_argument("--curve", default="1,2,3,4,5,6,8,12,16", help="k values of the T(k)/T(1) curve")
    ap.add_argument("--curve-repeats", type=int, default=7)
    ap.add_argument(
        "--forward",
        choices=("lean", "transformers", "both"),
        default="lean",
        help="the engine's batch-1 forward: its lean static-cache one (specstudy.engine.lean), transformers' "
        "own, or both side by side (rows suffixed [tf]: the before/after of one run)",
    )
    ap.add_argument("--skip-hf", action="store_true", help="skip the HF transformers comparison")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what the engine's step timers and the T(k) curve read: wall seconds, or the calling thread's "
        "CPU seconds (needs --threads 1 and --skip-hf: on a shared machine other processes' time slices "
        "then do not count)",
    )
    ap.add_argument("--chat", choices=("yes", "no"), default="yes")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    unknown = sorted({m.strip() for m in args.methods.split(",") if m.strip()} - set(ROWS))
    problems = []
    if unknown:  # before any model is loaded
        problems.append(f"--methods: unknown row(s) {unknown}; allowed: {list(ROWS)}")
    if args.clock == "cpu" and (args.threads != 1 or not args.skip_hf):
        problems.append(
            f"--clock cpu: needs --threads 1 (got {args.threads}) and --skip-hf (got {args.skip_hf}): one "
            "thread's CPU time is the whole step only at one thread, and HF's rows are timed on the wall clock"
        )
    if problems:
        ap.error("; ".join(problems))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    torch.set_num_threads(args.threads)
    from specstudy.engine.trace import use_thread_clock

    use_thread_clock(args.clock == "cpu")
    from specstudy.backends.reference.reference_backend import ReferenceBackend
    from specstudy.cpu_speed import measure_cpu
    from specstudy.data.model_files import load_model, model_bytes
    from specstudy.engine.lean import set_lean_forward
    from specstudy.engine.stepcost import measure_verify_time

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
    wanted = {m.strip() for m in args.methods.split(",") if m.strip()} | {"ar"}
    methods: list[tuple[str, int | None, dict[str, Any], object, str | None]] = [
        ("ar", None, {}, None, None),
        ("ngram", args.gamma, {"ngram_max": args.ngram_max}, None, None),
        ("ngram+cost", args.gamma, {"ngram_max": args.ngram_max, "dynamic_gamma": "cost"}, None, None),
        ("ngram@2", 2, {"ngram_max": args.ngram_max}, None, None),  # HF's prompt lookup at its best γ here
        ("layer_skip", args.gamma, {"exit_layer": exit_layer}, None, None),
    ]
    if drafter is not None:
        dq = {"draft_quantization": args.draft_quantization} if args.draft_quantization != "none" else {}
        methods.append(("draft_target", args.gamma, dq, drafter, args.drafter))
        methods.append(("draft_target+cost", args.gamma, {**dq, "dynamic_gamma": "cost"}, drafter, args.drafter))
    trained = (("heads", args.heads), ("eagle", args.eagle), ("eagle3", args.eagle3), ("mtp", args.mtp))
    for name, path in trained:  # trained drafters, when there for this model
        if path and drafter_target(path) == args.model:
            methods.append((name, args.gamma, {}, None, path))
    methods += [
        (name + PREFILL, gamma, {**opts, "draft_in_prefill": "on"}, d, dname)
        for name, gamma, opts, d, dname in list(methods)
        if name + PREFILL in ROWS
    ]
    methods = [m for m in methods if m[0] in wanted]
    if args.forward != "lean":
        tf_rows = [(name + TF, gamma, opts, d, dname) for name, gamma, opts, d, dname in methods]
        methods = tf_rows if args.forward == "transformers" else methods + tf_rows

    def run_row(name: str, reqs: list[Request], c: Cell) -> list[RequestRecord]:
        """One engine row's records, through the forward the row names."""
        previous = set_lean_forward(not name.endswith(TF))
        try:
            return list(backend.run(reqs, sampling, c))
        finally:
            set_lean_forward(previous)

    def cell(name: str, gamma: int | None, opts: dict[str, Any], dname: str | None) -> Cell:
        return Cell(
            study="bench",
            hardware="local",
            framework="reference",
            method=method_of(name),
            task="mixed",
            model=args.model,
            drafter=dname,
            gamma=gamma,
            options=tuple(sorted(opts.items())),
        )

    # warm-up (untimed): one full-length request per method (CPU kernel set-up is per shape)
    for name, gamma, opts, d, dname in methods:
        if d is not None:
            backend._drafters[(method_of(name), dname)] = d
        run_row(name, requests[:1], cell(name, gamma, opts, dname))
    if (
        drafter is not None
        and args.draft_quantization != "none"
        and any(method_of(m[0]) == "draft_target" for m in methods)
    ):
        drafter = backend._drafters[("draft_target", args.drafter, args.draft_quantization)]  # HF gets the same module

    if drafter is not None:
        print(
            f"draft model {args.drafter}: {model_bytes(drafter) / 1e6:.0f} MB in parameters, quantization "
            f"{args.draft_quantization}"
        )
    print(
        f"model {args.model}: {n_layers} layers, {model_bytes(model) / 1e6:.0f} MB fp32; prompts: "
        f"{len(requests)} from {source} ({', '.join(tasks)}), {args.max_new_tokens} new tokens, greedy, "
        f"gamma {args.gamma}, threads {args.threads}, clock {args.clock}, load avg {load0[0]:.2f}"
    )

    ks = sorted({int(k) for k in args.curve.split(",")} | {args.gamma + 1})
    curves: dict[str, dict[int, float]] = {}  # per forward ("" lean, TF transformers'): T(k) seconds
    for suffix in [x for x, on in (("", args.forward != "transformers"), (TF, args.forward != "lean")) if on]:
        previous = set_lean_forward(suffix == "")
        curves[suffix] = measure_verify_time(model, prompt_ids[0], ks, args.curve_repeats)
        set_lean_forward(previous)
    ratios = {suffix: {k: t[k] / t[1] for k in ks} for suffix, t in curves.items()}
    for suffix, t in curves.items():
        print(
            f"verification cost T(k)/T(1) ({'transformers forward' if suffix else 'lean forward'}): "
            + "  ".join(f"k={k}:{ratios[suffix][k]:.2f}" for k in ks)
            + f"   (T(1) = {t[1] * 1e3:.1f} ms)"
        )

    # HF transformers' own implementation of each row, through the kit's hf backend (the same
    # records and metrics; it sets the draft length on the *drafting* model's generation_config,
    # which transformers 5 reads instead of generate()'s: passed to generate(), γ is ignored and
    # the assistant drafts its default 20 tokens with a confidence cut-off)
    from specstudy.backends.hf.hf_backend import HfBackend

    hf_backend = HfBackend(args.model, model_obj=model, drafter_obj=drafter, tokenizer=tok)

    def hf_cell(name: str, gamma: int | None) -> Cell | None:
        """The HF row beside an engine row, at the row's γ (a dynamic-γ row: at its cap)."""
        m = method_of(name)
        if args.skip_hf or m not in HfBackend.methods:
            return None
        opts = {"ngram": {"ngram_max": args.ngram_max}, "layer_skip": {"exit_layer": exit_layer}}.get(m, {})
        return Cell(
            study="bench",
            hardware="local",
            framework="hf",
            method=m,
            task="mixed",
            model=args.model,
            drafter=args.drafter if m == "draft_target" else None,
            gamma=gamma if m != "ar" else None,
            options=tuple(sorted(opts.items())),
        )

    def hf_key(name: str) -> str:  # a +prefill or [tf] row is compared with the same HF row as its plain twin
        return name.removesuffix(TF).removesuffix(PREFILL)

    results: dict[str, dict[str, Any]] = {}
    records: dict[str, list[RequestRecord]] = {}
    hf_cells = {hf_key(name): c for name, gamma, *_ in methods if (c := hf_cell(name, gamma)) is not None}
    for c in hf_cells.values():
        list(hf_backend.run(requests[:1], sampling, c))  # untimed full-length warm-up, as every engine row gets
    ours: dict[str, list[RequestRecord]] = {name: [] for name, *_ in methods}
    hf_recs: dict[str, list[RequestRecord]] = {key: [] for key in hf_cells}
    for req in requests:  # round robin per prompt: this machine's speed drifts by 10 %+
        hf_done = set()
        for name, gamma, opts, _, dname in methods:
            ours[name] += run_row(name, [req], cell(name, gamma, opts, dname))
            if (key := hf_key(name)) in hf_cells and key not in hf_done:
                hf_recs[key] += list(hf_backend.run([req], sampling, hf_cells[key]))
                hf_done.add(key)
    for name, gamma, opts, _d, _dname in methods:
        recs = ours[name]
        bad = [r for r in recs if r.status != "ok"]
        if bad:
            print(f"{name}: {len(bad)} failed requests: {bad[0].error.splitlines()[0]}")
            continue
        records[name] = recs
        acc = metrics.acceptance_summary(recs)
        steps = [s for r in recs for s in r.steps[1:]]  # without the prefill step
        drafted = sum(s.drafted for s in steps)
        results[name] = {
            "tokens_per_s": metrics.per_request_throughput(recs),
            "alpha": acc["alpha"],
            "tpot_s": statistics.mean(metrics.tpot(r) for r in recs),
            "alpha_hat": acc["alpha_hat"],
            "acceptance_length": acc["acceptance_length"],
            "gamma": gamma,
            "dynamic_gamma": opts.get("dynamic_gamma", "off") != "off",
            "draft_s_per_token": (sum(s.draft_s or 0.0 for s in steps) / drafted) if drafted else None,
            "verify_s_per_step": statistics.median([s.verify_s for s in steps if s.verify_s]),
        }
        by_k: dict[int, list[float]] = {}
        for s in steps:
            if s.verify_s is not None:  # a step without a timed verification has no cost to show
                by_k.setdefault(s.drafted, []).append(s.verify_s)
        results[name]["verify_s_by_drafted"] = {k: statistics.median(v) for k, v in sorted(by_k.items())}

    for name, r in results.items():
        derive_row(name, r, results, records, ratios[TF if name.endswith(TF) else ""])
        hf = hf_recs.get(hf_key(name))
        if hf:
            compare_hf(r, hf, records[name])

    cpu = measure_cpu()
    print_table(results)
    print_verify_costs(results, records, ratios)
    limits = machine_limits(model, model_bytes(model), ks, args.curve_repeats)
    print_limits(results, ratios, limits, cpu)
    use_thread_clock(False)  # the engine's default again (a caller in this process times on the wall)
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "results": results,
                    # the first forward run (lean unless --forward transformers); with both, the other beside it
                    "verify_ratio": next(iter(ratios.values())),
                    "curve_s": next(iter(curves.values())),
                    "verify_ratio_transformers_forward": ratios.get(TF) if len(ratios) > 1 else None,
                    "limits": limits,
                    "cpu": cpu,
                    "load_avg": [load0, load1],
                    "args": vars(args),
                },
                indent=2,
                default=str,
            )
        )
    return 0


def derive_row(
    name: str,
    r: dict[str, Any],
    results: dict[str, dict[str, Any]],
    records: dict[str, list[RequestRecord]],
    ratio: dict[int, float],
) -> None:
    """Speedups against the row's paired AR (the same forward), c, and the cost model's prediction."""
    nan = float("nan")
    base_name = baseline_of(name)
    base = results.get(base_name)
    r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base else nan
    # the cost model describes decoding steps: compare it with the TPOT ratio (prefill excluded)
    r["decode_speedup"] = base["tpot_s"] / r["tpot_s"] if base else nan
    r["exact_match_vs_ar"] = metrics.exact_match_rate(records[base_name], records[name]) if base else nan
    if not r["gamma"] or not base:
        return
    r["c"] = (r["draft_s_per_token"] or 0.0) / base["verify_s_per_step"]  # per AR step, measured in decoding
    # dynamic γ has no single γ for the static-γ formula; a +prefill row's first chunk holds
    # several tokens, so its TPOT (and decode speedup) is not the per-step quantity predicted
    if r["dynamic_gamma"] or name.removesuffix(TF).endswith(PREFILL):
        return
    r["verify_ratio"] = ratio.get(r["gamma"] + 1, nan)
    a = r["alpha_hat"]
    # the kit's cost model over the row's measured draft lengths (n-gram steps draft only on
    # a match, often fewer than γ), with this bench's own T(k)/T(1) curve: a draft of k verifies k + 1
    mix = draft_mix([(records[name], records[base_name])])
    curve_of = verify_curve({k - 1: v for k, v in ratio.items() if k > 1})
    if mix is not None and curve_of is not None:
        r["predicted"] = costmodel.mix_speedup(mix, r["gamma"], r["c"], curve_of)
    else:
        clipped = min(max(a, 0.0), 1.0)
        r["predicted"] = (
            costmodel.speedup_with_verify_cost(clipped, r["gamma"], r["c"], r["verify_ratio"]) if a == a else nan
        )
    r["measured_over_predicted"] = r["decode_speedup"] / r["predicted"] if r["predicted"] else nan


def compare_hf(r: dict[str, Any], hf: list[RequestRecord], ours: list[RequestRecord]) -> None:
    """HF's own implementation of the row on the same prompts: tokens/s, AL, ours/HF, same tokens."""
    bad = [x for x in hf if x.status != "ok"]
    if bad:  # an HF feature missing for this model is a row note, not a crash
        r["hf_error"] = bad[0].error.splitlines()[0]
        return
    r["hf_tokens_per_s"] = metrics.per_request_throughput(hf)
    r["hf_acceptance_length"] = metrics.acceptance_summary(hf)["acceptance_length"]
    r["ours_over_hf"] = r["tokens_per_s"] / r["hf_tokens_per_s"]
    r["hf_same_tokens"] = metrics.exact_match_rate(hf, ours)


def fmt(v: float | None, p: int = 2) -> str:
    """A figure, or "-" when there is none."""
    return "-" if v is None or v != v else f"{v:.{p}f}"


def print_table(results: dict[str, dict[str, Any]]) -> None:
    f = fmt
    head = (
        f"{'method':<27}{'tok/s':>8}{'speedup':>9}{'dec.sp':>8}{'alpha':>7}{'a_hat':>7}{'AL':>6}{'c':>7}{'T(g+1)/T1':>10}"
        f"{'pred':>7}{'meas/pred':>10}{'HF tok/s':>10}{'HF AL':>7}{'ours/HF':>9}{'HF=ours':>8}{'=ar':>5}"
    )
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        print(
            f"{name:<27}{f(r['tokens_per_s']):>8}{f(r['speedup']):>9}{f(r['decode_speedup']):>8}{f(r['alpha']):>7}{f(r['alpha_hat']):>7}"
            f"{f(r['acceptance_length']):>6}{f(r.get('c'), 3):>7}{f(r.get('verify_ratio')):>10}{f(r.get('predicted')):>7}"
            f"{f(r.get('measured_over_predicted')):>10}{f(r.get('hf_tokens_per_s')):>10}{f(r.get('hf_acceptance_length')):>7}"
            f"{f(r.get('ours_over_hf')):>9}"
            f"{f(r.get('hf_same_tokens')):>8}{f(r['exact_match_vs_ar']):>5}"
        )
        if "hf_error" in r:
            print(f"    HF comparison failed: {r['hf_error']}")
    for name, r in results.items():
        base = results.get(baseline_of(name))
        if r["gamma"] and base:
            t1 = base["verify_s_per_step"]
            print(
                f"{name}: verification step time / AR step, by tokens drafted: "
                + "  ".join(f"{k}:{v / t1:.2f}" for k, v in r["verify_s_by_drafted"].items())
            )


def print_verify_costs(
    results: dict[str, dict[str, Any]], records: dict[str, list[RequestRecord]], ratios: dict[str, dict[int, float]]
) -> None:
    """Each drafting row's measured step costs in its paired AR's T1 (c and one verification over
    drafted + 1 tokens, :func:`specstudy.analysis.stats.step_costs`) beside AR's own curve T(γ+1)/T(1)
    from the same run: a method whose verification costs more than the curve says pays for something
    besides the target's forward (a feature capture, a copy, a fallback off the lean forward)."""
    from specstudy.analysis.stats import step_costs

    print("verification cost per step, in units of the paired AR step T1, beside AR's curve T(g+1)/T(1):")
    print(f"{'method':<27}{'gamma':>6}{'c':>8}{'verify/T1':>11}{'AR curve':>10}{'verify/curve':>14}")
    for name, r in results.items():
        base = baseline_of(name)
        if not r["gamma"] or r["dynamic_gamma"] or base not in records or name not in records:
            continue
        c, v = step_costs(records[name], records[base])
        curve = ratios[TF if name.endswith(TF) else ""].get(r["gamma"] + 1, float("nan"))
        r["step_c"], r["step_verify_ratio"], r["verify_over_curve"] = c, v, v / curve
        print(f"{name:<27}{r['gamma']:>6}{fmt(c, 3):>8}{fmt(v):>11}{fmt(curve):>10}{fmt(v / curve):>14}")


def machine_limits(model: Any, nbytes: int, ks: Sequence[int], repeats: int) -> dict[str, Any]:
    """What this CPU allows at the bench's threads: a copy as large as the model (past the
    caches) and the model's matmuls alone at M = k (:func:`specstudy.engine.stepcost.matmul_pass_time`)."""
    from specstudy.cpu_speed import copy_bandwidth_gbps
    from specstudy.engine.stepcost import matmul_pass_time

    small = [k for k in ks if k <= 8]
    return {
        "copy_gbps_model_size": copy_bandwidth_gbps(nbytes),
        "matmul_pass_s": matmul_pass_time(model, small, repeats),
        "packed_matmul_pass_s": matmul_pass_time(model, small, repeats, packed=True),
        "model_bytes": nbytes,
    }


def print_limits(
    results: dict[str, dict[str, Any]],
    ratios: dict[str, dict[int, float]],
    limits: dict[str, Any],
    cpu: dict[str, float],
) -> None:
    """The issue-27 targets against what the machine allows, in measured numbers."""
    mm, nbytes = limits["matmul_pass_s"], limits["model_bytes"]
    big = limits["copy_gbps_model_size"]
    print(
        f"copy bandwidth: {cpu['copy_bandwidth_gbps']:.2f} GB/s at 64 MiB (measure_cpu), {big:.2f} GB/s at the "
        f"model's {nbytes / 1e6:.0f} MB; the model's matmuls alone at M=1 stream {nbytes / mm[1] / 1e9:.2f} GB/s "
        f"({1 / mm[1]:.1f} passes/s: the 1-token forward's ceiling at these threads)"
    )
    for suffix in ("", TF):
        base = results.get("ar" + suffix)
        if base:
            bw = nbytes * base["tokens_per_s"] / 1e9
            base["achieved_bandwidth_gbps"] = bw
            print(
                f"AR{suffix or ' (lean)'}: {base['tokens_per_s']:.2f} tok/s = {bw:.2f} GB/s of model bytes: "
                f"{bw / cpu['copy_bandwidth_gbps']:.0%} of the 64 MiB copy, {bw / big:.0%} of the model-size copy, "
                f"{base['tokens_per_s'] * mm[1]:.0%} of the matmul-only pass rate (target: >= 50 % of copy bandwidth)"
            )
    floors = {"": limits["packed_matmul_pass_s"], TF: mm}  # what each forward multiplies with
    for suffix, how in ((TF, "F.linear, as transformers"), ("", "prepacked, as the lean forward")):
        fl = floors[suffix]
        print(
            f"matmul floor T_mm(k)/T_mm(1), every weight at M=k, {how} (GFLOP/s): "
            + "  ".join(f"k={k}:{t / fl[1]:.2f} ({2 * k * nbytes / 4 / t / 1e9:.0f})" for k, t in fl.items())
        )
    for suffix, ratio in ratios.items():
        fl = floors[suffix]
        print(
            f"T(k)/T(1){suffix or ' (lean)'} over its matmul floor: "
            + "  ".join(f"k={k}:{ratio[k] / (fl[k] / fl[1]):.2f}" for k in fl if k in ratio)
            + "   (target T(k)/T(1) <= 1.25 for k <= 5, non-decreasing)"
        )


if __name__ == "__main__":
    sys.exit(main())
