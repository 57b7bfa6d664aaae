"""DDP plumbing: SLURM -> torchrun variable mapping, collectives on gloo, a failing rank, the SLURM launcher config."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from medseg.errors import ConfigError
from medseg.runtime import distributed
from medseg.runtime.distributed import any_rank, broadcast_object, gather_objects, on_main_rank, reduce_max
from medseg.runtime.launch import (
    SINGLE_PROCESS,
    DistInfo,
    distributed_environment,
    hydra_rank_overrides,
    slurm_environment,
)
from tests.helpers.configs import compose_config
from tests.helpers.ports import TORCHRUN_STANDALONE, agent_store

SRUN_TASK = {  # what srun sets for task 3 of a 2-node x 2-task step of job 123456
    "SLURM_JOB_ID": "123456", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu-a[07-08]", "SLURM_STEP_NODELIST": "gpu-a[07-08]",
}
RANK_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    """``environ(vars)``: this process's environment without any rank or SLURM variable, plus ``vars``."""
    for key in [*RANK_KEYS, "SUBMITIT_EXECUTOR", *(k for k in os.environ if k.startswith("SLURM_"))]:
        monkeypatch.delenv(key, raising=False)

    def set_vars(variables: dict[str, str]) -> None:
        for key, value in variables.items():
            monkeypatch.setenv(key, value)

    return set_vars


def test_srun_task_maps_to_torchrun_variables(environ: Callable[[dict[str, str]], None]) -> None:
    pytest.importorskip("submitit")
    environ(SRUN_TASK)
    env = slurm_environment()
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu-a07"}
    assert 20000 <= int(env["MASTER_PORT"]) <= 60000
    environ({"SLURM_PROCID": "0", "SLURM_LOCALID": "0"})  # every task of the job derives the same master
    other = slurm_environment()
    assert (other["MASTER_ADDR"], other["MASTER_PORT"]) == (env["MASTER_ADDR"], env["MASTER_PORT"])


def test_slurm_keeps_a_chosen_master(environ: Callable[[dict[str, str]], None]) -> None:
    pytest.importorskip("submitit")
    environ({**SRUN_TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})
    env = slurm_environment()
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29400")


@pytest.mark.parametrize("variables", [
    {},  # no SLURM
    {k: v for k, v in SRUN_TASK.items() if not k.startswith("SLURM_STEP")},  # a batch script / salloc shell
    {**SRUN_TASK, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"},  # one task
])
def test_not_distributed_outside_a_multi_task_srun_step(variables: dict[str, str],
                                                         environ: Callable[[dict[str, str]], None]) -> None:
    environ(variables)
    assert slurm_environment() == {}
    assert distributed_environment() == SINGLE_PROCESS


def test_torchrun_variables_win_and_slurm_ones_are_exported(environ: Callable[[dict[str, str]], None]) -> None:
    pytest.importorskip("submitit")
    environ({**SRUN_TASK, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert distributed_environment() == DistInfo(rank=1, world_size=2, local_rank=1)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key)
    assert distributed_environment() == DistInfo(rank=3, world_size=4, local_rank=1)
    assert os.environ["RANK"] == "3" and os.environ["MASTER_ADDR"] == "gpu-a07"  # what init_process_group reads


def test_hydra_overrides_only_for_other_ranks(environ: Callable[[dict[str, str]], None]) -> None:
    environ({})
    assert hydra_rank_overrides() == []
    environ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert "hydra.output_subdir=null" in hydra_rank_overrides()


def test_local_device_follows_local_rank() -> None:
    info = DistInfo(rank=3, world_size=4, local_rank=1)
    assert distributed.local_device(torch.device("cpu"), info) == torch.device("cpu")
    if torch.cuda.is_available():
        assert distributed.local_device(torch.device("cuda"), info).index == 1 % torch.cuda.device_count()


def _fails(error: Exception) -> Callable[[], None]:
    def fail() -> None:
        raise error

    return fail


def _error_on_every_rank(fn: Callable[[], object], info: DistInfo) -> str:
    try:
        on_main_rank(fn, info)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def _collectives(rank: int, world_size: int, store_env: dict[str, str], results: dict) -> None:
    os.environ.update(store_env, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    cpu = torch.device("cpu")
    with distributed.process_group(cpu) as (info, device):
        results[rank] = {
            "any": any_rank(rank == 1, info, device),
            "none": any_rank(False, info, device),
            "max": reduce_max(float(10 * rank + 1), info, device),
            "gather": gather_objects({"rank": rank}, info),
            "broadcast": broadcast_object(f"from {rank}", info),
            "main": on_main_rank(lambda: f"made by {rank}", info),
            "medseg_error": _error_on_every_rank(_fails(ConfigError("data.root=x: folder not found")), info),
            "bug": _error_on_every_rank(_fails(KeyError("spacing")), info),
        }


def test_collectives_on_two_gloo_ranks() -> None:
    with mp.Manager() as manager, agent_store() as store_env:
        results = manager.dict()
        mp.spawn(_collectives, args=(2, store_env, results), nprocs=2, join=True)
        results = dict(results)
    for rank in (0, 1):
        assert results[rank] == {
            "any": True, "none": False, "max": 11.0, "gather": [{"rank": 0}, {"rank": 1}], "broadcast": "from 0",
            "main": "made by 0", "medseg_error": "ConfigError: data.root=x: folder not found",
            # a bug keeps its own type (and traceback) on rank 0; the other ranks stop with a named error
            "bug": "KeyError: 'spacing'" if rank == 0 else "TrainingError: rank 0 failed: KeyError: 'spacing'",
        }


FAILING_RANK = textwrap.dedent("""
    import torch
    from medseg.runtime.distributed import any_rank, process_group

    with process_group(torch.device("cpu")) as (info, device):
        if info.rank == 1:
            raise RuntimeError("rank 1 fails")
        any_rank(False, info, device)  # rank 0 waits here for a rank that is gone
""")


def test_a_failing_rank_does_not_hang_the_others(tmp_path: Path) -> None:
    script = tmp_path / "failing_rank.py"
    script.write_text(FAILING_RANK)
    result = subprocess.run(  # a hang would be TimeoutExpired
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", TORCHRUN_STANDALONE,
         str(script)], capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0
    assert "rank 1 fails" in result.stdout + result.stderr


def test_slurm_launcher_config_composes() -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra.utils import instantiate

    cfg = compose_config(["hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "hydra.launcher.gpus_per_node=2",
                          "hydra.launcher.partition=gpu"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.partition) == (2, 2, "gpu")
    for key in ("timeout_min", "cpus_per_task", "mem_gb", "nodes", "name", "setup"):
        assert launcher[key] is not None, key
    params = instantiate(launcher).params  # what submitit's executor receives, interpolations resolved
    assert params["tasks_per_node"] == 2 and params["name"].startswith("medseg")
    assert any("SLURM_KILL_BAD_EXIT=1" in line for line in params["setup"])
    # the task config is unchanged by the launcher choice
    assert compose_config(["hydra/launcher=slurm"]).model.bottleneck == compose_config().model.bottleneck
