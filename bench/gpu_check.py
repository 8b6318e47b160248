"""GPU check for a lent H200: the reference engine's CUDA paths and the figures that calibrate the cost model.

Run it on the lent machine, from the repository root (the working tree travels; nothing is
downloaded, no hub, no network):

    python3 bench/gpu_check.py --out $OUT/calibration.json

It expects one CUDA GPU with about 40 GB free, python3 with torch (2.11 there) built with CUDA,
transformers (5.17 there), pyyaml, psutil, and nvidia-ml-py for telemetry (optional).  It needs
no package beyond those: it imports only ``specstudy.engine``, ``costmodel``, ``metrics`` (and its ``intervals``),
``records``, ``telemetry``, ``synthetic`` and ``params`` (tests/test_gpu_check.py runs it with the kit's other
packages hidden).  It prints one table and writes the JSON after every section, so a run that
is killed leaves what it measured.  Budget, estimated at ~30 ms per 7B step in transformers'
eager mode: about 4 minutes on one H200 — imports and model construction ~40 s, the tiny
CUDA-vs-CPU method check ~20 s, verification-cost curves ~10 s, 15 decode cells of 3 prompts ×
96 tokens after a warm-up (68M block ~45 s, 1.1B block ~70 s: its draft steps cost ~14 ms
each), HF rows ~20 s.  ``--budget-s`` (default 420) is a hard stop: a section or cell that
would start after it is listed under ``skipped``, so even at twice the estimated step time the
run ends within 8 minutes (the cell in flight, then the fit and the JSON, take < 40 s).

On any machine, the same code on the CPU with tiny shapes in seconds (what the tests run):

    python3 bench/gpu_check.py --tiny --out /tmp/calibration.json

What it measures, on random-initialised models of real shapes built from configs (bf16 on
CUDA): a Llama-2-7B-shaped target and two drafts with its vocabulary, 68M-shaped (llama-68m)
and 1.1B-shaped (TinyLlama).  Random weights accept nothing, so speedups are measured with the
engine's synthetic acceptance (option ``synthetic_acceptance``, :mod:`specstudy.synthetic`:
the target still verifies the real drafts, so every step costs what it costs).

* the verification-cost curve T(k)/T(1) at batch 1, 8, 32 (:mod:`specstudy.engine.stepcost`),
  each model's one-token step time, and the draft cost c = T_draft(1) / T_target(1);
* decode speedup (AR's time per output token / the method's) of ``draft_target`` at synthetic
  α 0.6 and 0.8 for γ 2, 4, 6, per draft, beside the cost model's prediction for the profile
  (:func:`specstudy.costmodel.predict`, the roofline with the profile's datasheet figures) and
  the Leviathan formula with the measured c and T(γ+1)/T(1); one cell with the real (≈ 0)
  acceptance; HF ``generate`` with ``assistant_model`` beside HF's own AR;
* peak CUDA memory per cell (``torch.cuda.reset_peak_memory_stats`` per cell) and the draft's
  memory overhead, peak(spec) − peak(AR), beside its weights + KV cache; NVML telemetry
  (temperature, SM and memory clocks, power, throttle reasons) sampled during every cell;
* the CUDA path of every reference method against the CPU path on tiny float64 models
  (greedy outputs identical; synthetic acceptance draws on the CPU, so it matches too);
* a copy-bandwidth and a bf16-matmul microbenchmark, and a fit of the roofline's bandwidth
  efficiency, compute efficiency and step overhead to every measured forward
  (:func:`specstudy.costmodel.fit_roofline`).

JSON schema (``schema: "specstudy.gpu_check"``, ``version: 1``; read the calibration block with
:func:`specstudy.costmodel.load_calibration`, apply it with :func:`~specstudy.costmodel.calibrated_profile`):

    schema, version, created (ISO 8601, UTC), device {name, kind, gpus, driver, host},
    versions {python, torch, cuda, transformers, specstudy}, args {...}, profile (the profile's
    figures as read), shapes {target|draft name: {config, params, weight_bytes}}, wall_s,
    rows: [{section, name, batch, gamma, alpha, measured, predicted, unit, ...extras}]
        sections: microbench, verify (T(k)/T(1)), step (T(1) ms), draft_cost (c), speedup,
        memory, hf, methods, calibration.  ``measured`` is always a finite number; ``predicted``
        a finite number or null; extras e.g. al_measured, al_expected, predicted_measured_costs,
        e2e_speedup, peak_memory_bytes, cell,
    curve {batch: {k: seconds}}, step_s {model: {batch: seconds}}, draft_cost {draft: {batch: c}},
    cells {cell: {peak_memory_bytes, resident_bytes, memory_source, telemetry {...}}},
    telemetry_run {...the whole run, sampled every 2 s: specstudy.telemetry.Telemetry.summary},
    method_check {device, against, cases {case: {same_as_cpu, equals_ar, tokens}}},
    microbench {copy_gbps, matmul_tflops, dtype},
    calibration {profile, usable, why_not, date, device_name, source: "measured", engine,
                 bandwidth_efficiency, compute_efficiency, step_overhead_ms (what the profile
                 reads), fit {rms_rel_error, max_rel_error, points, memory_bound_points,
                 compute_bound_points, identified}, hardware {copy_bandwidth_efficiency,
                 matmul_compute_efficiency}},
    errors [{section, error}], skipped [{section, why}]

The step overhead describes the reference engine (transformers eager, no CUDA graphs: per-layer
launch cost), not vLLM or SGLang; the microbenchmark efficiencies describe the device itself.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import functools
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: spinning threads cost 4x on a CPU
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specstudy import costmodel, metrics  # noqa: E402
from specstudy.engine.methods import DecodeJob, get_method  # noqa: E402
from specstudy.engine.stepcost import measure_verify_time  # noqa: E402
from specstudy.engine.trace import RowTrace, Timer, peak_memory, reset_peak_memory  # noqa: E402
from specstudy.records import Sampling  # noqa: E402
from specstudy.telemetry import TelemetrySampler, host_info  # noqa: E402

#: Llama-shaped configs: (hidden, intermediate, layers, heads, kv heads), vocabulary 32000
REAL_SHAPES = {
    "llama2-7b": (4096, 11008, 32, 32, 32),
    "llama-68m": (768, 3072, 2, 12, 12),
    "tinyllama-1.1b": (2048, 5632, 22, 32, 4),
}
TINY_SHAPES = {"llama2-7b": (64, 128, 4, 4, 2), "llama-68m": (32, 64, 1, 4, 2), "tinyllama-1.1b": (48, 96, 2, 4, 2)}
TARGET, DRAFTS = "llama2-7b", ("llama-68m", "tinyllama-1.1b")
TELEMETRY_KEYS = (
    "telemetry_samples",
    "gpu_temp_max_c",
    "gpu_sm_clock_min_mhz",
    "gpu_sm_clock_mean_mhz",
    "gpu_mem_clock_mean_mhz",
    "gpu_power_mean_w",
    "gpu_power_max_w",
    "gpu_throttle_reasons",
    "gpu_throttled",
    "cpu_freq_mean_mhz",
    "load_1m_max",
)


# --------------------------------------------------------------------------------------------
# arguments (checked before anything is built)


def datasheet_profile(name: str) -> costmodel.HardwareProfile:
    """The ``profile:`` block of ``params/hardware/<name>.yaml`` as the cost model's datasheet profile.

    Read with yaml alone: the lent machine has no pydantic, so the kit's validating loader
    (:func:`specstudy.config.load_hardware_profile`) cannot run there; ``tests/test_gpu_check.py``
    checks that both read the same figures from every shipped profile.
    """
    import yaml

    prof = yaml.safe_load((ROOT / "params" / "hardware" / f"{name}.yaml").read_text())["profile"]
    price = prof.get("price") or {}
    return costmodel.HardwareProfile(
        name=name,
        device=str(prof.get("device", name)),
        memory_bandwidth_gbps=float(prof["memory_bandwidth_gbps"]),
        peak_tflops_by_dtype={k: float(v) for k, v in prof["peak_tflops"].items()},
        memory_gb=float(prof["memory_gb"]),
        bandwidth_efficiency=float(prof.get("bandwidth_efficiency", 0.65)),
        compute_efficiency=float(prof.get("compute_efficiency", 0.6)),
        step_overhead_ms=float(prof.get("step_overhead_ms", 0.2)),
        kind=str(prof.get("kind", "gpu")),
        source="datasheet",
        price_usd_per_hour=float(price["usd_per_hour"]) if price.get("usd_per_hour") is not None else None,
        price_date=str(price.get("date", "")),
        price_source=str(price.get("source", "")),
    )


def _numbers(text: str, what: str, lo: float, hi: float, kind: type = float) -> list[Any]:
    """Comma-separated numbers in [lo, hi] (ints when ``kind`` is int), or an error naming them."""
    need = f"--{what}={text!r}: need comma-separated {'integers' if kind is int else 'numbers'} in [{lo}, {hi}]"
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(need) from None
    if not vals or any(not lo <= v <= hi or (kind is int and v != int(v)) for v in vals):
        raise SystemExit(need)
    return [kind(v) for v in vals]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="where the JSON goes (e.g. $OUT/calibration.json)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--shapes", default="real", choices=["real", "tiny"])
    p.add_argument("--tiny", action="store_true", help="= --device cpu --shapes tiny (seconds, for tests)")
    p.add_argument("--profile", default="h200", help="hardware profile the predictions use (params/hardware/)")
    p.add_argument("--budget-s", type=float, default=420.0, help="no section or cell starts after this many seconds")
    p.add_argument("--prompts", type=int, default=None, help="prompts per cell (default 3; tiny 2)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 256; tiny 12)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="output tokens (default 96; tiny 12)")
    p.add_argument("--gammas", default="2,4,6", help="draft lengths of the speedup cells")
    p.add_argument("--alphas", default="0.6,0.8", help="synthetic acceptance rates of the speedup cells")
    p.add_argument("--batches", default="1,8,32", help="batch sizes of the verification-cost curve")
    p.add_argument("--seed", type=int, default=0)
    return check_args(p.parse_args(argv))


def check_args(a: argparse.Namespace) -> argparse.Namespace:
    """Defaults by shapes, ranges, the device, the engine's own option check and the profile:
    every refusal before a model is built."""
    if a.tiny:
        a.device, a.shapes = "cpu", "tiny"
    tiny = a.shapes == "tiny"
    a.prompts = a.prompts or (2 if tiny else 3)
    a.prompt_len = a.prompt_len or (12 if tiny else 256)
    a.max_new_tokens = a.max_new_tokens or (12 if tiny else 96)
    a.gammas = _numbers(a.gammas, "gammas", 1, 16, int)
    a.alphas = _numbers(a.alphas, "alphas", 0.0, 1.0)
    a.batches = _numbers(a.batches, "batches", 1, 256, int)
    for name in ("prompts", "prompt_len", "max_new_tokens"):
        if getattr(a, name) < 2:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(a, name)}: need >= 2")
    if a.budget_s <= 0:
        raise SystemExit(f"--budget-s={a.budget_s}: need > 0")
    if 1 not in a.batches:
        raise SystemExit(
            f"--batches={','.join(map(str, a.batches))}: must include 1 (c and the speedup cells are at batch 1)"
        )
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here (use --tiny on a CPU machine)")
    if a.device == "cpu" and not tiny:
        raise SystemExit("--shapes real needs CUDA (a 7B model in fp32 on a CPU is 27 GB and hours); use --tiny")
    for alpha in a.alphas:
        for g in a.gammas:
            get_method("draft_target").check(g, 1, "draft", {"synthetic_acceptance": f"alpha={alpha}"})
    a.profile_obj = datasheet_profile(a.profile)
    return a


# --------------------------------------------------------------------------------------------
# the run's state: rows, sections, the JSON written after every section


class Run:
    """Collects rows and sections; a failing section is recorded, not fatal."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.t0 = args, time.monotonic()
        self.device = torch.device(args.device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.cm_dtype = "bf16" if self.dtype == torch.bfloat16 else "fp32"
        self.hw = args.profile_obj
        self.shapes = TINY_SHAPES if args.shapes == "tiny" else REAL_SHAPES
        self.p_target = 0  # the target's parameter count, once it is built
        self.data: dict[str, Any] = {
            "schema": costmodel.CALIBRATION_SCHEMA,
            "version": costmodel.CALIBRATION_VERSION,
            "rows": [],
            "curve": {},
            "step_s": {},
            "draft_cost": {},
            "cells": {},
            "errors": [],
            "skipped": [],
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def row(
        self,
        section: str,
        name: str,
        measured: float,
        predicted: float | None,
        unit: str,
        batch: int | None = None,
        gamma: int | None = None,
        alpha: float | None = None,
        **extra: Any,
    ) -> None:
        if not math.isfinite(float(measured)):
            self.data["errors"].append({"section": section, "error": f"{name}: measured {measured!r} is not finite"})
            return
        self.data["rows"].append(
            {
                "section": section,
                "name": name,
                "batch": batch,
                "gamma": gamma,
                "alpha": alpha,
                "measured": float(measured),
                "predicted": _finite_or_none(predicted),
                "unit": unit,
                **{k: _json_value(v) for k, v in extra.items()},
            }
        )

    def section(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run one section inside the budget; errors and skips are recorded; the JSON is rewritten."""
        if self.elapsed() > self.args.budget_s:
            self.data["skipped"].append({"section": name, "why": f"time budget {self.args.budget_s:.0f} s spent"})
            print(f"[{self.elapsed():6.1f} s] skip {name}: budget spent", flush=True)
            return None
        print(f"[{self.elapsed():6.1f} s] {name}", flush=True)
        try:
            return fn()
        except Exception as e:  # one failing section must not lose the others on a lent machine
            self.data["errors"].append(
                {"section": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
            )
            print(f"  ERROR in {name}: {type(e).__name__}: {e}", flush=True)
            return None
        finally:
            self.write()

    def write(self) -> None:
        self.data["wall_s"] = self.elapsed()
        out = Path(self.args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(_json_value(self.data), indent=1, allow_nan=False, default=str))
        os.replace(tmp, out)


def _finite_or_none(v: Any) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _json_value(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return v


# --------------------------------------------------------------------------------------------
# models from configs (random weights, no download)


def llama_config(shape: tuple[int, int, int, int, int], vocab: int, max_positions: int) -> Any:
    from transformers import LlamaConfig

    hidden, inter, layers, heads, kv = shape
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "sdpa"  # what the attn_implementation keyword sets (not a declared field)
    return config


def build_model(config: Any, device: torch.device, dtype: torch.dtype, seed: int, logit_scale: float = 1.0) -> Any:
    """A random-initialised causal LM built directly on ``device`` in ``dtype`` (no fp32 copy)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model: Any = LlamaForCausalLM(config)  # used through transformers' untyped eval, generate, config
    finally:
        torch.set_default_dtype(old)
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    model.generation_config.pad_token_id = 0
    return model.requires_grad_(False).eval()


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes(config: Any, dtype: torch.dtype, batch: int, tokens: int) -> int:
    """Keys and values of ``tokens`` positions for ``batch`` rows."""
    head_dim = config.hidden_size // config.num_attention_heads
    size = torch.empty((), dtype=dtype).element_size()
    return int(2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * size * batch * tokens)


def free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


# --------------------------------------------------------------------------------------------
# microbenchmarks: the device's own ceilings


def microbench(run: Run) -> None:
    """Best-of-10 device copy (bytes read + written) and square matmul, in the model dtype."""
    tiny = run.args.shapes == "tiny"
    n = (8 << 20) if tiny else (1 << 30)  # elements: 16 MiB / 2 GiB in bf16
    m = 256 if tiny else 8192
    x = torch.empty(n, dtype=run.dtype, device=run.device).normal_()
    y = torch.empty_like(x)
    a = torch.randn((m, m), dtype=run.dtype, device=run.device)
    copy_s, mm_s = [], []
    for _ in range(11):
        with Timer(run.device) as t:
            y.copy_(x)
        copy_s.append(t.s)
        with Timer(run.device) as t:
            a @ a
        mm_s.append(t.s)
    copy_gbps = 2 * x.numel() * x.element_size() / min(copy_s[1:]) / 1e9
    tflops = 2 * m**3 / min(mm_s[1:]) / 1e12
    del x, y, a
    free(run.device)
    run.data["microbench"] = {
        "copy_gbps": copy_gbps,
        "matmul_tflops": tflops,
        "dtype": run.cm_dtype,
        "copy_bytes": 2 * n * (2 if run.dtype == torch.bfloat16 else 4),
        "matmul_n": m,
    }
    run.row("microbench", "copy bandwidth", copy_gbps, run.hw.memory_bandwidth_gbps, "GB/s")
    run.row("microbench", f"{run.cm_dtype} matmul", tflops, run.hw.peak_tflops(run.cm_dtype), "TFLOP/s")


# --------------------------------------------------------------------------------------------
# every reference method: CUDA path against the CPU path (tiny float64 models)

CHECK_PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], [5, 6, 7], [9, 9, 9, 9, 9, 9, 1, 2, 3, 4]]


def check_models(device: torch.device) -> dict[str, Any]:
    """The same tiny target, draft model, heads and EAGLE layer, built on the CPU, moved to ``device``."""
    from specstudy.engine.drafters import EagleDraft, MedusaHeads

    target = build_model(llama_config((32, 64, 4, 4, 2), 96, 512), torch.device("cpu"), torch.float64, 0, 8.0)
    draft = build_model(llama_config((32, 64, 1, 4, 2), 96, 512), torch.device("cpu"), torch.float64, 1, 8.0)
    torch.manual_seed(2)
    heads = MedusaHeads(32, num_heads=3, num_layers=1).double()
    for prm in heads.parameters():
        torch.nn.init.normal_(prm, std=0.2)
    eagle = EagleDraft.for_target(target.config).double()
    models = {"target": target, "draft": draft, "heads": heads, "eagle": eagle}
    return {k: copy.deepcopy(v).to(device) for k, v in models.items()} if device.type != "cpu" else models


#: (case, method, drafter key, gamma, options, batch 1 only)
CheckCase = tuple[str, str, str | None, int | None, dict[str, Any], bool]
CHECK_CASES: list[CheckCase] = [
    ("ar", "ar", None, None, {}, False),
    ("ngram", "ngram", None, 4, {"ngram_max": 3}, False),
    ("draft_target", "draft_target", "draft", 4, {}, False),
    ("draft_target+prefill", "draft_target", "draft", 3, {"draft_in_prefill": "on"}, False),
    ("layer_skip", "layer_skip", None, 3, {"exit_layer": 2}, False),
    ("heads", "heads", "heads", 3, {}, False),
    ("heads_tree", "heads", "heads", 3, {"heads_tree": "2,2,1"}, True),
    ("eagle", "eagle", "eagle", 3, {}, False),
    ("tree", "tree", "draft", 3, {"tree_width": 2}, True),
    ("tree_self", "tree", "self:2", 3, {"tree_width": 2}, True),
    ("draft_target+synthetic", "draft_target", "draft", 4, {"synthetic_acceptance": "alpha=0.8"}, False),
]


def _decode_all(models: dict[str, Any], case: CheckCase, device: torch.device, sampling: Sampling) -> list[list[int]]:
    _, method, key, gamma, options, single = case
    spec = get_method(method)
    drafter = models.get(key) if key is not None else None  # a module, or a name the method loads
    opts = spec.check(gamma, 1 if single else len(CHECK_PROMPTS), drafter if drafter is not None else key, options)
    if key is not None and drafter is None:
        if spec.load_drafter is None:
            raise ValueError(f"{case[0]}: method {method!r} loads no drafter by name ({key!r})")
        drafter = spec.load_drafter(key, models["target"], str(device), "float64")
    batches = [[p] for p in CHECK_PROMPTS] if single else [CHECK_PROMPTS]
    return [
        r.output_ids
        for b in batches
        for r in spec.decode(
            DecodeJob(models["target"], b, sampling, gamma=gamma, drafter=drafter, options=opts, device=str(device))
        )
    ]


def check_methods(run: Run) -> None:
    """Greedy outputs of every case on the run's device against the CPU (and against AR)."""
    s = Sampling(temperature=0.0, max_new_tokens=12 if run.args.shapes == "tiny" else 24)
    cpu_models = check_models(torch.device("cpu"))
    dev_models = check_models(run.device) if run.device.type != "cpu" else None
    ar = _decode_all(cpu_models, CHECK_CASES[0], torch.device("cpu"), s)
    cases: dict[str, Any] = {}
    for case in CHECK_CASES:
        on_cpu = _decode_all(cpu_models, case, torch.device("cpu"), s)
        on_dev = _decode_all(dev_models, case, run.device, s) if dev_models else None
        lossless = "synthetic" not in case[0]
        cases[case[0]] = {
            "same_as_cpu": None if on_dev is None else on_dev == on_cpu,
            "equals_ar": (on_cpu == ar) if lossless else None,
            "tokens": sum(map(len, on_cpu)),
        }
        if on_dev is not None:
            run.row("methods", f"{case[0]}: {run.device.type} == cpu", float(on_dev == on_cpu), 1.0, "bool")
        if lossless:
            run.row("methods", f"{case[0]}: greedy == ar (cpu)", float(on_cpu == ar), 1.0, "bool")
    run.data["method_check"] = {"device": run.device.type, "against": "cpu", "dtype": "float64", "cases": cases}
    del cpu_models, dev_models
    free(run.device)


# --------------------------------------------------------------------------------------------
# step costs: the verification curve, one-token steps, c


def curve_ks(gammas: Sequence[int]) -> list[int]:
    """k = 1..max γ + 2 for the curve, plus 16 and 32 (compute-bound points for the fit)."""
    return sorted(set(range(1, max(gammas) + 3)) | {16, 32})


def measure_curve(run: Run, target: Any, prompt: list[int]) -> None:
    """T(k) at every batch size: seconds of one forward over k new tokens on a cached prompt."""
    ks = curve_ks(run.args.gammas)
    for b in run.args.batches:
        times = measure_verify_time(target, prompt, ks, repeats=5, batch_size=b, device=run.device)
        run.data["curve"][str(b)] = {str(k): s for k, s in times.items()}
        t1_pred = costmodel.step_time(run.p_target, run.hw, run.cm_dtype, b, 1, 1)
        run.row("step", f"T(1) {TARGET}", times[1] * 1e3, t1_pred * 1e3, "ms", batch=b)
        for k in ks[1:]:
            pred = costmodel.step_time(run.p_target, run.hw, run.cm_dtype, b, k, 1) / t1_pred
            if k <= max(run.args.gammas) + 1:
                run.row("verify", f"T({k})/T(1)", times[k] / times[1], pred, "ratio", batch=b)
    run.data["step_s"][TARGET] = {b: run.data["curve"][b]["1"] for b in run.data["curve"]}


def measure_draft_cost(run: Run, name: str, draft: Any, prompt: list[int]) -> None:
    """T_draft(1) per batch size and c = T_draft(1) / T_target(1) (the target's from the curve)."""
    p_draft = n_params(draft)
    run.data["step_s"][name], run.data["draft_cost"][name] = {}, {}
    for b in run.args.batches:
        t_d = measure_verify_time(draft, prompt, [1], repeats=5, batch_size=b, device=run.device)[1]
        t_t = run.data["curve"][str(b)]["1"]
        run.data["step_s"][name][str(b)] = t_d
        run.data["draft_cost"][name][str(b)] = t_d / t_t
        pd = costmodel.step_time(p_draft, run.hw, run.cm_dtype, b, 1, 1)
        pt = costmodel.step_time(run.p_target, run.hw, run.cm_dtype, b, 1, 1)
        run.row("step", f"T(1) {name}", t_d * 1e3, pd * 1e3, "ms", batch=b)
        run.row("draft_cost", f"c {name}", t_d / t_t, pd / pt, "ratio", batch=b)


# --------------------------------------------------------------------------------------------
# decode cells: warm-up, peak memory and telemetry per cell


def allocated_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:  # pragma: no cover
        return None


def decode_cell(
    run: Run,
    cell: str,
    method: str,
    target: Any,
    prompts: list[list[int]],
    gamma: int | None = None,
    drafter: Any = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One cell: an untimed warm-up decode, then every prompt at batch 1 with the peak memory
    reset before and read after, and telemetry sampled throughout.  Returns pooled figures."""
    spec = get_method(method)
    opts = spec.check(gamma, 1, "draft" if drafter is not None else None, options or {})
    sampling = Sampling(temperature=0.0, max_new_tokens=run.args.max_new_tokens, seed=run.args.seed)

    def job(p: list[int], s: Sampling) -> DecodeJob:
        return DecodeJob(target, [p], s, gamma=gamma, drafter=drafter, options=opts, device=str(run.device))

    spec.decode(job(prompts[0], replace(sampling, max_new_tokens=8)))
    resident = allocated_bytes(run.device)
    reset_peak_memory(run.device)
    rows: list[RowTrace] = []
    with TelemetrySampler(period_s=0.5, gpus=run.device.type == "cuda") as sampler:
        for p in prompts:
            rows += spec.decode(job(p, sampling))
    peak, source = peak_memory(run.device)
    summary = sampler.telemetry.summary()
    run.data["cells"][cell] = {
        "peak_memory_bytes": peak,
        "resident_bytes": resident,
        "memory_source": source,
        "telemetry": {k: _json_value(summary.get(k)) for k in TELEMETRY_KEYS},
    }
    return {"peak": peak, **pool(rows)}


def _times(row: RowTrace) -> tuple[float, float]:
    """(first token, end) seconds of a decoded row: a row without them did not finish, and has no time to pool."""
    if row.first_token_s is None or row.end_s is None:
        raise RuntimeError(f"a decoded row without its first-token or end time ({len(row.output_ids)} tokens)")
    return row.first_token_s, row.end_s


def pool(rows: Sequence[RowTrace]) -> dict[str, float]:
    """Pooled figures of a cell's rows: E2E and decode time (after the first token), tokens, AL, α."""
    steps = [st for r in rows for st in r.steps]
    drafting = [st for st in steps if st.drafted > 0]
    accepted, drafted = sum(st.accepted for st in drafting), sum(st.drafted for st in drafting)
    times = [_times(r) for r in rows]
    return {
        "e2e_s": sum(end for _, end in times),
        "decode_s": sum(end - first for first, end in times),
        "decode_tokens": sum(len(r.output_ids) - 1 for r in rows),
        "tokens": sum(len(r.output_ids) for r in rows),
        "al": metrics.acceptance_length(accepted, len(drafting)),
        "alpha": metrics.acceptance_rate(accepted, drafted) if drafted else float("nan"),
    }


def decode_speedup(ar: dict[str, float], spec: dict[str, float]) -> float:
    """AR's time per output token after the first / the method's (the steps the cost model describes)."""
    return (ar["decode_s"] / ar["decode_tokens"]) / (spec["decode_s"] / spec["decode_tokens"])


# --------------------------------------------------------------------------------------------
# per draft: step costs, AR and speculative cells, memory, HF's assisted generation


def draft_block(run: Run, name: str, target: Any, prompts: list[list[int]], first: bool) -> None:
    """Everything measured with one draft: the paired AR cell first (the draft not yet built, so
    peak(spec) − peak(AR) holds the draft's weights), then the draft's costs and cells; with the
    ``first`` draft also a cell at real acceptance and HF's assisted generation."""
    ar = decode_cell(run, f"ar|{name}", "ar", target, prompts)
    run.row(
        "speedup",
        f"ar tokens/s ({name} block)",
        ar["tokens"] / ar["e2e_s"],
        costmodel.predict(run.hw, run.p_target, None, 0.0, run.cm_dtype, 1, 1, 1).baseline_tokens_per_s,
        "tokens/s",
        batch=1,
        peak_memory_bytes=ar["peak"],
        cell=f"ar|{name}",
    )
    cfg = llama_config(run.shapes[name], target.config.vocab_size, target.config.max_position_embeddings)
    draft = build_model(cfg, run.device, run.dtype, run.args.seed + 1)
    run.data["shapes"][name] = {
        "config": run.shapes[name],
        "params": n_params(draft),
        "weight_bytes": weight_bytes(draft),
    }
    try:
        measure_draft_cost(run, name, draft, prompts[0])
        peaks = [synthetic_cells(run, name, draft, target, prompts, ar, a) for a in run.args.alphas]
        if first:
            peaks.append(real_acceptance_cell(run, name, draft, target, prompts, ar))
        draft_memory_row(run, name, draft, [p for ps in peaks for p in ps if p is not None], ar["peak"])
        if first:
            run.section(
                f"hf assisted generation ({name})", functools.partial(hf_rows, run, name, target, draft, prompts)
            )
    finally:
        draft = None  # the last reference: the next block's memory starts without it
        free(run.device)


def synthetic_cells(
    run: Run, name: str, draft: Any, target: Any, prompts: list[list[int]], ar: dict[str, float], alpha: float
) -> list[int | None]:
    """draft_target at synthetic α for every γ, beside the profile's roofline prediction and the
    Leviathan formula with the measured c and T(γ+1)/T(1)."""
    p_draft, c = n_params(draft), run.data["draft_cost"][name]["1"]
    curve = run.data["curve"].get("1")
    peaks = []
    for g in run.args.gammas:
        if run.elapsed() > run.args.budget_s:
            run.data["skipped"].append({"section": f"speedup {name} alpha={alpha} gamma={g}", "why": "time budget"})
            continue
        cell = f"draft_target|{name}|alpha={alpha}|g{g}"
        sp = decode_cell(
            run, cell, "draft_target", target, prompts, g, draft, {"synthetic_acceptance": f"alpha={alpha}"}
        )
        pred = costmodel.predict(run.hw, run.p_target, p_draft, alpha, run.cm_dtype, 1, g, 1).speedup
        from_costs = costmodel.speedup_with_verify_cost(alpha, g, c, curve[str(g + 1)] / curve["1"]) if curve else None
        run.row(
            "speedup",
            f"{name} synthetic",
            decode_speedup(ar, sp),
            pred,
            "x",
            batch=1,
            gamma=g,
            alpha=alpha,
            predicted_measured_costs=from_costs,
            al_measured=sp["al"],
            al_expected=metrics.expected_acceptance_length(alpha, g),
            e2e_speedup=ar["e2e_s"] / sp["e2e_s"],
            peak_memory_bytes=sp["peak"],
            cell=cell,
        )
        peaks.append(sp["peak"])
    return peaks


def real_acceptance_cell(
    run: Run, name: str, draft: Any, target: Any, prompts: list[list[int]], ar: dict[str, float]
) -> list[int | None]:
    """draft_target with real verification at the middle γ: random weights accept ~nothing."""
    g = run.args.gammas[len(run.args.gammas) // 2]
    cell = f"draft_target|{name}|real|g{g}"
    sp = decode_cell(run, cell, "draft_target", target, prompts, g, draft)
    alpha = sp["alpha"] if math.isfinite(sp["alpha"]) else 0.0
    c, curve = run.data["draft_cost"][name]["1"], run.data["curve"].get("1")
    pred = costmodel.predict(run.hw, run.p_target, n_params(draft), alpha, run.cm_dtype, 1, g, 1).speedup
    from_costs = costmodel.speedup_with_verify_cost(alpha, g, c, curve[str(g + 1)] / curve["1"]) if curve else None
    run.row(
        "speedup",
        f"{name} real acceptance",
        decode_speedup(ar, sp),
        pred,
        "x",
        batch=1,
        gamma=g,
        alpha=alpha,
        predicted_measured_costs=from_costs,
        al_measured=sp["al"],
        al_expected=metrics.expected_acceptance_length(alpha, g),
        e2e_speedup=ar["e2e_s"] / sp["e2e_s"],
        peak_memory_bytes=sp["peak"],
        cell=cell,
    )
    return [sp["peak"]]


def draft_memory_row(run: Run, name: str, draft: Any, spec_peaks: list[int], ar_peak: int | None) -> None:
    """peak(spec) − peak(AR) (the draft is loaded only for its own cells) beside its weights and
    its KV cache at the cells' length."""
    if not spec_peaks or ar_peak is None:
        return
    length = run.args.prompt_len + run.args.max_new_tokens + max(run.args.gammas)
    predicted = weight_bytes(draft) + kv_bytes(draft.config, run.dtype, 1, length)
    run.row(
        "memory",
        f"draft overhead {name}",
        (max(spec_peaks) - ar_peak) / 1e6,
        predicted / 1e6,
        "MB",
        batch=1,
        weight_bytes=weight_bytes(draft),
        ar_peak_bytes=ar_peak,
        spec_peak_bytes=max(spec_peaks),
    )


def hf_generate_s(
    target: Any, prompts: list[list[int]], max_new: int, device: torch.device, assistant: Any = None, gamma: int = 4
) -> tuple[float, int]:
    """Seconds and new tokens of HF ``generate`` (greedy, no EOS) over ``prompts`` one by one;
    with ``assistant`` its assisted generation at a constant γ (transformers 5 reads the draft
    length from the assistant's generation_config: set there, restored after)."""
    settings = {
        "num_assistant_tokens": gamma,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    saved = {k: getattr(assistant.generation_config, k, None) for k in settings} if assistant is not None else {}
    kwargs = {"assistant_model": assistant} if assistant is not None else {}
    total_s, tokens = 0.0, 0
    try:
        for k, v in settings.items() if assistant is not None else ():
            setattr(assistant.generation_config, k, v)
        for i, p in enumerate([prompts[0]] + list(prompts)):  # the first call is a warm-up
            ids = torch.tensor([p], device=device)
            with torch.inference_mode(), Timer(device) as t:
                out = target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new if i else 8,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                    **kwargs,
                )
            if i:
                total_s, tokens = total_s + t.s, tokens + out.shape[1] - ids.shape[1]
    finally:
        for k, v in saved.items():
            setattr(assistant.generation_config, k, v)
    return total_s, tokens


def hf_rows(run: Run, name: str, target: Any, draft: Any, prompts: list[list[int]]) -> None:
    """HF's AR and ``assistant_model`` on the same prompts: HF's own speedup at the real (≈ 0)
    acceptance of random weights, beside 1 / (γc + T(γ+1)/T(1)) from the measured costs."""
    g = run.args.gammas[len(run.args.gammas) // 2]
    ar_s, ar_n = hf_generate_s(target, prompts, run.args.max_new_tokens, run.device)
    as_s, as_n = hf_generate_s(target, prompts, run.args.max_new_tokens, run.device, draft, g)
    pred = costmodel.predict(run.hw, run.p_target, None, 0.0, run.cm_dtype, 1, 1, 1).baseline_tokens_per_s
    run.row("hf", "hf generate tokens/s", ar_n / ar_s, pred, "tokens/s", batch=1)
    c, curve = run.data["draft_cost"][name]["1"], run.data["curve"].get("1")
    from_costs = costmodel.speedup_with_verify_cost(0.0, g, c, curve[str(g + 1)] / curve["1"]) if curve else None
    run.row(
        "hf",
        f"hf assistant_model {name}",
        (as_n / as_s) / (ar_n / ar_s),
        from_costs,
        "x",
        batch=1,
        gamma=g,
        alpha=0.0,
        tokens_per_s=as_n / as_s,
    )


# --------------------------------------------------------------------------------------------
# calibration: the roofline fitted to every measured forward


def fit_points(run: Run) -> list[costmodel.MeasuredStep]:
    """The target's curve (every batch and k) and every model's one-token steps."""
    pts = [
        costmodel.MeasuredStep(run.p_target, run.cm_dtype, int(b), int(k), s)
        for b, ks in run.data["curve"].items()
        for k, s in ks.items()
    ]
    for name in DRAFTS:
        for b, s in run.data["step_s"].get(name, {}).items():
            pts.append(costmodel.MeasuredStep(run.data["shapes"][name]["params"], run.cm_dtype, int(b), 1, s))
    return pts


def calibrate(run: Run) -> None:
    fit = costmodel.fit_roofline(fit_points(run), run.hw)
    usable = run.device.type == "cuda" and run.args.shapes == "real" and run.hw.device in run.data["device"]["name"]
    why = (
        ""
        if usable
        else (f"measured on {run.data['device']['name']!r} with {run.args.shapes} shapes, not on a {run.hw.device}")
    )
    mb = run.data.get("microbench", {})
    run.data["calibration"] = {
        "profile": run.hw.name,
        "usable": usable,
        "why_not": why,
        "source": "measured",
        "date": run.data["created"][:10],
        "device_name": run.data["device"]["name"],
        "engine": "specstudy reference engine (transformers eager, no CUDA graphs)",
        **{k: fit[k] for k in ("bandwidth_efficiency", "compute_efficiency", "step_overhead_ms")},
        "fit": {
            k: v for k, v in fit.items() if k not in ("bandwidth_efficiency", "compute_efficiency", "step_overhead_ms")
        },
        "hardware": {
            "copy_bandwidth_efficiency": mb["copy_gbps"] / run.hw.memory_bandwidth_gbps if mb else None,
            "matmul_compute_efficiency": mb["matmul_tflops"] / run.hw.peak_tflops(run.cm_dtype) if mb else None,
        },
    }
    for key, unit in (("bandwidth_efficiency", "ratio"), ("compute_efficiency", "ratio"), ("step_overhead_ms", "ms")):
        run.row(
            "calibration",
            f"fit {key}",
            fit[key],
            getattr(run.hw, key),
            unit,
            identified=fit["identified"].get(key.split("_")[0] if key != "step_overhead_ms" else "", None),
        )
    run.row("calibration", "fit max relative error", fit["max_rel_error"], None, "ratio", points=fit["points"])


# --------------------------------------------------------------------------------------------
# the table and the run


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ("section", "name", "batch", "gamma", "alpha", "measured", "predicted", "unit")

    def fmt(v: Any) -> str:
        return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, width)))
    print("  ".join("-" * w for w in width))
    for x in cells:
        print("  ".join(v.ljust(w) for v, w in zip(x, width)))


def describe(run: Run) -> None:
    import transformers

    import specstudy

    cuda = run.device.type == "cuda"
    info = host_info()
    name = torch.cuda.get_device_name(run.device) if cuda else info.get("cpu_model") or platform.machine()
    run.data.update(
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device={
            "name": name,
            "kind": run.device.type,
            "gpus": info.get("gpus", []),
            "driver": info.get("gpu_driver"),
            "host": {k: info.get(k) for k in ("cpu_model", "cpu_cores_logical", "memory_gb", "platform")},
        },
        versions={
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "specstudy": specstudy.__version__,
        },
        args={k: v for k, v in vars(run.args).items() if k != "profile_obj"},
        profile={
            "name": run.hw.name,
            "device": run.hw.device,
            "memory_bandwidth_gbps": run.hw.memory_bandwidth_gbps,
            "peak_tflops": dict(run.hw.peak_tflops_by_dtype),
            "bandwidth_efficiency": run.hw.bandwidth_efficiency,
            "compute_efficiency": run.hw.compute_efficiency,
            "step_overhead_ms": run.hw.step_overhead_ms,
        },
        shapes={},
    )


def build_target(run: Run, vocab: int) -> Any:
    max_pos = max(run.args.prompt_len + run.args.max_new_tokens + 64, 4096 if run.args.shapes == "real" else 512)
    target = build_model(llama_config(run.shapes[TARGET], vocab, max_pos), run.device, run.dtype, run.args.seed)
    run.p_target = n_params(target)
    run.data["shapes"][TARGET] = {
        "config": run.shapes[TARGET],
        "params": run.p_target,
        "weight_bytes": weight_bytes(target),
    }
    return target


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(args)
    torch.set_grad_enabled(False)
    if run.device.type == "cpu":
        torch.set_num_threads(1)  # tiny shapes: threads only contend
    describe(run)
    vocab = 256 if args.shapes == "tiny" else 32000
    prompts = random_prompts(args.prompts, args.prompt_len, vocab, args.seed)
    sampler = TelemetrySampler(period_s=2.0, gpus=run.device.type == "cuda").start()  # the whole run, coarse
    run.section("microbench", lambda: microbench(run))
    run.section("method check (tiny float64, device vs cpu)", lambda: check_methods(run))
    target = run.section(f"build {TARGET}", lambda: build_target(run, vocab))
    if target is not None:
        run.section("verification-cost curve", lambda: measure_curve(run, target, prompts[0]))
        for i, name in enumerate(DRAFTS):
            run.section(f"draft {name}", functools.partial(draft_block, run, name, target, prompts, first=i == 0))
        run.section("calibration fit", lambda: calibrate(run))
    run.data["telemetry_run"] = {k: _json_value(v) for k, v in sampler.stop().summary().items()}
    print_table(run.data["rows"])
    cal = run.data.get("calibration", {})
    print(
        f"\n{run.data['device']['name']} | torch {torch.__version__} | wall {run.elapsed():.1f} s | "
        f"calibration ({'usable' if cal.get('usable') else 'not usable: ' + str(cal.get('why_not'))}): "
        + ", ".join(
            f"{k}={cal[k]:.4g}" for k in ("bandwidth_efficiency", "compute_efficiency", "step_overhead_ms") if k in cal
        )
    )
    for e in run.data["errors"]:
        print(f"ERROR {e['section']}: {e['error']}")
    for s in run.data["skipped"]:
        print(f"skipped {s['section']}: {s['why']}")
    run.write()
    print(f"wrote {args.out}")
    return 1 if run.data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
