"""`grow sample`, `grow eval` and `grow report` on runs these tests train, and their pieces in-process."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_DATA, TINY_RUN, assert_one_line_error, grow_cli

TOKENS = "trainer.max_tokens=12000"  # the exp schedule's 4 stages


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A grow train run (zero, through the schedule), and two compare sweeps: A with the baseline and
    zero, B with random only (its baseline is A's)."""
    cwd = tmp_path_factory.mktemp("tools")
    run = cwd / "runs" / "zero_run"
    out = grow_cli("train", "+schedule=exp", "strategy=zero", *TINY_RUN, TOKENS, f"hydra.run.dir={run}", cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    for name, args in (("sweepA", ["strategy=zero"]), ("sweepB", ["strategy=random", "compare.baseline=false"])):
        out = grow_cli("compare", *args, *TINY_RUN, TOKENS, f"hydra.sweep.dir={cwd / name}", cwd=cwd)
        assert out.returncode == 0, out.stderr[-3000:]
    return cwd, run


# ---- grow sample ------------------------------------------------------------------------------------


def test_sample_continues_the_prompt_and_is_seeded(work):
    cwd, run = work
    args = ["sample", f"run={run}", "prompt=def f(x):", "max_new_tokens=30", "seed=3"]
    first, again = grow_cli(*args, cwd=cwd), grow_cli(*args, cwd=cwd)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.startswith("def f(x):") and len(first.stdout) > len("def f(x):\n")
    assert first.stdout == again.stdout  # the same seed, the same text
    assert "checkpoint ckpt-" in first.stderr and "stage 4" in first.stderr  # what was sampled, on stderr


def test_sample_from_an_arm_of_a_sweep_greedy_samples_agree(work):
    cwd, _ = work
    arm = cwd / "sweepA" / "zero-seed0"
    out = grow_cli("sample", f"run={arm}", "temperature=0", "num_samples=2", "max_new_tokens=12", cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("--- sample") == 2
    half = len(out.stdout) // 2  # two identical samples, each followed by a newline
    assert half > 1 and out.stdout[:half] == out.stdout[half:], out.stdout


@pytest.mark.parametrize("command", ["sample", "eval"])
def test_sample_and_eval_refuse_a_directory_that_is_not_a_run(work, command):
    cwd, _ = work
    out = grow_cli(command, f"run={cwd}", cwd=cwd)
    assert_one_line_error(out, "run=")
    assert "not a grow run directory" in out.stderr


def test_a_moved_run_samples_with_the_tokenizer_in_its_directory(work, tmp_path):
    import shutil


    cwd, run = work
    moved = tmp_path / "moved run"  # a copy elsewhere (a space in the name, too)
    shutil.copytree(run, moved)
    assert (moved / "tokenizer.json").is_file()  # the trainer copied it into the run
    out = grow_cli("sample", f"run={moved}", "max_new_tokens=5", cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"tokenizer {moved / 'tokenizer.json'}" in " ".join(out.stderr.split())


def test_a_run_without_its_tokenizer_copy_finds_the_one_in_its_token_cache(work, tmp_path):
    import os
    import shutil

    from grow.runs import read_config, tokenizer_path

    _, run = work
    bare = tmp_path / "bare"
    shutil.copytree(run, bare)
    (bare / "tokenizer.json").unlink()
    found = tokenizer_path(bare, read_config(bare))
    assert found.parent.parent == Path(os.environ["GROW_CACHE_DIR"]) and found.name == "tokenizer.json"
    assert found.read_bytes() == (run / "tokenizer.json").read_bytes()


def test_sample_refuses_an_unknown_checkpoint(work):
    cwd, run = work
    assert_one_line_error(grow_cli("sample", f"run={run}", "ckpt=ckpt-nope", cwd=cwd), "ckpt=")


def test_a_prompt_that_is_not_utf8_is_one_line(work):
    """Bytes a Latin-1 terminal sends (Python keeps them in argv as surrogates): one line, exit 2 (was a
    TypeError traceback from the tokenizer)."""
    cwd, run = work
    out = grow_cli("sample", f"run={run}", "prompt=caf\udce9 \udcff", "max_new_tokens=3", cwd=cwd)
    assert_one_line_error(out, "prompt=")
    assert "must be UTF-8 text" in out.stderr and "\\xe9" in out.stderr  # the bytes, as bytes


@pytest.mark.parametrize("command", ["sample", "eval"])
def test_a_checkpoint_of_another_run_is_refused_with_the_run_it_belongs_to(work, tmp_path, command):
    """run=A ckpt=<B's checkpoint> ran B's model with A's tokenizer, silently."""
    import shutil

    cwd, run = work
    other = tmp_path / "other"
    shutil.copytree(run, other)
    pt = sorted((other / "checkpoints").glob("ckpt-*.pt"))[-1]
    out = grow_cli(command, f"run={run}", f"ckpt={pt}", cwd=cwd)
    assert_one_line_error(out, "ckpt=")
    assert f"is a checkpoint of the run {other}, not of run={run}" in out.stderr
    assert f"give run={other} ckpt={pt.name}" in " ".join(out.stderr.split())
    own = run / "checkpoints" / pt.name  # the run's own checkpoint by its path: taken
    assert grow_cli("sample", f"run={run}", f"ckpt={own}", "max_new_tokens=2", cwd=cwd).returncode == 0


# ---- grow eval --------------------------------------------------------------------------------------


def test_eval_on_the_runs_own_data_is_one_json_line_and_agrees_with_training(work):
    cwd, run = work
    out = grow_cli("eval", f"run={run}", cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1
    res = json.loads(lines[0])
    summary = json.loads((run / "summary.json").read_text())
    assert res["data"] == "stdlib" and res["data_is_the_runs"] and res["stage"] == 4
    # the same split as the trainer's val/loss, other windows of it: close, not equal
    assert abs(res["loss"] - summary["final_val_loss"]) < 0.3, (res, summary["final_val_loss"])
    assert res["tokens"] == res["windows"] * res["seq_len"]
    assert res["bits_per_byte"] == pytest.approx(res["loss"] * res["tokens"] / math.log(2) / res["bytes"])
    assert 1.0 < res["bytes_per_token"] < 8.0
    assert "bits per byte" in out.stderr  # the table


def test_eval_knows_the_runs_data_given_again(work):
    """Before: `grow eval data=stdlib` on a stdlib run said data_is_the_runs: false."""
    cwd, run = work
    same = grow_cli("eval", f"run={run}", "data=stdlib", *TINY_DATA, "max_tokens=256", cwd=cwd)
    other = grow_cli("eval", f"run={run}", "data=stdlib", *TINY_DATA, "data.max_bytes=300000", "max_tokens=256",
                     cwd=cwd)
    assert same.returncode == 0 and other.returncode == 0, (same.stderr[-2000:], other.stderr[-2000:])
    assert json.loads(same.stdout)["data_is_the_runs"] and not json.loads(other.stdout)["data_is_the_runs"]
    assert "fixed random windows" in same.stderr  # why final_val_loss differs from this loss


def test_eval_on_other_text_uses_the_runs_tokenizer(work, tmp_path):
    cwd, run = work
    text = tmp_path / "notes.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)
    out = grow_cli("eval", f"run={run}", "data=text", f"data.files=[{text}]", "max_tokens=256", cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["data"] == "text" and not res["data_is_the_runs"] and res["tokens"] == 256
    assert res["tokenizer"].endswith("tokenizer.json")
    assert_one_line_error(grow_cli("eval", f"run={run}", "data=text", cwd=cwd), "data.files")


def test_eval_pieces_uniform_model_gives_ln_v_and_bytes_are_the_decoded_text():
    import numpy as np

    from grow.checkpoint_eval import cross_entropy_sum, text_bytes, windows
    from grow.data import EOT, train_bpe
    from grow.model import Transformer, TransformerConfig

    docs = ["alpha beta gamma delta " * 30, "ünïcödé bytes count twice " * 30]
    tok = train_bpe(docs, 300)
    ids = np.array([i for d in docs for i in tok.encode(d).ids + [tok.token_to_id(EOT)]])
    x, y = windows(ids, 8, max_tokens=40)
    assert x.shape == y.shape == (5, 8) and torch.equal(x.flatten()[1:], y.flatten()[:-1])
    assert windows(ids, 8)[0].shape[0] == (len(ids) - 1) // 8
    cfg = TransformerConfig(vocab_size=300, seq_len=8, n_layers=1, d_model=8, n_heads=1, d_qk=8, d_v=8, d_ff=8)
    model = Transformer(cfg)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # uniform predictions: log V nats per token
    assert cross_entropy_sum(model, x, y, 2, "cpu") / y.numel() == pytest.approx(math.log(300), rel=1e-6)
    text = tok.decode(y.flatten().tolist(), skip_special_tokens=True)
    assert text_bytes(tok, y) == len(text.encode("utf-8")) and text in (docs[0] + docs[1])
    assert tok.token_to_id(EOT) is not None


# ---- generation -------------------------------------------------------------------------------------


def test_generate_respects_top_k_the_vocabulary_and_the_stop_token():
    from grow.model import Transformer, TransformerConfig
    from grow.sampling import Decoding, generate

    cfg = TransformerConfig(vocab_size=50, seq_len=6, n_layers=1, d_model=8, n_heads=1, d_qk=8, d_v=8, d_ff=8)
    model = Transformer(cfg, generator=torch.Generator().manual_seed(0)).eval()
    idx = torch.tensor([[1, 2, 3]])
    greedy = generate(model, idx, 10, Decoding(temperature=0))
    top1 = generate(model, idx, 10, Decoding(top_k=1), generator=torch.Generator().manual_seed(5))
    assert torch.equal(greedy, top1) and greedy.shape == (1, 13)  # longer than seq_len: the context is cropped
    out = generate(model, idx.repeat(4, 1), 20, Decoding(vocab=7), generator=torch.Generator().manual_seed(1))
    assert int(out[:, 3:].max()) < 7
    stop = int(greedy[0, 3])  # the first greedy token: generation stops at once
    assert generate(model, idx, 10, Decoding(temperature=0, stop=stop)).shape == (1, 4)


@pytest.mark.parametrize("value", ["it's", "a\\", "${x} y", "def f(x):\n  return [1,2]", "x=1,2", "\\${x}", ""])
def test_free_text_values_are_taken_as_typed(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from grow.commands import quote_values

    (arg,) = quote_values([f"prompt={value}"], keys=("prompt",))
    parsed = OverridesParser.create().parse_overrides([arg])[0]
    assert OmegaConf.create({"p": parsed.value()}).p == value
    (runs,) = quote_values(["runs=a/b=1,c/d"], lists=("runs",))
    assert OverridesParser.create().parse_overrides([runs])[0].value() == ["a/b=1", "c/d"]


# ---- grow report ------------------------------------------------------------------------------------


def _headers(md: str) -> str:
    return next(line for line in md.splitlines() if line.startswith("| arm | seeds |"))


def test_report_over_two_sweeps_and_a_run_has_the_columns_of_compare(work):
    cwd, run = work
    out_dir = cwd / "report"
    out = grow_cli("report", f"runs=[{cwd / 'sweepA'},{cwd / 'sweepB'},{run}]", f"out={out_dir}", cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    single = grow_cli("compare", f"report={cwd / 'sweepA'}", cwd=cwd)
    assert single.returncode == 0, single.stderr[-3000:]
    mixed = json.loads((out_dir / "summary.json").read_text())
    one = json.loads((cwd / "sweepA" / "summary.json").read_text())
    assert mixed["columns"] == one["columns"]
    assert _headers((out_dir / "report.md").read_text()) == _headers((cwd / "sweepA" / "report.md").read_text())
    for a in mixed["arms"]:
        assert set(a) == set(one["arms"][0]), a["arm"]
    arms = {a["arm"]: a for a in mixed["arms"]}
    # the run of grow train and the arm of sweep A are both "zero" seed 0: told apart by where they are from
    assert set(arms) == {"baseline", "zero [sweepA]", "random", "zero [zero_run]"}, set(arms)
    # sweep B has no baseline: random is measured against sweep A's (same final model and tokens)
    assert arms["random"]["baseline_arm"] == "baseline" and arms["random"]["flops_pct_baseline"]["mean"] < 100
    assert arms["zero [zero_run]"]["flops_pct_baseline"]["mean"] == pytest.approx(
        arms["zero [sweepA]"]["flops_pct_baseline"]["mean"])
    assert len(mixed["sources"]) == 3 and mixed["title"].startswith("zero, random vs the baseline")
    md = (out_dir / "report.md").read_text()
    assert "grow compare strategy=random compare.baseline=false" in md and "grow train +schedule=exp" in md
    assert "| 1 | 1 |" in md and "## Growths" in md and "| 1 → 2 |" in md  # stage plan and growths from 1
    for name in ("loss_vs_flops.png", "loss_vs_time.png"):
        assert (out_dir / name).stat().st_size > 0
    assert not (run / "report.md").exists()  # nothing written into the runs


def test_report_names_every_final_size_and_draws_no_baseline_it_lacks(work, tmp_path, monkeypatch):
    """Before: a report over runs of different sizes named one "Final model", and the plot of a sweep with
    no baseline had a "baseline final loss" legend entry for a line it did not draw."""
    import shutil

    from matplotlib.figure import Figure

    from grow.report import build_report

    cwd, run = work
    other = tmp_path / "wider_run"
    shutil.copytree(run, other)
    summary = json.loads((other / "summary.json").read_text())
    summary["final_config"]["d_model"] *= 2
    (other / "summary.json").write_text(json.dumps(summary))
    labels = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: labels.append(fig.axes[0].get_legend_handles_labels()[1])
                        if Path(path).name.startswith("loss_vs_") else None)  # the loss plots' legends
    build_report([run, other], tmp_path / "mixed", show=False)
    text = (tmp_path / "mixed" / "report.md").read_text()
    assert "Final models (2 sizes)" in text and "Final models of 2 sizes" in text
    build_report([cwd / "sweepB"], tmp_path / "nobase", show=False)
    assert labels[-1] and "baseline final loss" not in labels[-1] and "growth (loss after)" in labels[-1]
    build_report([cwd / "sweepA"], tmp_path / "base", show=False)
    assert "baseline final loss" in labels[-1]


def test_report_refuses_a_directory_that_is_not_a_run(work, tmp_path):
    cwd, run = work
    assert_one_line_error(grow_cli("report", f"runs=[{tmp_path}]", cwd=cwd), "runs=")
    assert_one_line_error(grow_cli("report", f"runs=[{run}]", f"out={run}", cwd=cwd), "out=")
    assert_one_line_error(grow_cli("compare", f"report={run}", cwd=cwd), "report=")  # not over a run's summary


def test_report_notes_the_load_and_the_recovery_steps(tmp_path):
    from grow.report import build_report

    def fake_run(name, kind, strategy, loss, seconds, load, steps):
        d = tmp_path / "sweep" / f"{name}-seed0"
        d.mkdir(parents=True)
        arm = {"arm": name, "kind": kind, "strategy": strategy, "seed": 0, "setting": {}, "baseline_arm": "baseline",
               "job": 0 if kind == "baseline" else 1, "plan_flops": 100.0}
        events = [] if kind == "baseline" else [
            {"growth/stage": 2, "growth/loss_before": 5.0, "growth/loss_after": 5.1, "growth/delta": 0.1,
             "growth/recovery": -0.2, "growth/recovery_steps": steps, "svd/gamma_rel": 0.8,
             "svd/gamma_rel/grid_lo": 0.0125, "svd/gamma_rel/grid_hi": 0.8}]
        summary = {"complete": True, "final_val_loss": loss, "tokens": 1000, "flops": 100.0, "train_flops": 100.0,
                   "growth_flops": 0.0, "train_seconds": seconds, "compile_seconds": 0.0, "wall_seconds": seconds,
                   "params": 10, "final_config": {"n_layers": 1, "d_model": 2, "n_heads": 1, "d_qk": 2, "d_v": 2,
                                                  "d_ff": 4, "seq_len": 4, "vocab_size": 8},
                   "growth_events": events, "load_average": load, "stage_plan": []}
        (d / "arm.json").write_text(json.dumps(arm))
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "metrics.jsonl").write_text(json.dumps({"val/loss": loss, "train/flops": 100.0}) + "\n")

    fake_run("baseline", "baseline", None, 4.0, 2.0, [3.5, 4.5], 0)
    fake_run("svd", "grown", "svd", 4.2, 3.0, [1.0, 2.0], 7)
    summary = build_report([tmp_path / "sweep"], tmp_path / "sweep", show=False)
    md = (tmp_path / "sweep" / "report.md").read_text()
    assert "load average was between 1.0 and 4.5" in md and "3.5 → 4.5" in md
    svd = next(a for a in summary["arms"] if a["arm"] == "svd")
    assert svd["recovery_steps"]["mean"] == 7 and "-0.2000 (@7 steps)" in md
    assert "svd/gamma_rel=0.8 is the top of its grid" in md  # the growths table notes the edge


def test_make_help_writes_colour_codes_only_to_a_terminal():
    """Before: escape codes in `make help | less` and in files."""
    import subprocess

    from tests.conftest import ROOT

    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "\033" not in out and "  help " in out
    tty = subprocess.run(["script", "-qc", "make -s help", "/dev/null"], cwd=ROOT, capture_output=True, text=True)
    if tty.returncode == 0:  # util-linux's script gives make a terminal
        assert "\033[36mhelp" in tty.stdout
