"""HF transformers in process: its assisted generation, prompt lookup and early exit beside AR."""
