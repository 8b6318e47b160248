"""A rehearsal: a GPU profile's matrix run on this CPU with random-weight stand-ins, before renting.

Each hub model of the profile is replaced, under its own id in a private Hugging Face cache
(``outputs/<gpu>-rehearsal/standins/hub``), by a model built from its own config (the same
architecture, vocabulary, context and rope; fewer layers, at most 8 heads: :func:`scaled_config`),
each EAGLE-3 head and Medusa head by random heads in their checkpoint formats shaped for its stand-in target.  The
profile's study becomes a small one (:func:`rehearsal_study`): the same models, methods, frameworks,
framework options, batch and rate regimes and prefix-cache settings, on 2 prompts of one task and
a few tokens; every change is listed in ``REHEARSAL.json``.  Engines with a CPU build run for real
(reference, HF, vLLM offline and server); the others (SGLang, TensorRT-LLM, MLC) are listed as not
rehearsed.  Its outputs are marked REHEARSAL on every page and table: random weights, no number in
them means anything, and they never mix with measurements (their own folder).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.drafter_configs import layer_view
from ..config.files import hardware_file, load_yaml
from ..config.model_configs import CONFIGS_ENV, read_config
from ..data.standin_drafters import dflash_standin, mtp_target_standin
from ..data.standins import GENERIC_CHAT_TEMPLATE, RECIPE, place_in_hub_cache, scaled_config, write_standin
from ..frameworks import DECLARATIONS
from ..layout import REHEARSAL_MARKER

if TYPE_CHECKING:
    from .plan import CellPlan

#: the marker file of a rehearsal's outputs folder (the report reads it and marks every page)
MARKER = REHEARSAL_MARKER
#: what a rehearsal keeps of each axis (batch sizes stay the profile's: 2 prompts fill any batch slot count)
PROMPTS, NEW_TOKENS = 2, 4
#: vLLM's CPU build as its declaration starts it (a fixed KV cache), its threads on this 2-core machine's cores
VLLM_CPU_ENV = {
    **next(e.run_env for e in DECLARATIONS["vllm"].environments if e.build == "cpu"),
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}


def rehearsal_name(gpu: str) -> str:
    return f"{gpu}-rehearsal"


def cpu_build(framework: str) -> bool:
    """Whether the framework's engine runs on this CPU (a kit-managed CPU build, or the kit's own)."""
    d = DECLARATIONS[framework]
    if d.binary is not None:
        return not d.binary.cuda_only and d.reads_checkpoints
    return not d.environments or any(e.build == "cpu" for e in d.environments)


def hub_ids(study: dict[str, Any]) -> list[str]:
    """Every hub id (owner/name) the study's models name, targets and drafters (merged trees split)."""
    ids: set[str] = set()
    for m in study.get("models", []):
        for name in [m["target"], *(m.get("drafters") or {}).values()]:
            ids.update(p for p in str(name).split("+") if p.count("/") == 1 and not p.startswith((".", "/")))
    return sorted(ids)


def heads_of(study: dict[str, Any], method: str = "eagle3") -> dict[str, str]:
    """Head id -> its target's id (the rows that use each head as ``method``: eagle3 or medusa)."""
    methods = {m.get("drafter"): (m.get("method") or m.get("family")) for m in study.get("methods", [])}
    return {
        d: m["target"]
        for m in study.get("models", [])
        for short, d in (m.get("drafters") or {}).items()
        if methods.get(short) == method
    }


def standin_targets(study: dict[str, Any]) -> list[str]:
    """The hub models built from their own config (heads are built for their targets instead)."""
    heads = {**heads_of(study), **heads_of(study, "medusa"), **heads_of(study, "dflash")}
    return [r for r in hub_ids(study) if r not in heads]


def build_standins(study: dict[str, Any], cache: Path, read: Callable[[str], Any] = read_config) -> dict[str, Any]:
    """Stand-ins for every hub model (and EAGLE-3 head) into ``cache``; what was scaled, per model."""
    heads, medusa, work = heads_of(study), heads_of(study, "medusa"), cache.parent / "build"
    notes: dict[str, Any] = {}
    for repo in standin_targets(study):
        real = read(repo)
        if real is None or "vocab_size" not in real:
            notes[repo] = "no stand-in: no config with a vocabulary here"
            continue
        cfg, scaled = scaled_config(real)
        template, said = _chat_template(repo, read)
        build = mtp_target_standin if real.get("model_type") == "mimo" else write_standin
        place_in_hub_cache(build(cfg, work / repo.replace("/", "--"), chat_template=template), repo, cache)
        notes[repo] = [*scaled, said]
    for head, target in heads.items():
        notes[head] = _eagle3_standin(head, target, cache, read, work)
    for head, target in heads_of(study, "dflash").items():
        snap = cache / f"models--{target.replace('/', '--')}" / "snapshots"
        tcfg = json.loads((next(snap.iterdir()) / "config.json").read_text())
        folder, built = dflash_standin(read(head) or {}, tcfg, work / head.replace("/", "--"))
        place_in_hub_cache(folder, head, cache)
        notes[head] = built
    for head, target in medusa.items():
        notes[head] = _medusa_standin(head, target, cache, read, work)
    return notes


def _medusa_standin(head: str, target: str, cache: Path, read: Callable[[str], Any], work: Path) -> Any:
    """Random Medusa-1 heads in FasterDecoding's checkpoint format (its config keys; ``medusa_lm_head.pt``
    and the same tensors as ``model.safetensors``: ``{head}.{layer}.linear.weight|bias`` residual
    blocks, ``{head}.{layers}.weight`` the head's LM head, the names vLLM's Medusa loader remaps), as
    many heads and layers as the real ones, shaped for the stand-in target (its hidden size and vocabulary;
    ``hidden_size`` and ``vocab_size`` written too, which vLLM's MedusaConfig reads)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    real = read(head) or {}
    heads, layers = int(real.get("medusa_num_heads", 4)), int(real.get("medusa_num_layers", 1))
    snap = cache / f"models--{target.replace('/', '--')}" / "snapshots"
    tcfg = AutoConfig.from_pretrained(str(next(snap.iterdir())))
    hidden, vocab = int(tcfg.hidden_size), int(tcfg.vocab_size)
    torch.manual_seed(0)
    weights: dict[str, Any] = {}
    for h in range(heads):
        for i in range(layers):
            weights[f"{h}.{i}.linear.weight"] = torch.randn(hidden, hidden) * 0.02
            weights[f"{h}.{i}.linear.bias"] = torch.zeros(hidden)
        weights[f"{h}.{layers}.weight"] = torch.randn(vocab, hidden) * 0.02
    folder = work / head.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(weights, folder / "medusa_lm_head.pt")
    save_file(weights, str(folder / "model.safetensors"))
    cfg = {**real, "medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": target}
    cfg.update(hidden_size=hidden, vocab_size=vocab, medusa_fc_bias=True, rehearsal="random weights")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    place_in_hub_cache(folder, head, cache)
    return [
        f"random Medusa heads for the stand-in of {target}: {heads} heads x {layers} layers, hidden {hidden}, vocabulary {vocab}"
    ]


def _chat_template(repo: str, read: Callable[..., Any]) -> tuple[str | None, str]:
    """The real tokenizer's chat template (or none) when its tokenizer_config.json is here, else a generic one."""
    try:
        tok = read(repo, "tokenizer_config.json")
    except TypeError:  # a reader of config.json only
        tok = None
    if tok is None:
        return GENERIC_CHAT_TEMPLATE, "chat template: a generic one (its tokenizer_config.json is not here)"
    template = tok.get("chat_template")
    return template, "chat template: its own" if template else "chat template: none (as its tokenizer_config.json)"


def _eagle3_standin(head: str, target: str, cache: Path, read: Callable[[str], Any], work: Path) -> Any:
    """A random EAGLE-3 head in its checkpoint format (config.json + model.safetensors, vLLM's and
    SGLang's names) for the stand-in target, its context and draft vocabulary from the real head."""
    import torch
    from transformers import AutoConfig

    from ..engine.eagle3_drafter import Eagle3Draft, save_eagle3

    real = layer_view(read(head) or {})  # a speculators-layout head's layer keys read like a plain config
    snap = cache / f"models--{target.replace('/', '--')}" / "snapshots"
    tcfg = AutoConfig.from_pretrained(str(next(snap.iterdir())))
    draft_vocab = int(real.get("draft_vocab_size") or tcfg.vocab_size)
    torch.manual_seed(0)
    module = Eagle3Draft.for_target(tcfg, torch.arange(min(draft_vocab, tcfg.vocab_size)))
    folder = save_eagle3(module, work / head.replace("/", "--"), {"rehearsal": "random weights"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = int(real.get("max_position_embeddings") or cfg["max_position_embeddings"])
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    place_in_hub_cache(folder, head, cache)
    return [
        f"random EAGLE-3 head for the stand-in of {target}: hidden {tcfg.hidden_size}, draft vocabulary {draft_vocab}, "
        f"context {cfg['max_position_embeddings']}"
    ]


def rehearsal_study(
    study: dict[str, Any], base: Path | None = None
) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """The profile's study made small for this CPU: (study, what changed, rows not rehearsed).
    ``base``: the profile's folder, which its relative task paths are relative to (made absolute)."""
    s = json.loads(json.dumps(study))  # a deep copy of plain YAML data
    if base is not None:
        _absolute_tasks(s, base)
    named = {*s.get("frameworks", []), *s.get("framework_options", {})}
    named |= {f for m in s.get("methods", []) for f in m.get("frameworks") or []}
    named |= {f for sw in (s.get("sweeps") or {}).values() for f in (sw or {}).get("frameworks") or []}
    runnable = {f for f in named if f in DECLARATIONS and cpu_build(f)}
    changes = [f"not run (no CPU build): {sorted(named - runnable)}; run: {sorted(runnable)}"]
    skipped = _not_rehearsed(s, named - runnable)
    s["methods"] = _methods(s.get("methods", []), runnable)
    labels = {m["label"] for m in s["methods"]}
    sweeps = {k: _sweep(sw or {}, runnable, labels, s) for k, sw in (s.get("sweeps") or {}).items()}
    s["sweeps"] = {k: sw for k, sw in sweeps.items() if sw}
    _axes(s, runnable)
    changes += _models(s) + _options(s, runnable)
    changes.append(
        f"every sweep: its first task, {PROMPTS} prompts, {NEW_TOKENS} new tokens, 1 repeat; its batch sizes "
        f"are the profile's (a batch of {PROMPTS} requests in an engine sized for the batch)"
    )
    changes.append(f"cells: one per distinct configuration ({', '.join(KEY_FIELDS)}), its largest gamma")
    return s, changes, skipped


#: the axes of a distinct configuration, in the order :func:`configuration_key` returns them
KEY_FIELDS = (
    "framework",
    "method row",
    "target",
    "drafter",
    "method options",
    "batch size",
    "rate regime",
    "prefix cache",
    "sampling",
    "arrivals",
    "multi-turn",
)


def rate_regime(rate: float | None) -> str:
    """A request rate's regime: a closed batch (no rate), every request at once (inf), or Poisson
    arrivals (any finite rate: the client's code path is the same whatever the rate)."""
    if rate is None:
        return "closed batch"
    return "all at once" if math.isinf(rate) else "poisson"


def configuration_key(p: CellPlan) -> tuple[Any, ...]:
    """What makes a cell a distinct configuration for a rehearsal: the engine, the method row and its
    models and options (what the engine is started with), the batch size and rate regime (what the
    client does), prefix caching, greedy or random sampling, the arrivals and multi-turn.  Left out on
    purpose: the task, the repeat, the exact rate and gamma (values along an axis the same code path
    takes; :func:`pick` runs the largest gamma, the longest speculative span)."""
    return (
        p.cell.framework,
        p.label,
        p.target,
        p.drafter_id,
        p.method_options,
        p.cell.batch_size,
        rate_regime(p.request_rate),
        p.prefix_cache,
        "greedy" if p.sampling.temperature == 0 else "random",
        p.arrivals,
        p.turns > 1,
    )


def pick(plans: list[CellPlan]) -> list[CellPlan]:
    """One cell per distinct configuration (:func:`configuration_key`), in plan order: each speculative
    configuration's cell with the largest gamma and the AR baseline it pairs with, then an AR cell for
    each AR configuration no baseline covered yet."""
    best: dict[tuple[Any, ...], CellPlan] = {}
    for p in plans:
        key = configuration_key(p)
        if key not in best or (p.cell.gamma or 0) > (best[key].cell.gamma or 0):
            best[key] = p
    speculative = [p for p in best.values() if p.baseline_cell_id]
    ids = {p.cell.cell_id for p in speculative} | {p.baseline_cell_id for p in speculative}
    covered = {configuration_key(p) for p in plans if p.cell.cell_id in ids}
    ids |= {p.cell.cell_id for key, p in best.items() if key not in covered}
    return [p for p in plans if p.cell.cell_id in ids]


def uncovered(profile: list[CellPlan], rehearsed: list[CellPlan]) -> list[tuple[Any, ...]]:
    """The distinct configurations of a profile's CPU-build cells that no rehearsed cell has."""
    have = {configuration_key(p) for p in rehearsed}
    return sorted(
        {k for p in profile if cpu_build(p.cell.framework) and (k := configuration_key(p)) not in have}, key=repr
    )


def _absolute_tasks(s: dict[str, Any], base: Path) -> None:
    """Task file paths relative to the profile's folder, made absolute (the rehearsal's file lives elsewhere)."""
    from ..config.task import is_task_path

    for holder in [s, *((sw or {}) for sw in (s.get("sweeps") or {}).values())]:
        if holder.get("tasks"):
            holder["tasks"] = [
                str((base / t).resolve()) if is_task_path(t) and not Path(t).is_absolute() else t
                for t in holder["tasks"]
            ]


def _methods(methods: list[dict[str, Any]], runnable: set[str]) -> list[dict[str, Any]]:
    out = []
    for m in methods:
        fws = m.get("frameworks")
        if fws is not None:
            m = {**m, "frameworks": [f for f in fws if f in runnable]}
            if not m["frameworks"]:
                continue
        out.append(m)
    return out


def _sweep(sw: dict[str, Any], runnable: set[str], labels: set[str], s: dict[str, Any]) -> dict[str, Any] | None:
    sw = dict(sw)
    if "frameworks" in sw:
        sw["frameworks"] = [f for f in sw["frameworks"] if f in runnable]
        if not sw["frameworks"]:
            return None
    fws = set(sw.get("frameworks") or s.get("frameworks") or [])
    if isinstance(sw.get("methods"), list):
        rows = {m["label"]: m for m in s["methods"]}
        sw["methods"] = [
            lb
            for lb in sw["methods"]
            if lb in labels and (rows[lb].get("frameworks") is None or fws & set(rows[lb]["frameworks"]))
        ]
        if not any(rows[lb].get("method", rows[lb].get("family")) != "ar" for lb in sw["methods"]):
            return None
    _shrink(sw)
    return sw


def _shrink(sw: dict[str, Any]) -> None:
    """One task, few prompts and tokens, one repeat (every gamma and batch size stays: :func:`pick`
    chooses the cells)."""
    if sw.get("tasks"):
        sw["tasks"] = sw["tasks"][:1]
    for key, value in (("repeats", 1), ("prompts_per_task", PROMPTS), ("max_new_tokens", NEW_TOKENS)):
        if key in sw:
            sw[key] = value
    sw.pop("precision", None)


def _axes(s: dict[str, Any], runnable: set[str]) -> None:
    s["frameworks"] = [f for f in s.get("frameworks", ["reference"]) if f in runnable] or sorted(runnable)[:1]
    _shrink(s)
    s.update(device="cpu", repeats=1, prompts_per_task=PROMPTS, max_new_tokens=NEW_TOKENS)
    s["warmup"] = {"requests": 1, "max_new_tokens": 2}
    s["name"] = f"{s.get('name', 'study')}-REHEARSAL"


def _models(s: dict[str, Any]) -> list[str]:
    """Tensor parallelism at 1, float32, no weight quantization (CPU kernels): each change named."""
    out = []
    for m in s.get("models", []):
        for key, value in (("tensor_parallel_size", 1), ("dtype", "float32"), ("quantization", "none")):
            if m.get(key, value) != value:
                out.append(f"{m.get('name', m['target'])}: {key} {m[key]} -> {value}")
                m[key] = value
    return out


def _options(s: dict[str, Any], runnable: set[str]) -> list[str]:
    """The profile's framework options for the engines that run; vLLM's CPU settings added."""
    opts, out = s.get("framework_options") or {}, []
    for fw in list(opts):
        if fw not in runnable:
            del opts[fw]
    for fw in (f for f in runnable if DECLARATIONS[f].environment == "vllm"):
        o = opts.setdefault(fw, {})
        if o.pop("gpu_memory_utilization", None) is not None:
            out.append(
                f"{fw}: gpu_memory_utilization dropped (the CPU build's KV cache is VLLM_CPU_KVCACHE_SPACE=1 GiB)"
            )
        env = {**VLLM_CPU_ENV, **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if not DECLARATIONS[fw].server else {})}
        o.update(enforce_eager=True, env={**env, **(o.get("env") or {})})
    s["framework_options"] = opts
    return out


def _not_rehearsed(s: dict[str, Any], frameworks: set[str]) -> list[dict[str, Any]]:
    """The rows of engines with no CPU build (each speculative row and the AR baseline it pairs with):
    listed, never counted as passed."""
    rows, seen = [], set()
    for m in s.get("methods", []):
        for fw in sorted(set(m.get("frameworks") or []) & frameworks):
            for label, method in (("Baseline (AR)", "ar"), (m["label"], m.get("method") or m.get("family"))):
                if (fw, label) not in seen:
                    seen.add((fw, label))
                    rows.append(
                        {"framework": fw, "label": label, "method": method, "status": "not rehearsed: no CPU build"}
                    )
    return rows


def _validate_argvs(gpu: str, skipped: list[dict[str, Any]]) -> None:
    """The rows of GPU-only engines checked by the engine's own parser where it imports here
    (:mod:`specstudy.run.engine_argv`), on the profile's own plan (its real models and options)."""
    from ..config import load_study
    from .engine_argv import validate_rows
    from .plan import expand

    cfg = load_study(gpu, check_tokenizers=False)
    validate_rows(skipped, cfg, expand(cfg))


#: what the stand-ins are built by (:data:`specstudy.data.standins.RECIPE`): a cache built by another
#: recipe is rebuilt
STANDIN_RECIPE = json.dumps(RECIPE, sort_keys=True)


def without_unconfigured_drafters(
    study: dict[str, Any], read: Callable[[str], Any] = read_config
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The study without the drafters whose config is not here (a stand-in is never guessed) and the
    method rows only they served; those rows listed as not rehearsed, with why."""
    s = json.loads(json.dumps(study))
    gone: dict[str, str] = {}
    for m in s.get("models", []):
        for short, repo in list((m.get("drafters") or {}).items()):
            if repo.count("/") == 1 and "+" not in repo and layer_view(read(repo) or {}).get("vocab_size") is None:
                gone[short] = repo
                del m["drafters"][short]
                for counts in (m.get("params") or {}, m.get("vocab_size") or {}):
                    counts.pop(short, None)
    left = {short for m in s.get("models", []) for short in (m.get("drafters") or {})}
    dropped = [m for m in s.get("methods", []) if m.get("drafter") in gone and m["drafter"] not in left]
    labels = {m["label"] for m in dropped}
    s["methods"] = [m for m in s.get("methods", []) if m["label"] not in labels]
    for sw in (s.get("sweeps") or {}).values():
        if sw and isinstance(sw.get("methods"), list):
            sw["methods"] = [lb for lb in sw["methods"] if lb not in labels]
    skipped = [
        {
            "framework": fw,
            "label": m["label"],
            "method": m.get("method") or m.get("family"),
            "status": f"not rehearsed: drafter {gone[m['drafter']]} has no config.json here (a stand-in is never guessed)",
        }
        for m in dropped
        for fw in m.get("frameworks") or s.get("frameworks") or []
    ]
    return s, skipped


#: why a suffix row cannot run without Arctic Inference's suffix tree importable by vLLM's Python
SUFFIX_WHY = (
    "not rehearsed: vLLM's suffix decoding needs Arctic Inference's suffix tree (arctic_inference.suffix_decoding), "
    "not importable by the vLLM environment here (make arctic-inference builds and installs it)"
)


def suffix_tree_here() -> bool:
    """Whether vLLM's CPU Python (with this process's PYTHONPATH) imports Arctic Inference's suffix tree."""
    import subprocess

    from ..environments.install import ENVIRONMENTS, python_of

    py = python_of(next(e for e in ENVIRONMENTS.values() if e.engine == "vllm" and e.build == "cpu"))
    probe = [str(py), "-c", "import arctic_inference.suffix_decoding"]
    return py.exists() and subprocess.run(probe, capture_output=True).returncode == 0


def without_rows(study: dict[str, Any], method: str, why: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The rehearsal's study without the rows of ``method`` (and the sweeps' mentions of them), listed with why."""
    s = json.loads(json.dumps(study))
    gone = [m for m in s.get("methods", []) if (m.get("method") or m.get("family")) == method]
    labels = {m["label"] for m in gone}
    s["methods"] = [m for m in s.get("methods", []) if m["label"] not in labels]
    for sw in (s.get("sweeps") or {}).values():
        if sw and isinstance(sw.get("methods"), list):
            sw["methods"] = [lb for lb in sw["methods"] if lb not in labels]
    fws = s.get("frameworks") or []
    rows = [
        {"framework": f, "label": m["label"], "method": method, "status": why}
        for m in gone
        for f in m.get("frameworks") or fws
    ]
    return s, rows


def missing_configs(study: dict[str, Any], read: Callable[[str], Any] = read_config) -> None:
    """Refuse, before anything is built, a rehearsal whose models' configs are not here: every missing
    one named at once, with the two ways to get them (a stand-in is built from its model's own config,
    never guessed, and a head's from its target's)."""
    from ..config.errors import ParamsError, ParamsProblems

    problems = [
        ParamsError(
            None,
            f"models: {repo}",
            "config.json not here",
            "a config in the HF cache or in $" + CONFIGS_ENV + "/<owner>--<name>/",
            "where the hub is reachable: specstudy models configs --hardware <gpu>; offline, the kit's configs "
            "written from the published values: make rehearse GPU=<gpu> MODEL_CONFIGS=tests/fixtures/model_configs",
        )
        for repo in standin_targets(study)
        if (read(repo) or {}).get("vocab_size") is None
    ]
    if problems:
        raise ParamsProblems(problems, "rehearsal stand-ins (each model's own config)")


def _stale_standins(study: dict[str, Any], built: Path, recipe: Path) -> str | None:
    """Why the stand-ins in ``built``'s folder cannot serve ``study`` (another recipe, or other models: a
    drafter whose config has arrived since), or None."""
    if not recipe.exists() or recipe.read_text() != STANDIN_RECIPE:
        return "by another stand-in recipe"
    have = set(json.loads(built.read_text()))
    return (
        None
        if have == set(hub_ids(study))
        else f"for other models than the profile's ({sorted(have ^ set(hub_ids(study)))})"
    )


def prepare(gpu: str, outputs: str = "outputs", log: Callable[[str], None] = print) -> Path:
    """Stand-ins, the small study file and the marker in ``<outputs>/<gpu>-rehearsal/``; the hub cache
    pointed at the stand-ins (this process and every engine it starts).  Returns the study file."""
    out = Path(outputs) / rehearsal_name(gpu)
    cache = out / "standins" / "hub"
    study, unconfigured = without_unconfigured_drafters(load_yaml(hardware_file(gpu))["study"])
    built, recipe = out / "standins" / "built.json", out / "standins" / "recipe.txt"
    if built.exists() and (stale := _stale_standins(study, built, recipe)):
        import shutil  # stand-ins of an older recipe (6 layers), and the cells run on them, are never reused

        log(f"rehearsal: {out} was built {stale}; starting it again (nothing in it is measured)")
        shutil.rmtree(out)
    if not built.exists():
        missing_configs(study)
        log(f"rehearsal: building stand-ins of {len(hub_ids(study))} models into {cache}")
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_text(json.dumps(build_standins(study, cache), indent=2))
        recipe.write_text(STANDIN_RECIPE)
    small, changes, skipped = rehearsal_study(study, hardware_file(gpu).parent)
    _validate_argvs(gpu, skipped)
    small, no_suffix = without_rows(small, "suffix", SUFFIX_WHY) if not suffix_tree_here() else (small, [])
    skipped += unconfigured + no_suffix
    path = out / "rehearsal.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"study": small}, sort_keys=False))
    marker = {"profile": gpu, "standins": json.loads(built.read_text()), "changes": changes, "not_rehearsed": skipped}
    (out / MARKER).write_text(json.dumps(marker, indent=2))
    os.environ.update(HF_HUB_CACHE=str(cache.resolve()), HF_HUB_OFFLINE="1")
    from huggingface_hub import constants

    constants.HF_HUB_CACHE = str(cache.resolve())
    return path
