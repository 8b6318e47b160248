"""GGUF header metadata without loading weights: the precision and the tokenizer vocabulary.

The llama.cpp backend checks a draft against its target and records the weights' quantization
before any model loads.  ``gguf.GGUFReader`` maps every array element into its own numpy view,
which takes 9–30 s for a 150k-token vocabulary on this machine; this walker reads only the
key/value section (typed by ``gguf.GGUFValueType``) with ``struct`` over an mmap and stops
before the tensors, well under a second.  A file that is not a readable GGUF is a ValueError
naming it.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

import gguf

_SCALARS = {  # GGUFValueType -> struct format (little-endian)
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}
TOKENS_KEY = "tokenizer.ggml.tokens"


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > len(self.buf) - self.pos:
            raise ValueError(f"string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, keep: bool = True) -> Any:
        """The next value; an array that is not kept is stepped over and returns its length."""
        vtype = gguf.GGUFValueType(vtype)
        if vtype == gguf.GGUFValueType.STRING:
            return self.string()
        if vtype != gguf.GGUFValueType.ARRAY:
            return self.unpack(_SCALARS[vtype])
        item, n = gguf.GGUFValueType(self.unpack("<I")), self.unpack("<Q")
        if keep:
            return [self.value(item) for _ in range(n)]
        if item in _SCALARS:
            self.pos += n * struct.calcsize(_SCALARS[item])
        elif item == gguf.GGUFValueType.STRING:
            for _ in range(n):
                self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]
        else:
            for _ in range(n):
                self.value(item, keep=False)
        if self.pos > len(self.buf):
            raise ValueError("an array runs past the end of the file")
        return n


def read_metadata(path: str | os.PathLike[str], arrays: frozenset[str] = frozenset({TOKENS_KEY})) -> dict[str, Any]:
    """Every key/value of a GGUF header; arrays named in ``arrays`` as lists, the others as their
    length (the merges and token types are not needed here).  ValueError if it is not a readable GGUF."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf)
            magic, version = cur.unpack("<I"), cur.unpack("<I")
            if magic != gguf.GGUF_MAGIC:
                raise ValueError(f"bad magic {magic:#x} (expected GGUF {gguf.GGUF_MAGIC:#x})")
            _n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
            out: dict[str, Any] = {"GGUF.version": version}
            for _ in range(n_kv):
                key = cur.string()
                out[key] = cur.value(cur.unpack("<I"), keep=key in arrays)
            return out
    except (OSError, ValueError, struct.error, KeyError) as e:
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def file_type_name(meta: dict[str, Any]) -> str | None:
    """The weights' quantization as llama.cpp names it (``Q4_1``, ``Q4_K_M``, ``F16``...)."""
    ft = meta.get("general.file_type")
    if ft is None:
        return None
    try:
        name = gguf.LlamaFileType(int(ft)).name
    except ValueError:
        return f"file_type={ft}"
    return name.removeprefix("MOSTLY_").replace("ALL_F32", "F32")


def vocab_mismatch(
    target: dict[str, Any], draft: dict[str, Any], names: tuple[str, str] = ("target", "draft")
) -> str | None:
    """Why a draft cannot speculate for a target (different token lists or special ids), else None."""
    a, b = target.get(TOKENS_KEY), draft.get(TOKENS_KEY)
    if a is None or b is None:
        missing = names[0] if a is None else names[1]
        return f"the {missing} GGUF has no {TOKENS_KEY}: its vocabulary cannot be compared"
    if len(a) != len(b):
        return f"vocabulary sizes differ: {names[0]} has {len(a)} tokens, {names[1]} has {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"token id {i} differs: {names[0]} {x!r}, {names[1]} {y!r}"
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        if target.get(key) != draft.get(key):
            return f"{key} differs: {names[0]} {target.get(key)!r}, {names[1]} {draft.get(key)!r}"
    return None
