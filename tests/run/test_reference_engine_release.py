"""a closed reference engine leaves nothing holding its model, and hands CUDA's cached blocks back
(the vLLM servers that start after it need that GPU memory)."""

import gc
import weakref

import torch

from specstudy.backends.reference.reference_backend import ReferenceBackend
from specstudy.data.model_files import tiny_model
from specstudy.engine import lean
from specstudy.records import Cell, Request, Sampling


def _lean_model():
    model = tiny_model(seed=1, dtype="float32").eval()
    assert lean.lean_supported(model) is None  # the model the lean forward (and its cache) takes
    return model


def test_lean_cache_does_not_keep_its_model_alive():
    model = _lean_model()
    assert lean.prepare(model, pack=False) is False
    assert model in lean._LEAN
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None, "the lean forward's cache holds the model (its WeakKeyDictionary value refers to its key)"


def test_closed_reference_engine_frees_its_model_and_empties_the_cuda_cache(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    be = ReferenceBackend(_lean_model(), tokenizer=None)
    be._owns_model = True  # as when it loads the model from its name: close() checks it let go
    cell = Cell("s", "h200", "reference", "ar", "code", "tiny")
    list(be.run([Request(prompt_id="p", prompt="", prompt_ids=(1, 2, 3))], Sampling(max_new_tokens=2), cell))
    ref = weakref.ref(be.model)
    be.device = "cuda:0"  # what close() does on a GPU, without one
    be.close()
    gc.collect()
    assert ref() is None and emptied == [True]


def test_a_model_still_held_after_close_is_reported_naming_the_engine(monkeypatch):
    """N6 planted: LeanLlama keeping its model again (the WeakKeyDictionary value holding its key)."""
    import pytest

    init = lean.LeanLlama.__init__

    def holding(self, model, pack=False):
        init(self, model, pack)
        self.model = model  # the reverted fix

    monkeypatch.setattr(lean.LeanLlama, "__init__", holding)
    be = ReferenceBackend(_lean_model(), tokenizer=None)
    be._owns_model, be.model_name = True, "meta-llama/Llama-2-7b-chat-hf"
    with pytest.raises(
        MemoryError, match="reference engine of meta-llama/Llama-2-7b-chat-hf: its model is still referenced"
    ):
        be.close()
