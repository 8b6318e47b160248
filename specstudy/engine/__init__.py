"""The reference engine: torch + transformers, every method family, every verification step recorded.

``sampling`` (logits → probs, shared by draft and target), ``kv`` (cache append / rollback for
ragged batches), ``verify`` (the one verify step), ``speculate`` (the chain loop), ``trace``
(per-row records), ``methods`` (registry: ar, draft_target, ngram, layer_skip, ...).
"""
