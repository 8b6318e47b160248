"""llama.cpp through xllamacpp's in-process server: its config, launch, step costs and GGUF metadata."""
