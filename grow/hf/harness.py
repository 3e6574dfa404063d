"""``grow eval harness=<task,...>``: EleutherAI's lm-evaluation-harness on a run's checkpoint (docs/hf.md).

The checkpoint is exported (`grow.hf.export.write_model`: a ``LlamaForCausalLM``, or a ``GrowForCausalLM``
with its modeling file) into a temporary directory, and ``lm_eval.simple_evaluate`` runs its ``hf`` model
on it, on the CPU or the GPU the command names, batch size 1, in float32. Tasks come from the harness's
own index (``harness=hellaswag,arc_easy``: their datasets download from the Hugging Face hub, where it is
reachable) or, with ``harness_include=<dir>``, from a directory of task YAMLs only (local data files
work without a network). ``harness_limit=N`` evaluates the first N documents of each task. The results
(lm-eval's ``results`` and, per document, the arguments and log-likelihoods it computed) go to
``<run>/harness/<tasks>-step<N>.json``, and a table to stderr.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from grow import hub, runs
from grow.console import err_console
from grow.errors import ConfigError
from grow.hf.export import write_model

# what the harness needs of the hf extra (accelerate: lm-eval's hf model imports it), `grow.hf.require`
HARNESS_MODULES = ("lm_eval", "accelerate", "transformers")


def run_harness(cfg) -> dict:
    """lm-evaluation-harness on the checkpoint ``cfg.run`` / ``cfg.ckpt`` names (an `grow.checkpoint_eval.EvalConfig`
    with ``harness``); the results, also written into the run directory."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    include = None if cfg.harness_include is None else str(cfg.harness_include)
    if include is None:  # the index's tasks download their datasets from the Hub (asked first: indexing takes ~10 s)
        check_hub(cfg.harness)
    tasks = TaskManager(include_path=include, include_defaults=include is None, verbosity="ERROR")
    unknown = [t for t in cfg.harness if t not in tasks.all_tasks]
    if unknown:  # before the checkpoint is read
        where = f"in {include}" if include else "in lm-evaluation-harness's index"
        raise ConfigError("harness", unknown[0], f"no such task {where}")
    run_dir, meta = runs.checkpoint_of(cfg)
    loaded = runs.load_model(meta, "cpu")
    device = "cuda" if str(cfg.device).startswith("cuda") else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        out = write_model(run_dir, meta, loaded, Path(tmp) / "model")
        r = simple_evaluate(model="hf", model_args={"pretrained": str(out), "dtype": "float32", "trust_remote_code": True},
                            tasks=list(cfg.harness), task_manager=tasks, device=device, batch_size=1,
                            limit=cfg.harness_limit, log_samples=True, verbosity="ERROR")
    result = {"run": str(run_dir), "checkpoint": meta["file"], "step": int(meta["step"]), "tasks": list(cfg.harness),
              "limit": cfg.harness_limit, "results": r["results"],
              "samples": {task: [{k: s[k] for k in ("doc_id", "arguments", "resps", "target") if k in s}
                                 for s in samples] for task, samples in r.get("samples", {}).items()}}
    path = run_dir / "harness" / f"{'+'.join(cfg.harness)}-step{meta['step']}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    result["path"] = str(path)
    return result


def check_hub(tasks) -> None:
    """Tasks of lm-evaluation-harness's index where the Hub cannot be reached (`grow.hub`): one line at once,
    how to run a local task, instead of ~40 s of retries and a traceback."""
    problem = hub.unreachable()
    if problem:
        raise ConfigError("harness", ",".join(tasks), f"the index's tasks read their datasets from the Hub, and "
                                                      f"{problem}; run a local task with harness_include=<a directory "
                                                      f"of task YAMLs with local data files>, or {hub.HOW_TO_USE_THE_CACHE}")


def show_harness(result: dict) -> None:
    """One JSON line (the results, without the per-document samples) on stdout, a table on stderr."""
    from rich.markup import escape
    from rich.table import Table

    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, default=str), flush=True)
    t = Table(title=escape(f"lm-evaluation-harness: {result['checkpoint']} of {result['run']}"))
    for col in ("task", "metric", "value", "stderr"):
        t.add_column(col)
    for task, metrics in result["results"].items():
        for key, value in metrics.items():
            if "," in key and not key.split(",")[0].endswith("_stderr") and isinstance(value, (int, float)):
                name, filt = key.split(",", 1)
                err = metrics.get(f"{name}_stderr,{filt}")
                t.add_row(escape(task), escape(name), f"{value:.4f}", "" if not isinstance(err, (int, float)) else f"{err:.4f}")
    err_console.print(t)
    err_console.print(escape(f"written: {result['path']}"))

