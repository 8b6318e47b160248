"""vLLM offline (``vllm.LLM`` in a worker process) and its OpenAI server, in vLLM's own environment."""
