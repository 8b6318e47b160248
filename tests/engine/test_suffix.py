"""Suffix decoding through Arctic Inference's suffix cache: lossless under greedy, drafts from the
context, options checked, and a clear refusal where the optional package is absent."""

import pytest
import torch

from specstudy.data.model_files import tiny_model
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.methods import suffix as suffix_method
from specstudy.records import Sampling

torch.set_num_threads(1)

#: repetitive prompts: the continuation copies the context, which the suffix tree drafts from
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], [5, 6, 7, 5, 6, 7, 5, 6], [9, 9, 9, 9, 1, 2, 3, 4]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=24)
needs_arctic = pytest.mark.skipif(
    suffix_method.missing_package() is not None, reason="arctic-inference is not installed (make arctic-inference)"
)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, num_layers=4, logit_scale=8.0)


@needs_arctic
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_output_equals_ar_and_drafts_are_accepted(target, batch):
    ar = get_method("ar").decode(DecodeJob(target, PROMPTS, GREEDY))
    rows = []
    for start in range(0, len(PROMPTS), batch):
        job = DecodeJob(target, PROMPTS[start : start + batch], GREEDY, gamma=4, options={"min_token_prob": 0.0})
        rows += get_method("suffix").decode(job)
    assert [r.output_ids for r in rows] == [r.output_ids for r in ar]
    drafted = sum(sum(s.drafted for s in r.steps) for r in rows)
    accepted = sum(sum(s.accepted for s in r.steps) for r in rows)
    assert drafted > 0 and accepted > 0  # the tiny model repeats itself: the suffix tree finds it


@needs_arctic
def test_drafts_follow_the_library():
    drafter = suffix_method.SuffixDrafter([[1, 2, 3, 4, 1, 2]], {"max_tree_depth": 8}, "cpu")
    draft = drafter.propose([[1, 2, 3, 4, 1, 2, 3]], [4])
    assert draft.tokens[0, : int(draft.n_draft[0])].tolist() == [
        4,
        1,
        2,
    ]  # what followed "1 2 3" in the prompt (≤ 1.0 × the 3-token match)


def test_options_are_checked_by_name():
    spec = get_method("suffix")
    with pytest.raises(ValueError, match="min_token_prob=1.5"):
        spec.check(4, 1, None, {"min_token_prob": 1.5})
    with pytest.raises(ValueError, match="option 'suffix_decoding_max_tree_depth' is not known"):
        spec.check(4, 1, None, {"suffix_decoding_max_tree_depth": 8})


def test_refused_at_load_naming_the_package_when_absent(monkeypatch):
    monkeypatch.setattr(suffix_method.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"arctic-inference==0\.3\.0.*make arctic-inference"):
        get_method("suffix").check(4, 1, None, {})
