"""specstudy models configs --hardware GPU: each hub model's config.json and tokenizer config (a few KB,
no weights) fetched into the Hugging Face cache, then the study checked against them; offline, only the
cache is read.  So a profile's context, tensor-parallel, draft and memory problems show before renting."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..config import ParamsProblems, load_hardware_profile, load_study
from ..config.model_configs import config_problems, fetch_configs, uses_of


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("configs",), help="configs: fetch (online) and check each model's config")
    p.add_argument("--hardware", default="cpu", help="the profile in params/hardware/ (a100, h100, h200, rtx4090)")
    p.add_argument("--params", default=None, help="a study file instead of params/hardware/<hardware>.yaml")


def hub_models(cfg: object) -> list[str]:
    """The hub ids (owner/name) the study's rows load, targets and drafters (each model of a merged tree)."""
    ids = set()
    for use in uses_of(cfg):
        for m in [use.target, *(use.drafter.split("+") if use.drafter else [])]:
            if m.count("/") == 1 and not m.startswith((".", "/")) and not os.path.exists(m):
                ids.add(m)
    return sorted(ids)


def run(args: argparse.Namespace) -> int:
    cfg = load_study(args.hardware, args.params, check_tokenizers=False)
    models = hub_models(cfg)
    failed = [] if os.environ.get("HF_HUB_OFFLINE") == "1" else fetch_configs(models, log=lambda m: None)
    memory = load_hardware_profile(cfg.hardware, measure=False).memory_gb if args.params is None else None
    problems, unchecked = config_problems(cfg, memory)
    out = {"models": models, "not_fetched": failed, "not_checked": unchecked, "problems": [str(p) for p in problems]}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{len(models)} hub models; {len(models) - len(unchecked)} configs here; {len(problems)} problems")
        for line in [*(f"not checked (no config here): {m}" for m in unchecked), *failed]:
            print(f"  {line}", file=sys.stderr)
    if problems:
        raise ParamsProblems(problems, "models' own configs")
    return 0
