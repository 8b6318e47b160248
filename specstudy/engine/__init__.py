"""The reference engine: torch + transformers, every method family, every verification step recorded.

``sampling`` (logits → probs, shared by draft and target), ``kv`` (cache append / rollback for
ragged batches, the cache keyword of the installed transformers), ``verify`` (the one verify
step), ``synthetic`` (benchmark-only fixed-rate acceptance), ``speculate`` (the chain loop),
``tokentree`` (token trees, their attention mask and cache), ``trace`` (per-row records),
``stepcost`` (the measured verification-cost curve), ``entropy`` (per-token entropy and log p
from the logits already computed), ``drafters`` (trained drafters' architectures and files),
``methods`` (registry: ar, draft_target, ngram, layer_skip, heads, eagle, tree).
"""
