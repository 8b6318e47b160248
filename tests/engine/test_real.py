"""The engine on the embedded SmolLM2-135M (slow: loads the real model)."""

import pytest
import torch

from specstudy import metrics
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.records import Sampling

pytestmark = pytest.mark.slow

PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Summarize: The city council met on Tuesday to discuss the new park. The park will open in May.",
]


@pytest.fixture(scope="module")
def smol():
    from specstudy.data.model_files import load_model

    torch.set_num_threads(1)
    model, tok = load_model("smollm2-135m")
    return model, tok


def test_every_method_is_lossless_on_the_default_model(smol):
    model, tok = smol
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    s = Sampling(temperature=0.0, max_new_tokens=20)
    want = [r.output_ids for r in get_method("ar").decode(DecodeJob(model, ids, s))]
    single = [get_method("ar").decode(DecodeJob(model, [i], s))[0].output_ids for i in ids]
    assert single == want
    for name, kw in [
        ("ngram", dict(gamma=4)),
        ("layer_skip", dict(gamma=3, options={"exit_layer": 20})),
        ("draft_target", dict(gamma=3, drafter=model)),
    ]:
        rows = get_method(name).decode(DecodeJob(model, ids, s, **kw))
        assert [r.output_ids for r in rows] == want, name
        assert all(sum(st.emitted for st in r.steps) == 20 for r in rows)
        if name == "draft_target":  # the target drafting for itself is always accepted
            assert all(st.accepted == st.drafted for r in rows for st in r.steps)


def test_reference_backend_with_chat_template(smol):
    from specstudy.backends.reference.reference_backend import ReferenceBackend
    from specstudy.records import Cell, Request

    model, tok = smol
    b = ReferenceBackend(model, tokenizer=tok)
    cell = Cell(
        study="t",
        hardware="cpu",
        framework="reference",
        method="ngram",
        task="code",
        model="smollm2-135m",
        gamma=3,
        options=(("chat", True),),
    )
    rec = next(
        iter(b.run([Request("p", "Write a Python function that adds two numbers.")], Sampling(max_new_tokens=16), cell))
    )
    assert rec.status == "ok" and rec.output_tokens == 16 and rec.output_text
    assert rec.input_tokens > 20  # the template's system turn is there
    assert metrics.mean_entropy([rec]) >= 0
