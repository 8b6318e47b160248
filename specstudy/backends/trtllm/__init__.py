"""TensorRT-LLM's ``trtllm-serve`` (PyTorch and TensorRT-engine backends)."""
