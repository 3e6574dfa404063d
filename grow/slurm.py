"""What a SLURM job of `hydra/launcher=slurm` asks for (configs/hydra/launcher/slurm.yaml; docs/distributed.md).

The launcher's ``gpus_per_node`` is the resolver ``grow_slurm_gpus(device, partition,
tasks_per_node)``, registered with OmegaConf when `grow.run` imports this module, so that one command line
works on CPU and GPU partitions; `unavailable` says why no job can be submitted from here, which the
CLI checks before Hydra starts the launcher.
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


SINFO_TIMEOUT_S = 20  # a controller that does not answer in this time counts as unreachable


def unavailable() -> str | None:
    """Why SLURM jobs cannot be submitted from this machine (None when they can): submitit needs
    ``sbatch`` and ``srun`` on PATH, and ``sinfo`` must reach the controller."""
    missing = [c for c in ("sbatch", "srun", "sinfo") if shutil.which(c) is None]
    if missing:
        return f"no SLURM on this machine ({', '.join(missing)} not on PATH)"
    try:
        out = subprocess.run([shutil.which("sinfo"), "-h", "-o", "%P"], capture_output=True, text=True,
                             timeout=SINFO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the SLURM controller did not answer sinfo within {SINFO_TIMEOUT_S} s"
    except OSError as exc:
        return f"sinfo cannot run ({exc})"
    if out.returncode != 0:
        said = next((ln.strip() for ln in out.stderr.splitlines() if ln.strip()), f"exit status {out.returncode}")
        return f"sinfo cannot reach the SLURM controller ({said})"
    return None


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
