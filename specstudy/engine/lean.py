"""A lean batch-1 forward of a transformers Llama model over a static KV cache (gpt-fast style).

transformers' own forward spends a verification step's non-matmul time on a ``DynamicCache``
that concatenates every layer's keys and values per call and on building a causal mask per
call (≈ 915 extra small ops for more than one query token, ``bench/README.md``).  Here:

- the cache is one preallocated tensor per layer, written in place at the row's positions;
  a rollback only moves the length back (rejected slots are overwritten by the next forward
  and never attended to, because attention reads slots ``[0, length)`` only);
- the causal mask of a k-token block at position p is a view ``causal[p:p+k, :p+k]`` of one
  mask built when the cache grows, and a 1-token step passes none;
- q, k, v are one matmul and gate, up another: the projections' weights are rows of one
  buffer each (the model's own parameters become views of it: no copy, same values), so a
  layer runs 4 matmuls instead of 7;
- for a model passed to :func:`prepare` (the reference backend's target), in float32 on a CPU
  with MKL, every matmul (the LM head included) runs on weights prepacked once for MKL's sgemm
  (``torch.ops.mkl._mkl_linear``, what inductor's freezing uses): unpacked, sgemm repacks the
  whole weight on every call with more than one row, which made a 2-token forward cost 1.5-2x a
  1-token one (``bench/README.md``).  The two packs (:data:`PACK_FOR_ROWS`) hold two more copies
  of the weights; :func:`pack_bytes` counts them in a cell's memory;
- RMSNorm and the activation are the model's own modules (the same numbers, and a forward hook
  on the final norm still fires: the heads method reads its hidden state there).

It runs only where it computes what transformers computes: :func:`lean_supported` names the
configurations (plain Llama, default RoPE, no biases, SiLU, full attention) and everything
else keeps transformers' forward.  Its cache quacks like the ``DynamicCache`` methods
:class:`~specstudy.engine.kv.KVState` calls (``get_seq_length``, ``crop``,
``batch_select_indices``).
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

#: tokens of cache allocated at first; it doubles when a forward needs more
INITIAL_CAPACITY = 512
#: :func:`prepare` prepacks float32 CPU weights for MKL's sgemm (off: F.linear on the model's weights)
PACK_WEIGHTS = True
#: rows per packed multiply -> the row count its packing is made for.  Measured (SmolLM2-135M, one
#: thread, ``bench/README.md``): a weight packed for 4 rows multiplies 1-4 rows at 1.0-1.3x the
#: 1-row time but 5-8 rows at 1.7-2.3x; packed for 8 rows, 8 rows take 1.5x, while packs for 5 or 6
#: rows are no faster at 5 or 6.  So 1-4 rows use the 4-row pack as they are, and 5-8 rows are
#: padded with zero rows to 8 and use the 8-row pack; more rows (a prompt) use F.linear.
PACK_FOR_ROWS = {1: 4, 2: 4, 3: 4, 4: 4, 5: 8, 6: 8, 7: 8, 8: 8}
#: models above this many weight bytes are not packed (each pack is another copy of the weights)
PACK_MAX_MODEL_BYTES = 2 * 1024**3


def lean_supported(model: Any) -> str | None:
    """None when :class:`LeanLlama` computes ``model``'s forward; else why not (a sentence)."""
    from transformers import LlamaForCausalLM

    if type(model) is not LlamaForCausalLM:
        return f"{type(model).__name__} is not a plain LlamaForCausalLM"
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    checks = {
        "rope_type default": rope.get("rope_type", rope.get("type", "default")) == "default",
        "no attention bias": not getattr(cfg, "attention_bias", False),
        "no MLP bias": not getattr(cfg, "mlp_bias", False),
        "hidden_act silu": getattr(cfg, "hidden_act", None) == "silu",
        "pretraining_tp 1": getattr(cfg, "pretraining_tp", 1) == 1,
        "full attention": all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or [])),
        "no attention dropout in eval": not model.training,
        "float nn.Linear projections (not quantized)": all(
            type(m) is torch.nn.Linear for layer in model.model.layers for m in _projections(layer)
        ),
    }
    failed = [name for name, ok in checks.items() if not ok]
    return f"config lacks {failed}" if failed else None


_LEAN: weakref.WeakKeyDictionary[torch.nn.Module, LeanLlama] = weakref.WeakKeyDictionary()
_ENABLED = [True]


def set_lean_forward(enabled: bool) -> bool:
    """Turn the lean forward on or off for KV states created from now on (benchmarks compare the
    two in one run); returns the previous setting."""
    previous, _ENABLED[0] = _ENABLED[0], enabled
    return previous


def lean_cache(model: Any, batch_size: int, device: torch.device) -> StaticKV | None:
    """A static cache running ``model`` through :class:`LeanLlama`, or None where transformers'
    forward is used (batch > 1, an unsupported model, the lean forward switched off).

    A model may stand for the first layers of a Llama target (an early-exit draft without an
    adapter): its ``lean_layers()`` returns ``(target, n_layers)``, or None when it cannot.
    """
    if batch_size != 1 or not _ENABLED[0]:
        return None
    subset = getattr(model, "lean_layers", None)
    pair = subset() if callable(subset) else None
    target, n_layers = pair if pair is not None else (model, None)
    if lean_supported(target) is not None or layer_hooks(target):
        return None
    lean = _LEAN.get(target)
    if lean is None or not lean.aliases_model():  # new, or the model's weights were replaced (.to())
        lean = _LEAN[target] = LeanLlama(target, pack=lean is not None and lean.packed)
    return StaticKV(lean, device, next(target.parameters()).dtype, n_layers or len(lean.layers))


#: the attribute that marks a decoder layer's forward pre-hook the lean forward calls itself, with the
#: layer's input (the residual stream entering it): EAGLE-3's feature capture
#: (:class:`specstudy.engine.methods.heads.AuxCapture`)
LEAN_AWARE = "lean_aware"


def layer_hooks(model: Any) -> bool:
    """Whether a hook the lean forward would not call watches a decoder layer: the lean forward calls
    no layer module, so such a model runs transformers' forward, where the hooks fire.  Pre-hooks
    marked :data:`LEAN_AWARE` do not count."""
    return any(
        m._forward_hooks or any(not getattr(h, LEAN_AWARE, False) for h in m._forward_pre_hooks.values())
        for layer in model.model.layers
        for m in layer.modules()
    )


def _lean_taps(layer: Any) -> list[Any]:
    """The layer's own :data:`LEAN_AWARE` pre-hooks (its submodules' would see other inputs)."""
    return [h for h in layer._forward_pre_hooks.values() if getattr(h, LEAN_AWARE, False)]


def prepare(model: Any, pack: bool = True) -> bool:
    """Fuse (and with ``pack``, prepack) ``model``'s weights now, outside any timed or
    memory-measured batch (fusing briefly holds the old and the new buffers); returns whether
    its lean forward multiplies on packed weights (False: no lean forward, or not packed)."""
    if lean_supported(model) is not None:
        return False
    pack = pack and PACK_WEIGHTS
    lean = _LEAN.get(model)
    if lean is None or (pack and not lean.packed) or not lean.aliases_model():
        lean = _LEAN[model] = LeanLlama(model, pack=pack)
    return lean.packed


def pack_bytes(*modules: object) -> int:
    """Bytes of the packed weight copies :func:`prepare` made for ``modules`` (the packs MKL
    writes hold about the weight's own bytes each)."""
    total = 0
    for m in modules:
        lean = _LEAN.get(m) if isinstance(m, torch.nn.Module) else None
        for mm in lean.matmuls() if lean is not None else []:
            total += len(mm.packs) * mm.weight.numel() * mm.weight.element_size()
    return total


def _projections(layer: Any) -> list[Any]:
    at, mlp = layer.self_attn, layer.mlp
    return [at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def _fuse_rows(linears: list[torch.nn.Linear]) -> torch.Tensor:
    """One ``[sum of out_features, in]`` buffer holding the linears' weights; each weight becomes a
    view of its rows (the values are unchanged and the model holds no second copy)."""
    fused = torch.cat([lin.weight.data for lin in linears], dim=0)
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = fused[start : start + n]
        start += n
    return fused


class Matmul:
    """``x @ weight.T``: through MKL's prepacked sgemm for a float32 CPU weight where MKL is there
    (and :data:`PACK_WEIGHTS` is on), else ``F.linear``."""

    def __init__(self, weight: torch.Tensor, pack: bool, sources: list[torch.nn.Linear] | None = None):
        self.weight = weight
        # the modules whose weights this multiplies by: their parameter, its storage and its version
        # (an in-place edit bumps it; ``model.to(...)`` replaces the storage)
        self.stamps = [(m, m.weight, m.weight.data_ptr(), m.weight._version) for m in sources or []]
        mkl = torch.backends.mkl.is_available()  # type: ignore[no-untyped-call]  # untyped in torch
        pack = pack and weight.dtype == torch.float32 and weight.device.type == "cpu"
        pack = pack and mkl and hasattr(torch.ops.mkl, "_mkl_linear")
        #: the row count a pack is made for -> the pack (none: F.linear)
        self.packs = {
            hint: torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), hint)
            for hint in (sorted(set(PACK_FOR_ROWS.values())) if pack else [])
        }

    def current(self) -> bool:
        """Whether this still multiplies by its modules' weights (the same storage and values)."""
        return all(m.weight is w and w.data_ptr() == ptr and w._version == v for m, w, ptr, v in self.stamps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        hint = PACK_FOR_ROWS.get(rows)
        packed = self.packs.get(hint) if hint is not None else None
        if hint is None or packed is None:
            return F.linear(x, self.weight)
        flat = x.reshape(rows, x.shape[-1])
        if hint > rows and hint > 4:  # zero rows change no other row's result
            flat = torch.cat([flat, flat.new_zeros(hint - rows, flat.shape[1])])
        out: torch.Tensor = torch.ops.mkl._mkl_linear(flat, packed, self.weight, None, hint)
        return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanLlama:
    """The fused weights and RoPE tables of one Llama model (shared by all its caches)."""

    def __init__(self, model: Any, pack: bool = False):
        why = lean_supported(model)
        if why is not None:
            raise ValueError(f"no lean forward: {why}")
        cfg = model.config
        # no reference to ``model`` itself: this object is the value of a WeakKeyDictionary keyed by
        # it, and a value holding its key keeps the model (GPU memory) alive for the whole process
        self.base = model.model
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        pack = pack and sum(p.numel() * p.element_size() for p in model.parameters()) <= PACK_MAX_MODEL_BYTES
        self.layers = []
        for layer in self.base.layers:
            at, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                SimpleNamespace(
                    layer=layer,
                    qkv=Matmul(_fuse_rows(qkv := [at.q_proj, at.k_proj, at.v_proj]), pack, qkv),
                    o=Matmul(at.o_proj.weight, pack, [at.o_proj]),
                    gate_up=Matmul(_fuse_rows(gu := [mlp.gate_proj, mlp.up_proj]), pack, gu),
                    down=Matmul(mlp.down_proj.weight, pack, [mlp.down_proj]),
                    scaling=at.scaling,
                )
            )
        self.lm_head = Matmul(model.lm_head.weight, pack, [model.lm_head])
        self.packed = bool(self.lm_head.packs)
        self.rotary = self.base.rotary_emb
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def matmuls(self) -> list[Matmul]:
        return [self.lm_head] + [mm for w in self.layers for mm in (w.qkv, w.o, w.gate_up, w.down)]

    def aliases_model(self) -> bool:
        """Whether the fused buffers and packed copies still hold the model's weights
        (``model.to(...)`` replaces them, an in-place edit changes them)."""
        return all(mm.current() for mm in self.matmuls())

    def rope(self, n: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[n, head_dim]`` for positions 0..n-1, from the model's own rotary module
        (the same float32 computation transformers does per call), grown as needed."""
        if self._rope is None or self._rope[0].shape[0] < n:
            pos = torch.arange(n, device=like.device)[None]
            cos, sin = self.rotary(like, position_ids=pos)
            self._rope = (cos[0], sin[0])
        return self._rope


class StaticKV:
    """One row's KV cache: ``[layers, kv heads, capacity, head_dim]`` keys and values, written
    in place; ``length`` slots are real.  Its forward runs the model's first ``n_layers`` layers
    (all of them, or an early-exit draft's), then the final norm and the LM head."""

    def __init__(self, lean: LeanLlama, device: torch.device, dtype: torch.dtype, n_layers: int):
        self.lean = lean
        self.n_layers = n_layers
        self.device, self.dtype = device, dtype
        self.length = 0
        self.k = self.v = torch.empty(0)
        self.causal = torch.empty(0, dtype=torch.bool)
        self._grow(INITIAL_CAPACITY)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def _grow(self, need: int) -> None:
        cap = max(INITIAL_CAPACITY, self.capacity if self.k.dim() == 4 else 0)
        while cap < need:
            cap *= 2
        shape = (self.n_layers, self.lean.n_kv, cap, self.lean.head_dim)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        if self.length:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v
        self.causal = torch.ones((cap, cap), dtype=torch.bool, device=self.device).tril()

    # the DynamicCache methods KVState calls
    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` slots (negative: drop that many from the end)."""
        self.length = max_length if max_length >= 0 else max(0, self.length + max_length)

    def batch_select_indices(self, idx: torch.Tensor) -> None:
        if idx.numel() != 1 or int(idx[0]) != 0:
            raise ValueError(f"a lean cache holds one row; cannot select rows {idx.tolist()}")

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        """Append ``ids [1, k]`` at positions ``length..length+k-1``; logits ``[1, k or keep, V]``."""
        h = self.hidden_forward(ids)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits: torch.Tensor = self.lean.lm_head(h)
        return logits

    @torch.no_grad()
    def hidden_forward(
        self, ids: torch.Tensor, positions: torch.Tensor | None = None, allowed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append ``ids [1, k]`` at slots ``length..length+k-1``; the final norm's output ``[1, k, H]``.

        Default: causal, at rotary positions equal to the slots.  A token tree passes each node's
        ``positions [k]`` (past + depth) and ``allowed [k, length + k]`` (True: attend), the
        tree mask of :mod:`specstudy.engine.tokentree`.
        """
        lean, k = self.lean, ids.shape[1]
        p, end = self.length, self.length + k
        if end > self.capacity:
            self._grow(end)
        x = lean.base.embed_tokens(ids)
        cos, sin = lean.rope(self.capacity, x)
        cos, sin = (cos[p:end], sin[p:end]) if positions is None else (cos[positions], sin[positions])
        mask = allowed if allowed is not None else (self.causal[p:end, :end] if k > 1 else None)
        for i, w in enumerate(lean.layers[: self.n_layers]):
            for tap in _lean_taps(w.layer) if w.layer._forward_pre_hooks else ():
                tap(w.layer, (x,))
            x = self._layer(i, w, x, cos, sin, mask, p, end)
        self.length = end
        h: torch.Tensor = lean.base.norm(x)
        return h

    def keep(self, past: int, slots: list[int]) -> None:
        """Keep the first ``past`` slots and ``past + j`` for j in ``slots``, moved to ``past, past + 1, ...``
        (a token tree's accepted path: its keys were rotated at exactly those positions)."""
        idx = torch.tensor(slots, dtype=torch.long, device=self.k.device) + past
        n = len(slots)
        self.k[:, :, past : past + n] = self.k.index_select(2, idx)
        self.v[:, :, past : past + n] = self.v.index_select(2, idx)
        self.length = past + n

    def _layer(
        self,
        i: int,
        w: SimpleNamespace,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        p: int,
        end: int,
    ) -> torch.Tensor:
        lean, layer, k = self.lean, w.layer, x.shape[1]
        hd, nq, nkv = lean.head_dim, lean.n_heads, lean.n_kv
        qkv = w.qkv(layer.input_layernorm(x))
        q = qkv[..., : nq * hd].view(1, k, nq, hd).transpose(1, 2)
        kk = qkv[..., nq * hd : (nq + nkv) * hd].view(1, k, nkv, hd).transpose(1, 2)
        vv = qkv[..., (nq + nkv) * hd :].view(1, k, nkv, hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        self.k[i, :, p:end] = (kk * cos + _rotate_half(kk) * sin)[0]
        self.v[i, :, p:end] = vv[0]
        attn = F.scaled_dot_product_attention(
            q,
            self.k[i : i + 1, :, :end],
            self.v[i : i + 1, :, :end],
            attn_mask=mask,
            scale=w.scaling,
            enable_gqa=nq != nkv,
        )
        x = x + w.o(attn.transpose(1, 2).reshape(1, k, nq * hd))
        gate, up = w.gate_up(layer.post_attention_layernorm(x)).chunk(2, dim=-1)
        out: torch.Tensor = x + w.down(layer.mlp.act_fn(gate) * up)
        return out
