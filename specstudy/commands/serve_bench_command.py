"""specstudy serve-bench: request-rate sweep against an inference server, speculation on vs off."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..config.schema import Slo
    from ..records import Request

REPO = Path(__file__).resolve().parents[2]


def serve_bench_servers() -> list[str]:
    """The servers serve-bench can start or attach to (their declarations say ``serve_bench``)."""
    from ..frameworks import DECLARATIONS

    return [f for f, d in DECLARATIONS.items() if d.serve_bench]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="vllm-server", help=f"one of {', '.join(serve_bench_servers())}")
    p.add_argument("--model", required=True, help="registry name (params/models), local directory or hub id")
    p.add_argument("--drafter", default=None, help="draft model for draft_target / eagle / medusa")
    p.add_argument("--spec", required=True, help="speculative method: ngram, draft_target, eagle, eagle3, medusa, ...")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per step (num_speculative_tokens)")
    p.add_argument("--ngram-min", type=int, default=2, help="ngram: shortest match (prompt_lookup_min)")
    p.add_argument("--ngram-max", type=int, default=4, help="ngram: longest match (prompt_lookup_max)")
    p.add_argument("--rates", default="0.5,1,inf", help="requests/s, comma-separated; inf = all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of inter-arrival gaps (1 = Poisson)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="max requests in flight; with rate inf a closed loop of this many clients",
    )
    p.add_argument("--num-requests", type=int, default=8, help="timed requests per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up requests before each run")
    p.add_argument("--task", default="code", help="prompt source: a task in params/tasks")
    p.add_argument(
        "--prompts-file", default=None, help="prompts instead of a task: .txt (one per line) or .jsonl ('prompt')"
    )
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable) instead of a task")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput SLO on TTFT")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput SLO on TPOT")
    p.add_argument("--slo-e2e-ms", type=float, default=None, help="goodput SLO on end-to-end latency")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds one request may take")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds one run (one rate) may take")
    p.add_argument("--ready-timeout", type=float, default=1500.0, help="seconds a server may take to start")
    p.add_argument("--no-baseline", action="store_true", help="skip the paired run without speculation")
    p.add_argument("--base-url", default=None, help="attach to a running speculative server instead of starting one")
    p.add_argument("--baseline-url", default=None, help="attach to a running baseline (no speculation) server")
    p.add_argument(
        "--python",
        default=None,
        help="interpreter of the engine's environment (default: the kit's pinned env of the engine, e.g. .venv-vllm, when installed)",
    )
    p.add_argument(
        "--server-command",
        default=None,
        help="engines that start from a command line (openai and any OpenAI-compatible declaration): "
        "the command with {port} {model} {drafter} {gamma}",
    )
    p.add_argument(
        "--server-arg", action="append", default=[], help="extra server flag (repeatable; use --server-arg=--x)"
    )
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server process (repeatable)")
    p.add_argument(
        "--dtype",
        default=None,
        help="weights' dtype, for engines that take one (default float32 without a GPU, else auto)",
    )
    p.add_argument(
        "--max-model-len", type=int, default=None, help="context length, for engines that take one (default 2048)"
    )
    p.add_argument(
        "--prefix-cache",
        choices=("on", "off"),
        default=None,
        help="prefix caching, for engines that take it (default off)",
    )
    p.add_argument("--hardware", default="cpu", help="hardware label written into the records")
    p.add_argument("--out", default=None, help="output folder (default outputs/<hardware>/serve-bench/<time>)")


def _check(args: argparse.Namespace) -> tuple[list[float], Slo, dict[str, str]]:
    """Every bad value named before anything starts."""
    from ..backends import get_backend  # noqa: F401  (import errors surface here)
    from ..config.schema import Slo
    from ..run.serving_driver import parse_rates

    if args.backend not in serve_bench_servers():
        raise ValueError(f"--backend={args.backend!r}: serve-bench drives servers; allowed: {serve_bench_servers()}")
    rates = parse_rates(args.rates)
    for name in ("num_requests", "gamma"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
    if args.warmup < 0:
        raise ValueError(f"--warmup={args.warmup}: must be >= 0")
    if args.spec == "ar":
        raise ValueError("--spec=ar: give the speculative method; the ar baseline is run automatically")
    if args.ngram_min > args.ngram_max:
        raise ValueError(f"--ngram-min={args.ngram_min} > --ngram-max={args.ngram_max}")
    envs: dict[str, str] = {}
    for kv in args.env:
        if "=" not in kv:
            raise ValueError(f"--env={kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        envs[k] = v

    given = {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "e2e_ms": args.slo_e2e_ms}
    return rates, Slo(**{k: v for k, v in given.items() if v is not None}), envs  # unset: the seed's default


def _prompts(args: argparse.Namespace, n: int) -> Sequence[Request]:
    from ..records import Request

    if args.prompt:
        texts = list(args.prompt)
    elif args.prompts_file:
        path = Path(args.prompts_file)
        if not path.exists():
            raise FileNotFoundError(f"--prompts-file={path}: no such file")
        if path.suffix == ".jsonl":
            texts = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
        else:
            texts = [line for line in path.read_text().splitlines() if line.strip()]
    else:
        from ..config import get_entry
        from ..data import model_files, tasks

        tokenizer = None
        try:
            get_entry(args.model)
            tokenizer = model_files.load_tokenizer(args.model)
        except Exception:  # a remote/hub model: send the task's text prompts untokenized
            tokenizer = None
        return tasks.load_requests(args.task, n=n, seed=args.seed, tokenizer=tokenizer)
    if not texts:
        raise ValueError("no prompts given")
    return [Request(prompt_id=f"p{i:03d}", prompt=texts[i % len(texts)], task="adhoc") for i in range(n)]


def _engine_python(backend: str) -> str:
    """The interpreter of the backend's pinned engine environment when it is installed (vLLM's,
    SGLang's: specstudy.environments.install), else this one."""
    from ..environments.install import engine_env, is_installed, python_of
    from ..frameworks import environment_of

    engine = environment_of(backend)
    if engine is None:
        return sys.executable
    env = engine_env(engine)
    return str(python_of(env)) if is_installed(env) else sys.executable


def _backend(args: argparse.Namespace, envs: Mapping[str, str], url: str | None) -> Backend:
    """The backend as its declaration says: each serve-bench option goes to the engines that declare it (a
    default only where the engine maps it to a flag of its own), the engine's environment and start variables."""
    from ..backends import get_backend
    from ..frameworks import declaration

    decl = declaration(args.backend)
    gpu = shutil.which("nvidia-smi") is not None
    given = {"dtype": args.dtype, "max_model_len": args.max_model_len, "command": args.server_command}
    given["prefix_cache"] = None if args.prefix_cache is None else args.prefix_cache == "on"
    defaults = {"dtype": "auto" if gpu else "float32", "max_model_len": 2048, "prefix_cache": False}
    opts: dict[str, Any] = dict(
        model=args.model,
        drafter=args.drafter,
        base_url=url,
        ready_timeout_s=args.ready_timeout,
        request_timeout_s=args.request_timeout,
        server_args=args.server_arg,
        python=(args.python or _engine_python(args.backend)) if decl.environments else None,
        log_dir=str(Path(args.out) / "servers"),
    )
    for key, value in given.items():
        if key not in decl.engine_options or (key == "dtype" and not decl.takes_dtype):
            continue
        if value is None and decl.engine_options[key] is not None:
            value = defaults.get(key)
        if value is not None:
            opts[key] = value
    build = "cuda" if gpu else "cpu"
    env = {**next((dict(e.run_env) for e in decl.environments if e.build == build), {}), **envs}
    env.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    opts["env"] = env
    return get_backend(args.backend, **opts)


def run(args: argparse.Namespace) -> int:
    from ..records import Cell, Sampling
    from ..run.serving_driver import SweepConfig, run_sweep

    rates, slo, envs = _check(args)
    sampling = Sampling(temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens)
    if args.out is None:
        args.out = str(REPO / "outputs" / args.hardware / "serve-bench" / time.strftime("%Y%m%d-%H%M%S"))
    reqs = _prompts(args, args.num_requests + args.warmup)
    timed, warm = reqs[: args.num_requests], reqs[args.num_requests :]
    method_options = (("ngram_min", args.ngram_min), ("ngram_max", args.ngram_max)) if args.spec == "ngram" else ()
    cfg = SweepConfig(
        spec_method=args.spec,
        gamma=args.gamma,
        rates=rates,
        burstiness=args.burstiness,
        concurrency=args.concurrency,
        warmup=args.warmup,
        request_timeout_s=args.request_timeout,
        run_timeout_s=args.run_timeout,
        slo=slo,
        baseline=not args.no_baseline,
        seed=args.seed,
        method_options=method_options,
    )
    task = "adhoc" if (args.prompt or args.prompts_file) else args.task
    base = Cell(
        study="serve-bench",
        hardware=args.hardware,
        framework=args.backend,
        method=args.spec,
        task=task,
        model=args.model,
        drafter=args.drafter,
        gamma=args.gamma,
        batch_size=1,
    )
    spec_backend = _backend(args, envs, args.base_url)
    backends = {"spec": spec_backend}
    if not args.no_baseline:
        backends["baseline"] = (
            _backend(args, envs, args.baseline_url) if (args.base_url or args.baseline_url) else spec_backend
        )
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so servers are stopped on `kill`
    log = (lambda *_: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        summary = run_sweep(backends, timed, warm, sampling, base, cfg, args.out, progress=log)
    finally:
        for b in {id(b): b for b in backends.values()}.values():
            b.close()
        signal.signal(signal.SIGTERM, previous)
    summary["out"] = args.out
    if args.json:
        from ..analysis.serving import json_safe as _json_safe

        print(json.dumps(_json_safe(summary), indent=2, default=str))
        return 0
    print(f"records and summary.json in {args.out}")
    for c in summary["comparison"]:
        print(
            f"  rate {c['rate']}: speedup {c['speedup']:.3f} (95% CI {c['ci_low']:.3f}-{c['ci_high']:.3f}), "
            f"throughput x{c['output_throughput_ratio']:.3f}"
        )
    for s in summary["runs"]:
        acc = s.get("run_acceptance") or {}
        if acc:
            print(
                f"  {s['arm']} {s['load']}: alpha {acc.get('alpha')}, vLLM mean acceptance length "
                f"{acc.get('vllm_mean_acceptance_length')} ({acc.get('source')})"
            )
    stop = summary.get("stops_paying_at_rate")
    print("  speculation stops paying at rate: " + ("never (in this sweep)" if stop is None else str(stop)))
    return 0
