"""Structured outputs: a task's constraint is checked at load, refused where an engine cannot take it,
sent in each engine's own request field, and the outputs judged against the schema."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml
from pydantic import ValidationError

from specstudy.analysis import structured
from specstudy.config import load_study
from specstudy.config.errors import ParamsProblems
from specstudy.config.task import StructuredOutputSpec
from specstudy.data.fetch import sha256_file
from specstudy.frameworks import declaration
from specstudy.frameworks.declaration import constraint_body
from specstudy.records import RequestRecord
from specstudy.run.task_checks import check_tasks

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))


def _files(tmp_path, frameworks, ignore_eos, framework_options=None):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"qid": f"q{i}", "q": f"Name {i} as JSON."}) + "\n" for i in range(4)))
    src = {"name": "rows", "kind": "file", "path": str(data), "sha256": sha256_file(data), "licence": "CC0"}
    task = {
        "category": "json",
        "chat_template": False,
        "sources": [{**src, "fields": {"id": "qid", "text": "q"}}],
        "structured_output": {"json_schema": SCHEMA},
    }
    (tmp_path / "json.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    study = {
        "name": "so",
        "models": [{"name": "m", "target": "smollm2-135m", "dtype": "float32"}],
        "methods": [{"method": "ar"}, {"method": "ngram", "label": "PL"}],
        "frameworks": frameworks,
        "tasks": ["json.yaml"],
        "gammas": [2],
        "batch_sizes": [1],
        "sampling": {"ignore_eos": ignore_eos},
        "max_new_tokens": 16,
        "prompts_per_task": 2,
        **({"framework_options": framework_options} if framework_options else {}),
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({"study": study}, sort_keys=False))
    return load_study("cpu", tmp_path / "study.yaml", check_tokenizers=False)


def test_a_constrained_task_is_refused_on_engines_without_the_field_and_with_ignore_eos(tmp_path):
    cfg = _files(tmp_path, ["reference", "llamacpp"], ignore_eos=True)
    with pytest.raises(ParamsProblems) as e:
        check_tasks(cfg, fetch=False)
    msgs = [str(p) for p in e.value.problems]
    assert any("frameworks='reference'" in m and "llamacpp" in m and "vllm-server" in m for m in msgs), msgs
    assert any("ignore_eos=True" in m for m in msgs) and len(msgs) == 2  # every problem at once
    assert check_tasks(_files(tmp_path, ["llamacpp"], ignore_eos=False), fetch=False) == []


def test_the_schema_is_checked_as_one_and_exactly_one_constraint_is_given():
    assert StructuredOutputSpec(grammar='root ::= "a"').grammar
    with pytest.raises(ValidationError, match="exactly one of json_schema, grammar"):
        StructuredOutputSpec()
    with pytest.raises(ValidationError, match="a valid JSON schema"):
        StructuredOutputSpec(json_schema={"type": "no-such-type"})


def test_each_engine_gets_the_constraint_in_its_own_field():
    text = json.dumps(SCHEMA)
    assert constraint_body(declaration("llamacpp"), text, None) == {"json_schema": SCHEMA}
    assert constraint_body(declaration("llamacpp"), None, 'root ::= "a"') == {"grammar": 'root ::= "a"'}
    assert constraint_body(declaration("vllm-server"), text, None) == {"structured_outputs": {"json": SCHEMA}}
    assert constraint_body(declaration("openai"), None, None) == {}
    with pytest.raises(ValueError, match="'openai' takes no json_schema"):
        constraint_body(declaration("openai"), text, None)
    assert (
        declaration("trtllm").structured_with_speculation is True
        and "issues/18892" in declaration("trtllm").structured_source
    )
    assert declaration("trtllm-engine").structured_with_speculation is None
    from specstudy.report.deploy import engines_shown

    raw = structured.engines_table()
    assert raw.set_index("framework").loc["trtllm", "with_speculation"] is True
    table = engines_shown(raw).set_index("Framework")
    assert (
        table.loc["trtllm", "With speculation"] == "yes"
        and table.loc["trtllm-engine", "With speculation"] == "not documented"
    )
    assert table.loc["sglang", "With speculation"] == "yes" and "pull/13425" in declaration("sglang").structured_source


def test_sglang_takes_the_schema_as_json_text_and_a_grammar_as_ebnf_in_its_sampling_params():
    """SGLang's SamplingParams.json_schema is a str (an object there is refused by its request check)."""
    from specstudy.backends.sglang.sglang_server import SglangServerBackend
    from specstudy.records import Request, Sampling

    text = json.dumps(SCHEMA)
    assert constraint_body(declaration("sglang"), text, None) == {"sampling_params": {"json_schema": text}}
    assert constraint_body(declaration("sglang"), None, 'root ::= "a"') == {"sampling_params": {"ebnf": 'root ::= "a"'}}
    backend = SglangServerBackend("smollm2-135m", base_url="http://127.0.0.1:9")
    body = backend.request_body(Request("q0", "Name 0 as JSON.", json_schema=text), Sampling(max_new_tokens=8))
    assert body["sampling_params"]["json_schema"] == text and body["sampling_params"]["max_new_tokens"] == 8
    plain = backend.request_body(Request("q0", "Hi"), Sampling(max_new_tokens=8))["sampling_params"]
    assert "json_schema" not in plain and "ebnf" not in plain


def test_trtllm_takes_a_typed_response_format_once_its_guided_decoder_is_set(tmp_path):
    """trtllm-serve's ResponseFormat: type "json" with ``schema``, "ebnf" with ``ebnf``; the server's
    ``guided_decoding_backend`` must be set, or a constrained task is refused at load naming the option."""
    from specstudy.backends.trtllm.trtllm_server import TrtllmServerBackend
    from specstudy.records import Cell

    text = json.dumps(SCHEMA)
    for fw in ("trtllm", "trtllm-engine"):
        assert constraint_body(declaration(fw), text, None) == {"response_format": {"type": "json", "schema": SCHEMA}}
        assert constraint_body(declaration(fw), None, "root ::= x") == {
            "response_format": {"type": "ebnf", "ebnf": "root ::= x"}
        }
    cell = Cell("c", "local", "trtllm", "ar", "json", "smollm2-135m")
    on = TrtllmServerBackend("smollm2-135m", base_url="http://127.0.0.1:9", guided_decoding_backend="xgrammar")
    assert on.llm_api_options(cell)["guided_decoding_backend"] == "xgrammar"
    off = TrtllmServerBackend("smollm2-135m", base_url="http://127.0.0.1:9")
    assert "guided_decoding_backend" not in off.llm_api_options(cell)
    with pytest.raises(ValueError, match=r"guided_decoding_backend='outlines': allowed \['llguidance', 'xgrammar'\]"):
        TrtllmServerBackend("smollm2-135m", base_url="http://127.0.0.1:9", guided_decoding_backend="outlines")
    with pytest.raises(ParamsProblems) as e:
        check_tasks(_files(tmp_path, ["trtllm"], ignore_eos=False), fetch=False)
    assert [p.key for p in e.value.problems] == ["framework_options.trtllm.guided_decoding_backend"]
    ok = _files(
        tmp_path, ["trtllm"], ignore_eos=False, framework_options={"trtllm": {"guided_decoding_backend": "xgrammar"}}
    )
    assert check_tasks(ok, fetch=False) == []


def _out(text, tokens=5, status="ok", schema=SCHEMA):
    r = RequestRecord("s", "cpu", "llamacpp", "ngram", "json", "p", 0, "c", "m", max_new_tokens=16)
    r.output_text, r.output_tokens, r.status = text, tokens, status
    r.extra["constraint"] = {"json_schema": json.dumps(schema), "grammar": None} if schema else {}
    return r


def test_outputs_are_judged_against_the_schema_and_cut_ones_are_not_judged():
    assert structured.output_valid(_out('{"name": "x"}')) is True
    assert structured.output_valid(_out('{"nom": "x"}')) is False  # parses, misses a required key
    assert structured.output_valid(_out('{"name": ')) is False  # finished early but not JSON
    assert structured.output_valid(_out('{"name": ', tokens=16)) is None  # cut at max_new_tokens
    assert structured.output_valid(_out("x", schema=None)) is None
    share, n = structured.valid_share([_out('{"name": "x"}'), _out("{}"), _out("", status="error")])
    assert (share, n) == (0.5, 2)


def test_the_request_carries_the_task_constraint():
    from specstudy.config.task import TaskConfig
    from specstudy.data.tasks import structured_fields

    cfg = SimpleNamespace(structured_output=StructuredOutputSpec(json_schema=SCHEMA))
    js, grammar = structured_fields(cfg)  # type: ignore[arg-type]
    assert json.loads(js) == SCHEMA and grammar is None
    assert structured_fields(SimpleNamespace(structured_output=None)) == (None, None)  # type: ignore[arg-type]
    assert "structured_output" in TaskConfig.model_fields
