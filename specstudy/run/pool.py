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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..backends import get_backend
from ..backends.base import Backend
from ..config import StudyConfig
from ..environments.install import engine_env, python_of
from ..frameworks import DECLARATIONS, drafter_per_cell, environment_of, server_frameworks, tensor_parallel
from ..records import CONTROL_FAMILY
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
        #: engines whose close said their memory was not handed back (the study reports each as failed)
        self.unreleased: list[str] = []
        self._last_cell: dict[tuple[Any, ...], str] = {}
        #: the servers of in-time groups (:meth:`arms`), one per arm, kept across groups (LRU)
        self.arm_servers: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        #: each arm server's start batch: the arms of one group are always servers started together
        self._generation: dict[tuple[Any, ...], int] = {}
        self._generations = 0
        #: per server framework, the arms the study's in-time groups will ask for (:meth:`expect_arms`)
        self.expected: dict[str, dict[tuple[Any, ...], CellPlan]] = {}

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
        backend = self._get(plan)
        self._last_cell[next(k for k, b in self.loaded.items() if b is backend)] = plan.cell_id
        return backend

    def _close(self, key: tuple[Any, ...], backend: Any) -> None:
        """Close one engine; a close that reports memory not handed back is kept, naming its last cell."""
        try:
            backend.close()
        except MemoryError as e:
            self.unreleased.append(f"{key[0]} engine of {key[1]} (last cell {self._last_cell.get(key)}): {e}")
            self.log(f"warning: {self.unreleased[-1]}")
        except Exception:  # a server that is already gone
            pass

    @staticmethod
    def arm_key(plan: CellPlan) -> tuple[Any, ...]:
        """An in-time arm's server: its engine configuration, and whether it is an A/A control (its own)."""
        return (*plan.engine_config_key(), plan.family == CONTROL_FAMILY)

    def expect_arms(self, plans: Sequence[CellPlan]) -> None:
        """The arms the study's in-time groups may ask for on each framework with ``servers_in_time`` (its
        offline single-turn cells): where they all fit that cap, the first group starts them all together,
        so no later group pairs a server kept from earlier groups with a fresh one.  (In make study such a
        pair read 1.036x and 1.037x for AR against its A/A control; two servers started together read
        1.004-1.017x in four runs of 16 prompts: docs/validity.md.)"""
        self.expected = {}
        for p in plans:
            fw = p.cell.framework
            if fw in self.cfg.servers_in_time and p.request_rate is None and p.turns == 1:
                self.expected.setdefault(fw, {}).setdefault(self.arm_key(p), p)
        self.expected = {fw: e for fw, e in self.expected.items() if len(e) <= self.cfg.servers_in_time[fw]}

    def arms(self, plans: Sequence[CellPlan]) -> list[Any]:
        """One server per arm of an in-time group on a server framework (its speculation is fixed at
        start): each configuration, and an A/A control beside its baseline's, gets its own process, so
        requests alternate between them.  The arms of a group are always servers started together: a
        group that needs one not held starts all of its own afresh (with every arm :meth:`expect_arms`
        expects, where they fit).  Up to the study's ``servers_in_time`` of them are kept across groups
        (the least recently used closed first); every other loaded engine is closed first."""
        fw = plans[0].cell.framework
        keys = [self.arm_key(p) for p in plans]
        while self.loaded:
            self._evict()
        for other in [k for k in self.arm_servers if k[0] != fw]:
            self._close(other, self.arm_servers.pop(other))
        held = {self._generation.get(k) for k in keys if k in self.arm_servers}
        if any(k not in self.arm_servers for k in keys) or len(held) > 1:
            self._start_together(fw, dict(zip(keys, plans)))
        out = []
        for key, plan in zip(keys, plans):
            self.arm_servers.move_to_end(key)
            self._last_cell[key] = plan.cell_id
            out.append(self.arm_servers[key])
        return out

    def _start_together(self, fw: str, arms: dict[tuple[Any, ...], CellPlan]) -> None:
        """A new batch of ``fw`` arm servers: this group's, with the expected others that fit the cap; any
        held server of theirs is closed first (no arm runs beside a server older than itself)."""
        together = {**{k: p for k, p in self.expected.get(fw, {}).items() if k not in arms}, **arms}
        if len(together) <= self.cfg.servers_in_time.get(fw, 1):
            arms = together
        cap = max(self.cfg.servers_in_time.get(fw, 1), len(arms))
        for key in [k for k in self.arm_servers if k in arms]:
            self._close(key, self.arm_servers.pop(key))
        while len(self.arm_servers) + len(arms) > cap:  # the least recently used of other batches
            old = next(iter(self.arm_servers))
            self._close(old, self.arm_servers.pop(old))
        self._generations += 1
        for key, plan in arms.items():
            self.arm_servers[key] = backend = self.factory(fw, **self._options(plan))
            self._generation[key] = self._generations
            if hasattr(backend, "ensure_server"):  # the processes start now, one after another, not at first use
                backend.ensure_server(plan.backend_cell())
            self.loads.append(key)
            self.log(
                f"started a {fw} server for the arm {plan.label}" + (f" γ {plan.cell.gamma}" if plan.cell.gamma else "")
            )

    def arms_held(self) -> list[tuple[Any, ...]]:
        """The in-time arms' servers held now (their keys), least recently used first."""
        return list(self.arm_servers)

    def _close_arms(self) -> None:
        while self.arm_servers:
            key, b = self.arm_servers.popitem(last=False)
            self._close(key, b)

    def _get(self, plan: CellPlan) -> Any:
        self._close_arms()  # a cell served alone: the in-time groups' servers go first (memory)
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
        self._close(victim, b)
        del b
        gc.collect()

    def close(self) -> None:
        self._close_arms()
        while self.loaded:
            key, b = self.loaded.popitem()
            self._close(key, b)
