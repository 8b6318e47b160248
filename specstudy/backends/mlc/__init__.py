"""MLC-LLM's ``mlc_llm serve`` (OpenAI-compatible server; speculative modes small_draft, eagle, medusa)."""
