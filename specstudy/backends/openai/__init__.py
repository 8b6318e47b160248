"""Any OpenAI-compatible server named by URL: streamed completions, no acceptance counters."""
