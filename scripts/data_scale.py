"""Tokenizing a large local corpus through ``grow train``: peak memory, throughput, second start.

Usage: ``python scripts/data_scale.py [--mb 300] [--workdir DIR] [--num-proc N] [--out result.json]``.

1. Writes a jsonl corpus of ``--mb`` MB of synthetic text (documents of 50 to 2,000 words drawn from
   a Zipfian lexicon of 30,000 made-up words with sentence punctuation; many documents, like a web
   corpus) unless it is there already.
2. Runs ``grow train data=hf data.path=<corpus>`` on the tiny model for a few steps, with a fresh
   token cache, sampling every 0.1 s the memory of the whole process tree (the trainer and its
   tokenizer workers): the peak RSS of the trainer process, the peak of the summed RSS of the tree
   (counts pages the forked workers share with the trainer once per process: an upper bound) and
   the peak of the summed PSS (shared pages split between the processes: the real footprint).
   The tokenization rate is the one the trainer prints (MB of UTF-8 text per second).
3. Runs the same command again (the cache in place) and measures the time from the start of the
   process to its first training step (the first ``train/loss`` record of metrics.jsonl, written
   at step 1 with ``trainer.log_every=1``).

Prints one JSON object (also written to ``--out``). tests/test_data_scale.py (marked slow) runs it
on 300 MB and checks the memory bound; docs/data.md reports the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

LEXICON, SEED = 30_000, 0
STEP_ARGS = ["model=tiny", "trainer.max_tokens=2000", "trainer.batch_size=8", "trainer.log_every=1",
             "trainer.eval_batches=1", "trainer.eval_batch_size=8", "trainer.eval_every=0", "trainer.evals_per_stage=1", "trainer.progress=false"]


def lexicon(rng) -> tuple[np.ndarray, np.ndarray]:
    """(words, Zipf probabilities): made-up words of English-like letter frequencies and lengths."""
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0,
                     1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07])
    lengths = np.clip(rng.poisson(4.5, LEXICON), 1, 14)
    chars = rng.choice(letters, size=int(lengths.sum()), p=freq / freq.sum())
    cuts = np.cumsum(lengths)[:-1]
    words = np.array(["".join(w) for w in np.split(chars, cuts)], dtype=object)
    p = 1.0 / np.arange(1, LEXICON + 1) ** 1.07
    return words, p / p.sum()


def write_corpus(path: Path, mb: int) -> None:
    """``mb`` MB of jsonl documents (see the module docstring); deterministic."""
    rng = np.random.default_rng(SEED)
    words, p = lexicon(rng)
    variants = np.stack([words, words + ".", words + ",", words + ".\n\n"])
    tmp = path.with_suffix(".tmp")
    written, doc = 0, 0
    with open(tmp, "w") as f:
        while written < mb * 1e6:
            ids = rng.choice(LEXICON, size=2_000_000, p=p)
            kind = rng.choice(4, size=len(ids), p=[0.86, 0.08, 0.055, 0.005])
            tokens = variants[kind, ids]
            ends = np.cumsum(rng.integers(50, 2000, size=len(ids) // 50))
            ends = ends[ends < len(ids)]
            for a, b in zip(np.concatenate([[0], ends[:-1]]), ends):
                text = " ".join(tokens[a:b])
                line = json.dumps({"id": doc, "text": text[0].upper() + text[1:]}) + "\n"
                f.write(line)
                written += len(line)
                doc += 1
                if written >= mb * 1e6:
                    break
    tmp.rename(path)


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                todo.extend(int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split())
        except OSError:
            pass
    return out


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB (0, 0 when it is gone)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
        return int(fields["Rss"].split()[0]), int(fields["Pss"].split()[0])
    except (OSError, KeyError, ValueError):
        return 0, 0


def run(cmd: list[str], env: dict, metrics: Path | None = None) -> dict:
    """Run ``cmd``, sampling memory; the time of the first train/loss record in ``metrics``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"main_rss_mb": 0.0, "tree_rss_mb": 0.0, "tree_pss_mb": 0.0}
    first_step = None
    while proc.poll() is None:
        mems = [memory_kb(p) for p in tree(proc.pid)]
        peak["main_rss_mb"] = max(peak["main_rss_mb"], mems[0][0] / 1024)
        peak["tree_rss_mb"] = max(peak["tree_rss_mb"], sum(m[0] for m in mems) / 1024)
        peak["tree_pss_mb"] = max(peak["tree_pss_mb"], sum(m[1] for m in mems) / 1024)
        if first_step is None and metrics is not None and metrics.exists() and "train/loss" in metrics.read_text():
            first_step = time.perf_counter() - t0
        time.sleep(0.1)
    out = proc.stdout.read()
    return {"returncode": proc.returncode, "seconds": time.perf_counter() - t0, "first_step_s": first_step,
            "output": out, **peak}


def measure(mb: int, workdir: Path, num_proc: int | None = None) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / f"corpus-{mb}mb.jsonl"
    if not corpus.exists():
        t = time.perf_counter()
        write_corpus(corpus, mb)
        print(f"wrote {corpus} in {time.perf_counter() - t:.0f}s", file=sys.stderr)
    cache = workdir / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "GROW_CACHE_DIR": str(cache), "WANDB_MODE": "disabled", "HF_HOME": str(workdir / "hf"),
           "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "grow", "train", "data=hf", f"data.path={corpus}", *STEP_ARGS]
    if num_proc:
        args.append(f"data.num_proc={num_proc}")
    first = run([*args, f"hydra.run.dir={workdir / 'run1'}"], env)
    second = run([*args, f"hydra.run.dir={workdir / 'run2'}"], env, metrics=workdir / "run2" / "metrics.jsonl")
    for r in (first, second):
        if r["returncode"]:
            raise SystemExit(f"grow train failed:\n{r['output'][-3000:]}")
    rate = re.search(r"data: tokenized .*?: ([\d.]+) MB of text, (\S+) documents -> (\S+) train \+ (\S+) val "
                     r"tokens in ([\d.]+)s \(([\d.]+) MB/s\)", " ".join(first["output"].split()))  # unwrapped
    return {
        "corpus_mb": corpus.stat().st_size / 1e6, "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(), "num_proc": num_proc,
        "text_mb": float(rate.group(1)), "documents": rate.group(2), "train_tokens": rate.group(3),
        "tokenize_seconds": float(rate.group(5)), "tokenize_mb_per_s": float(rate.group(6)),
        "first_run": {k: v for k, v in first.items() if k != "output"},
        "second_run": {k: v for k, v in second.items() if k != "output"},
        "second_reused_the_cache": "data: reusing the token cache" in second["output"],
        "second_tokenized": "data: tokeniz" in second["output"] or "data: training" in second["output"],
        "log": [ln for ln in first["output"].splitlines() if ln.startswith("data:")],
        "second_log": [ln for ln in second["output"].splitlines() if ln.startswith("data:")],
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=300)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/grow-data-scale"))
    p.add_argument("--num-proc", type=int, default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    result = measure(args.mb, args.workdir, args.num_proc)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return result


if __name__ == "__main__":
    main()
