"""The ``cluster:`` block of a study file: where a sharded study's jobs go on a Slurm cluster.

A profile may say its partition, account, time limit, GPUs per node and extra sbatch options;
``specstudy run --executor slurm`` overrides any of them from the command line.  Everything is
checked at once (every problem listed) before a shard is planned or a job submitted.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, field_validator

from .errors import ParamsError, ParamsProblems, not_allowed, validate_all
from .files import load_yaml

#: sbatch options the executor sets itself from the shard (its GPUs, time, name, log files)
SET_BY_THE_KIT = frozenset(
    {"gpus", "gres", "gpus_per_node", "time", "job_name", "output", "error", "nodes", "ntasks", "partition", "account"}
)


class ClusterSpec(BaseModel):
    """One cluster's settings; unknown keys refused, every value checked."""

    model_config = ConfigDict(extra="forbid", strict=True)

    partition: str | None = Field(default=None, min_length=1)
    account: str | None = Field(default=None, min_length=1)
    #: the partition's time limit; a shard is sized to ``shard_fill`` of it by the dry run's prediction
    time_limit_min: PositiveInt = 240
    shard_fill: PositiveFloat = Field(default=0.7, le=1.0)
    #: 0 for a CPU partition; a shard asks for its model's tensor-parallel size, at most this
    gpus_per_node: int = Field(default=0, ge=0)
    cpus_per_task: PositiveInt = 2
    mem_gb: PositiveInt | None = None
    #: the interpreter on the nodes (a shared filesystem path); default: the submitting one
    python: str | None = None
    #: extra ``#SBATCH --key=value`` lines (e.g. {qos: high, constraint: a100}); keys in snake_case
    sbatch: dict[str, str] = Field(default_factory=dict)

    @field_validator("sbatch")
    @classmethod
    def _not_ours(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k.replace("-", "_") in SET_BY_THE_KIT:
                raise not_allowed(
                    k, "keys other than " + ", ".join(sorted(SET_BY_THE_KIT)), "the kit sets it per shard", at=(k,)
                )
        return v

    def submitit_parameters(self) -> dict[str, Any]:
        """What :meth:`submitit.AutoExecutor.update_parameters` takes for every shard."""
        out: dict[str, Any] = {
            "timeout_min": self.time_limit_min,
            "cpus_per_task": self.cpus_per_task,
            "slurm_additional_parameters": {k.replace("-", "_"): v for k, v in self.sbatch.items()},
        }
        if self.partition:
            out["slurm_partition"] = self.partition
        if self.account:
            out["slurm_account"] = self.account
        if self.mem_gb:
            out["mem_gb"] = self.mem_gb
        return out


def parse_sbatch(options: list[str] | None) -> tuple[dict[str, str], list[ParamsError]]:
    """``--sbatch KEY=VALUE`` arguments as a mapping, every malformed one as a problem."""
    out, problems = {}, []
    for opt in options or []:
        key, sep, value = opt.partition("=")
        if not sep or not key.strip():
            problems.append(ParamsError(None, "--sbatch", opt, "KEY=VALUE (e.g. qos=high)"))
            continue
        out[key.strip().lstrip("-")] = value
    return out, problems


def load_cluster(file: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> ClusterSpec:
    """The ``cluster:`` block of ``file`` with ``overrides`` (command-line values) on top.

    Raises one :class:`ParamsProblems` listing every problem (the file's and the command line's).
    """
    overrides = dict(overrides or {})
    problems: list[ParamsError] = overrides.pop("_problems", [])
    block = load_yaml(file).get("cluster") or {}
    if not isinstance(block, dict):
        problems.append(ParamsError(file, "cluster", block, "a mapping of " + ", ".join(ClusterSpec.model_fields)))
        block = {}
    merged = {**block, **{k: v for k, v in overrides.items() if v is not None and k != "sbatch"}}
    merged["sbatch"] = {**(block.get("sbatch") or {}), **(overrides.get("sbatch") or {})}
    spec, found = validate_all(ClusterSpec, merged, file, "cluster.")
    problems += found
    if problems or spec is None:
        raise ParamsProblems(problems, f"cluster settings ({file} and the command line)")
    return spec
