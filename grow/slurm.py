"""What a SLURM job of `hydra/launcher=slurm` asks for (configs/hydra/launcher/slurm.yaml).

The same command line must work on a CPU partition and on a GPU partition: asking a node without
GPUs for one makes ``sbatch`` fail (``Invalid generic resource (gres) specification``), and a GPU
node asked for none runs the job on its CPU. So the launcher's ``gpus_per_node`` is the resolver
``grow_slurm_gpus(device, partition, tasks_per_node)``:

- ``device=cpu``: 0;
- ``device=cuda`` or ``cuda:N``: one GPU per task;
- ``device=auto``: one GPU per task when the partition's nodes have GPUs, as ``sinfo`` reports their
  generic resources at submission (``sinfo -h -o %G [-p partition]``), else 0.

Registered with OmegaConf when `grow.config` is imported, before any command composes its config.
"""

from __future__ import annotations

import shutil
import subprocess

from omegaconf import OmegaConf


def partition_has_gpus(partition: str | None) -> bool:
    """True when ``sinfo`` lists a ``gpu`` generic resource on the partition (the default one if None)."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return False
    cmd = [sinfo, "-h", "-o", "%G"] + (["-p", str(partition)] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and any(g.startswith("gpu") for line in out.stdout.split() for g in line.split(","))


def gpus_per_node(device, partition, tasks_per_node) -> int:
    """GPUs a job asks for per node (module docstring)."""
    tasks = int(tasks_per_node or 1)
    device = str(device)
    if device == "cpu":
        return 0
    if device.startswith("cuda"):
        return tasks
    return tasks if partition_has_gpus(None if partition in (None, "None", "null") else partition) else 0


OmegaConf.register_new_resolver("grow_slurm_gpus", gpus_per_node, replace=True)
