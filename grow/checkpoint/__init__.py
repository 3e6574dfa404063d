"""Checkpoints, resume, stop requests and non-finite steps (docs/distributed.md).

A package, one job per module:

- `grow.checkpoint.files`: the files (format, atomic writes, manifests, verification, loading, pruning, RNG);
- `grow.checkpoint.resume`: which run a resume continues, its command line, what it may change;
- `grow.checkpoint.control`: when checkpoints are written, stop requests, exit statuses;
- `grow.checkpoint.rundir`: one run per directory, the lock a live run holds.

The package re-exports their public names: ``checkpoint.latest``, ``checkpoint.run_lock``, ...
"""

from grow.checkpoint.control import (
                                     EXIT_CODES,
                                     NONFINITE_EXIT,
                                     Checkpointer,
                                     Interrupted,
                                     RunControl,
                                     StopNow,
                                     StopRequest,
                                     run_outcomes,
)
from grow.checkpoint.files import (
                                     FORMAT,
                                     PHASES,
                                     PLAIN,
                                     SUBDIR,
                                     CheckpointError,
                                     atomic_write,
                                     check_plain,
                                     checkpoint_dir,
                                     latest,
                                     latest_complete,
                                     list_checkpoints,
                                     load,
                                     load_file,
                                     prune,
                                     read_manifest,
                                     rng_state,
                                     set_rng_state,
                                     verify,
                                     write,
)
from grow.checkpoint.resume import (
                                     IGNORED_DIFFS,
                                     RESUME_ACCEPTS,
                                     Resume,
                                     check_compatible,
                                     complete_message,
                                     config_differences,
                                     finished,
                                     open_resume,
                                     resolve_resume,
                                     resume_arg,
                                     saved_overrides,
                                     task_overrides,
                                     truncate_metrics,
)
from grow.checkpoint.rundir import (
                                     LOCK,
                                     check_run_dir,
                                     exclusive,
                                     holder,
                                     run_dir_problem,
                                     run_files,
                                     run_lock,
)
from grow.errors import NonFiniteLoss

__all__ = ["CheckpointError", "Checkpointer", "EXIT_CODES", "FORMAT", "IGNORED_DIFFS", "Interrupted", "LOCK",
           "NONFINITE_EXIT", "NonFiniteLoss", "PHASES", "PLAIN", "RESUME_ACCEPTS", "Resume", "RunControl", "SUBDIR",
           "StopNow", "StopRequest", "atomic_write", "check_compatible", "check_plain",
           "check_run_dir", "checkpoint_dir", "complete_message", "config_differences", "exclusive", "finished",
           "holder", "latest", "latest_complete", "list_checkpoints", "load", "load_file",
           "open_resume", "prune", "read_manifest", "resolve_resume", "resume_arg", "rng_state", "run_dir_problem", "run_files", "run_lock",
           "run_outcomes", "saved_overrides", "set_rng_state", "task_overrides", "truncate_metrics", "verify",
           "write"]
