"""What several test modules build on: tiny studies on a tiny random Llama (no download).

Used through the fixtures in ``conftest.py``; imported directly only by scripts a test starts in
a subprocess (the kill-and-resume test), which cannot receive fixtures.
"""

from __future__ import annotations

import random
import textwrap
import time
from pathlib import Path

from specstudy.records import Request, Sampling

TINY_STUDY = """
study:
  name: tiny
  models:
    - {name: tiny, target: smollm2-135m, dtype: float64}
  methods:
    - {method: ar}
    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 2}}
    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}
  frameworks: [reference]
  tasks: [code, chat]
  gammas: [2]
  batch_sizes: [1, 2]
  repeats: 1
  warmup: {requests: 1, max_new_tokens: 2}
  max_new_tokens: 6
  prompts_per_task: 2
  telemetry_period_s: 0.05
"""

REPORT_STUDY = """
study:
  name: tiny-report
  models:
    - {name: tiny, target: smollm2-135m, dtype: float64, params: {target: 200000}}
  methods:
    - {method: ar}
    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 2}}
    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}
  frameworks: [reference]
  tasks: [code, chat]
  gammas: [2]
  batch_sizes: [1]
  warmup: {requests: 1, max_new_tokens: 2}
  max_new_tokens: 6
  prompts_per_task: 3
  telemetry_period_s: 0.05
  sweeps:
    hardware: {}
    task_category: {gammas: [2, 3]}
    method_family: {tasks: [code], batch_sizes: [1, 2]}
    short_outputs: {tasks: [code], max_new_tokens: 3}
"""


def write_study(folder: Path, text: str = TINY_STUDY, name: str = "tiny.yaml") -> Path:
    p = folder / name
    p.write_text(textwrap.dedent(text))
    return p


def tiny_requests(task: str, n: int, seed: int, tokenizer) -> list[Request]:
    """Deterministic id prompts with a repeated phrase (something for prompt lookup to copy)."""
    rng = random.Random(f"{task}-{seed}")
    out = []
    for i in range(n):
        phrase = [rng.randrange(3, 90) for _ in range(4)]
        ids = [rng.randrange(3, 90) for _ in range(3)] + phrase + [rng.randrange(3, 90)] + phrase
        out.append(Request(prompt_id=f"{task}/{i}", prompt="", task=task, prompt_ids=tuple(ids)))
    return out


def byte_tokenizer():
    """A real transformers fast tokenizer (one token per byte) with a ChatML-style template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    t = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"]
    )
    t.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return t


class ByteIds:
    """A stand-in tokenizer for the tiny model (96 ids, no chat template): one id per UTF-8 byte, folded
    into the vocabulary, so a study can read real task files and still run on the tiny model."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [3 + b % 90 for b in text.encode()]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + int(i)) for i in ids)

    all_special_ids = [0, 1, 2]  # ids no byte maps to

    def __len__(self) -> int:  # ids 0..92: inside the tiny model's vocabulary
        return 93


class TinyFactory:
    """Builds reference backends around a tiny random model; counts loads; can slow or break cells.

    ``tokenizer`` (e.g. :class:`ByteIds`) is the backend's, for requests read from task files.
    ``hold`` = (file, k): the k-th measured call (the k-th cell) touches ``file`` after its first record
    and then never returns, so a test that signals the study waits on that file, not on the clock.
    """

    def __init__(self, delay_s: float = 0.0, fail_method: str | None = None, tokenizer=None, hold=None, plant=None):
        self.loads: list[tuple] = []
        self.runs: list[tuple[str, int, int, bool]] = []  # (method, batch size, max_new_tokens, warm-up?) per call
        self.sizes: list[int] = []  # requests per call
        self.delay_s, self.fail_method, self.tokenizer = delay_s, fail_method, tokenizer
        self.hold = hold
        #: plant(cell, record, measured_calls_so_far) may alter a measured record (a planted stall)
        self.plant = plant

    def __call__(self, framework: str, model: str, drafter=None, device: str = "cpu", dtype: str = "float64", **kw):
        import torch

        from specstudy.backends.reference.reference_backend import ReferenceBackend
        from specstudy.data.model_files import tiny_model

        torch.set_num_threads(1)
        self.loads.append((framework, model, drafter))
        backend = ReferenceBackend(
            tiny_model(seed=0, logit_scale=4.0, num_layers=2), device="cpu", dtype="float64", tokenizer=self.tokenizer
        )
        run, factory = backend.run, self

        def slow_run(requests, sampling, cell):
            warm = all(r.prompt_id.startswith("warmup") for r in requests)
            factory.runs.append((cell.method, cell.batch_size, sampling.max_new_tokens, warm))
            factory.sizes.append(len(requests))
            if factory.fail_method and cell.method == factory.fail_method:
                raise RuntimeError(f"injected failure for {cell.method}")
            measured = sum(not w for *_, w in factory.runs)
            for rec in run(requests, sampling, cell):
                time.sleep(factory.delay_s)
                if factory.plant and not warm:
                    factory.plant(cell, rec, measured)
                yield rec
                if factory.hold and not warm and measured == factory.hold[1]:
                    Path(factory.hold[0]).touch()  # mid-cell now: the test may signal
                    while True:
                        time.sleep(0.05)

        backend.run = slow_run
        return backend


def run_tiny_study(cfg, plans, out: Path, factory, **kw):
    """A study through :func:`specstudy.run.study_runner.run_study` on tiny prompts, quietly."""
    from specstudy.layout import StudyLayout
    from specstudy.run.study_runner import run_study

    return run_study(
        cfg,
        plans,
        StudyLayout(Path(out)),
        factory=factory,
        request_loader=tiny_requests,
        progress=False,
        log=lambda m: None,
        **kw,
    )


def write_task(folder: Path, rows, fields: dict, name: str = "task", **top) -> Path:
    """A task file ``<name>.yaml`` with one file source over ``rows`` (``<name>.jsonl`` beside it, pinned);
    ``top`` adds or overrides top-level keys (plain text prompts unless ``chat_template`` says otherwise)."""
    import json

    import yaml

    from specstudy.data.fetch import sha256_file

    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    src = {"name": name, "kind": "file", "path": str(data), "sha256": sha256_file(data)}
    cfg = {"category": name, "chat_template": False, **top}
    cfg["sources"] = [{**src, "licence": "CC0 (written for the test)", "fields": fields}]
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return p


def write_study_file(folder: Path, tasks, frameworks=("reference",), dtype: str = "float64", **study) -> Path:
    """A study of AR and prompt lookup on SmolLM2 (the tiny model under TinyFactory) over ``tasks``;
    ``study`` adds or overrides keys of its ``study:`` section."""
    import yaml

    body = {
        "name": "study",
        "models": [{"name": "smollm2", "target": "smollm2-135m", "dtype": dtype}],
        "methods": [{"method": "ar"}, {"method": "ngram", "label": "Prompt lookup"}],
        "frameworks": list(frameworks),
        "framework_options": {"llamacpp": {"threads": 2}},
        "tasks": [str(t) for t in tasks],
        "gammas": [2],
        "batch_sizes": [1],
        "warmup": {"requests": 1, "max_new_tokens": 2},
        "max_new_tokens": 8,
        "prompts_per_task": 5,
        "telemetry_period_s": 0.05,
        **study,
    }
    p = folder / "study.yaml"
    p.write_text(yaml.safe_dump({"study": body}, sort_keys=False))
    return p


#: write_study_file's settings for a kit-started llama.cpp server on the embedded SmolLM2 GGUF
LLAMACPP = {"frameworks": ["llamacpp"], "dtype": "float32", "telemetry_period_s": 0.5}


def run_study_file(path: Path, factory=None, check: bool = False):
    """The study file's cells through :func:`run_study` into ``outputs/cpu`` beside it, quietly:
    (results, records read back, the output folder); ``check`` runs the backends' checks first."""
    from specstudy.config import load_study
    from specstudy.layout import StudyLayout
    from specstudy.run.plan import check_backends, expand
    from specstudy.run.study_runner import run_study

    cfg = load_study("cpu", path)
    if check:
        cfg = check_backends(cfg, files=False)
    out = path.parent / "outputs" / "cpu"
    res = run_study(cfg, expand(cfg), StudyLayout(out), factory=factory, progress=False, log=lambda m: None)
    return res, StudyLayout(out).read_all(), out


def code_prompt_record(cell, i: int, *, end_s: float, temperature: float = 0.0, **fields):
    """Prompt ``code/i``'s record of ``cell``: 32 greedy tokens (or at ``temperature``), the first after
    50 ms, ``end_s`` in all, started 100 s after the previous prompt; ``fields`` the rest."""
    return cell.new_record(
        Request(f"code/{i}", ""),
        Sampling(max_new_tokens=32, temperature=temperature),
        output_tokens=32,
        first_token_s=0.05,
        end_s=end_s,
        start_epoch=1000.0 + 100 * i,
        output_ids=list(range(32)),
        **fields,
    )
