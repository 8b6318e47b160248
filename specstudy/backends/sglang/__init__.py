"""SGLang's server (``python -m sglang.launch_server``) in its own environment."""
