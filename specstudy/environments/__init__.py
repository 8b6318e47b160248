"""Engines the kit drives across environments: one pinned venv per engine (:mod:`.environments`),
the offline vLLM worker that runs inside vLLM's venv (:mod:`.vllm_worker`), drafter checkpoint
checks (:mod:`.drafters`) and the machine preflight (:mod:`.preflight`).

Importing this package imports nothing heavy: no engine, no torch.
"""
