"""Loaded engines, keyed by what makes two cells share one, and reused across cells.

Loading a model is the slowest thing a study does; a cell without a drafter (AR, n-gram, layer
skip) reuses any loaded in-process engine of the same target, since the reference engine picks
the method per cell.  Servers hold one engine at a time (GPU memory).  The options each backend
is built with come from the study's framework options and the cell's model pair, in one place.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..backends import get_backend
from ..backends.base import Backend
from ..config import StudyConfig
from ..environments.install import engine_env, python_of
from ..frameworks import DECLARATIONS, drafter_per_cell, environment_of, server_frameworks, tensor_parallel
from .plan import CellPlan

BackendFactory = Callable[..., Any]


def _default_factory(framework: str, **options: Any) -> Backend:
    return get_backend(framework, **options)


class BackendPool:
    """Loaded engines keyed by :meth:`CellPlan.backend_key`, reused across cells.

    A cell without a drafter (AR, n-gram, layer skip) reuses any loaded in-process engine of the
    same target, since the reference engine picks the method per cell.  Servers hold one engine
    at a time (GPU memory); in-process engines up to ``capacity``, least recently used evicted.
    """

    def __init__(
        self,
        cfg: StudyConfig,
        factory: BackendFactory | None = None,
        capacity: int = 3,
        log: Callable[[str], None] = print,
        cuda: bool | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.log_dir = log_dir  # server and worker logs: the study's own outputs folder
        self.cuda = cuda  # which engine build (None: whether an NVIDIA GPU is here)
        self.factory = factory or _default_factory
        self.capacity = capacity
        self.log = log
        self.loaded: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.loads: list[tuple[Any, ...]] = []  # every key loaded, in order (tests check "once per key")

    def _options(self, plan: CellPlan) -> dict[str, Any]:
        fw = plan.cell.framework
        opts: dict[str, Any] = dict(self.cfg.framework_options.get(fw, {}))
        # engines that load each cell's drafter themselves start without one
        opts.update(model=plan.target, drafter=None if fw in drafter_per_cell() else plan.drafter_id)
        decl = DECLARATIONS[fw]
        if plan.dtype != "auto" and decl.takes_dtype:  # llama.cpp runs the GGUF's own precision
            opts["dtype"] = plan.dtype
        if decl.takes_device:
            opts["device"] = self.cfg.device
        if fw in server_frameworks():
            opts["prefix_cache"] = plan.prefix_cache
            if self.log_dir is not None:  # the study's framework_options may still name another folder
                opts.setdefault("log_dir", str(self.log_dir))
        engine = environment_of(fw)
        if engine is not None and "python" not in opts:  # the engine lives in its own pinned environment
            opts["python"] = str(python_of(engine_env(engine, self.cuda)))
        tp = plan.tensor_parallel_size
        if tp > 1:  # multi-GPU is the engine's job: each backend passes its own tensor-parallel flag
            if fw not in tensor_parallel():
                raise ValueError(
                    f"framework {fw!r} has no tensor parallelism; tensor_parallel_size={tp} "
                    f"needs one of {list(tensor_parallel())}"
                )
            opts["tensor_parallel_size"] = tp
        return opts

    def get(self, plan: CellPlan) -> Any:  # a Backend, or what a test's factory builds
        key = plan.backend_key()
        if key in self.loaded:
            self.loaded.move_to_end(key)
            return self.loaded[key]
        fw = plan.cell.framework
        if plan.drafter_id is None:  # AR / n-gram / layer skip: any engine of this target will do
            for k in reversed(self.loaded):
                if k[0] == key[0] and k[1] == key[1] and k[3:] == key[3:]:  # same all but the drafter
                    self.loaded.move_to_end(k)
                    return self.loaded[k]
        # another copy of the same target (a drafter variant) is never needed: an engine with the
        # drafter runs the drafter-less cells too, and two fp32 copies of a 1.5B target fill this machine
        for k in [k for k in self.loaded if k[:2] == key[:2] and k[3:] == key[3:]]:
            with contextlib.suppress(Exception):
                self.loaded.pop(k).close()
            gc.collect()  # the weights go now, before the next copy loads
        cap = 1 if fw in server_frameworks() else self.capacity
        while self.loaded and (
            len(self.loaded) >= cap
            or fw in server_frameworks()
            or any(k[0] in server_frameworks() for k in self.loaded)
        ):
            self._evict()
        t0 = time.perf_counter()
        backend = self.factory(fw, **self._options(plan))
        self.loads.append(key)
        self.loaded[key] = backend
        self.log(
            f"loaded {fw} engine: model={plan.target} drafter={plan.drafter_id} in {time.perf_counter() - t0:.1f}s"
        )
        return backend

    def _evict(self) -> None:
        # prefer dropping an engine without a drafter: drafter-less cells can use any other
        victim = next((k for k in self.loaded if k[2] is None), next(iter(self.loaded)))
        b = self.loaded.pop(victim)
        with contextlib.suppress(Exception):
            b.close()
        del b
        gc.collect()

    def close(self) -> None:
        while self.loaded:
            _, b = self.loaded.popitem()
            with contextlib.suppress(Exception):
                b.close()
