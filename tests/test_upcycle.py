"""Growing into a mixture of experts (`grow.growth.experts`, the ``upcycle`` strategy; docs/model.md, "Experts"): dense ->
experts preserves the logits in float64 for both families, X -> 2X preserves them exactly when top_k doubles
(and not when it stays), the copied experts' optimizer state is copied or fresh entry by entry, the plan routes a
dense stage to one expert, and a run upcycles through the CLI with the loss unchanged at the growth."""

from __future__ import annotations

import json

import pytest
import torch

from grow.growth import grow
from grow.growth.base import get_strategy
from grow.model import Transformer, TransformerConfig
from grow.optim import GrowthAwareAdamW
from grow.plan import build_plan
from tests import helpers
from tests.conftest import TINY_RUN, grow_cli
from tests.helpers import MOE_GPT as GPT
from tests.helpers import MOE_LLAMA as LLAMA

F64 = torch.float64
FAMILIES = pytest.mark.parametrize("cfg", [LLAMA, GPT], ids=["llama", "gpt"])


def random_like(cfg: TransformerConfig, seed: int = 0) -> Transformer:
    """Every parameter random and non-zero (experts differ from each other), routers sharp; in eval mode."""
    return helpers.random_like(cfg, seed).eval()


def rel_delta(a: Transformer, b: Transformer, cfg: TransformerConfig) -> float:
    x = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    b.eval()
    with torch.no_grad():
        ya, yb = a(x), b(x)
    return float((ya - yb).abs().max() / ya.abs().max())


def dense(cfg: TransformerConfig) -> TransformerConfig:
    return cfg.replace(n_experts=1, top_k=1)


@FAMILIES
@pytest.mark.parametrize("router", ["init", "zero"])
def test_upcycling_a_dense_model_preserves_its_logits(cfg, router):
    model = random_like(dense(cfg))
    res = grow(model, cfg, "upcycle", generator=torch.Generator().manual_seed(0), stage=1, router=router)
    assert res.model.config == cfg and rel_delta(model, res.model, cfg) <= 1e-10
    grown = dict(res.model.named_parameters())
    for name, p in model.named_parameters():  # the dense MLP is expert 0; every other expert a copy of it
        new, idx = res.param_map[name]
        assert torch.equal(grown[new].view(-1)[idx], p)
        if ".mlp." in name:
            assert new == name.replace(".mlp.", ".mlp.experts.0.")
            for j in range(cfg.n_experts):
                assert torch.equal(grown[new.replace(".experts.0.", f".experts.{j}.")], p)
    router_w = grown["layers.0.mlp.router.weight"]
    assert router_w.shape == (cfg.n_experts, cfg.d_model) and (router_w.abs().sum() == 0) == (router == "zero")


@FAMILIES
def test_a_dense_growth_then_upcycling_in_one_growth_preserves_the_logits(cfg):
    """X grows last (`ORDER`): p and h grow in the dense model (zero's rules), then it becomes experts."""
    model = random_like(dense(cfg).replace(d_ff=16, d_model=12))
    res = grow(model, cfg, "upcycle", generator=torch.Generator().manual_seed(0), stage=1)
    assert res.model.config == cfg and rel_delta(model, res.model, cfg) <= 1e-10


@FAMILIES
def test_doubling_the_experts_preserves_the_logits_exactly_when_top_k_doubles(cfg):
    model = random_like(cfg, seed=3)
    doubled = grow(model, cfg.replace(n_experts=2 * cfg.n_experts, top_k=2 * cfg.top_k), "upcycle", stage=2)
    assert rel_delta(model, doubled.model, cfg) <= 1e-10
    fixed_k = grow(model, cfg.replace(n_experts=2 * cfg.n_experts), "upcycle", stage=2)
    assert rel_delta(model, fixed_k.model, cfg) > 1e-2  # the copies tie with their sources and crowd them out
    grown = dict(doubled.model.named_parameters())
    for j in range(cfg.n_experts, 2 * cfg.n_experts):  # expert j and router row j copy expert j - X
        src = j - cfg.n_experts
        assert torch.equal(grown[f"layers.1.mlp.experts.{j}.fc2.weight"], grown[f"layers.1.mlp.experts.{src}.fc2.weight"])
        assert torch.equal(grown["layers.1.mlp.router.weight"][j], grown["layers.1.mlp.router.weight"][src])


@FAMILIES
def test_doubling_the_experts_with_top_1_kept_is_exact_the_source_winning_its_tie(cfg):
    """At k = 1 the renormalized top-1 weight is 1 and a copy ties with its source (the lower index wins), so the
    token's expert computes what its source did: the +experiment=moe-upcycle arm (d), 4 -> 8 at top-1."""
    cfg = cfg.replace(top_k=1)
    model = random_like(cfg, seed=5)
    assert rel_delta(model, grow(model, cfg.replace(n_experts=2 * cfg.n_experts), "upcycle", stage=2).model, cfg) <= 1e-10


def test_a_report_s_stage_plan_shows_the_experts_where_a_plan_has_them():
    """The report's stage-plan table adds X, top_k and the active parameters to a plan with experts (bold where X
    grew), and keeps a dense plan's six letters (the published pages' tables unchanged)."""
    from grow.report.tables import _schedule_md

    def plan(xs):
        return {"arms": ["a"], "triggered": [], "stages": [
            {"stage": i, "config": {**GPT.__dict__, "n_experts": x, "top_k": 1}, "batch_size": 4, "steps": 10,
             "tokens": 640, "flops": 1e9, "params": 1000 * x, **({"active_params": 900} if x > 1 else {})}
            for i, x in enumerate(xs, start=1)]}

    moe = "\n".join(_schedule_md({"schedules": [plan([1, 8])]}))
    assert "| stage | N | h | E | k | v | p | X | top_k | params | active | batch |" in moe
    assert "| **8** | 1 | 8k | 900 |" in moe and "| 1 | 1 | 1k | 1k |" in moe and "X experts a layer" in moe
    dense = "\n".join(_schedule_md({"schedules": [plan([1, 1])]}))
    assert "| stage | N | h | E | k | v | p | params | batch |" in dense and "X experts" not in dense


@FAMILIES
def test_new_experts_that_start_unused_preserve_the_logits_with_top_k_fixed_then_ramp_in(cfg):
    """``new_experts=unused``: X -> 2X with top_k fixed (where plain duplication changes the function) and dense ->
    X keep the logits (float64, 1e-10); the masks ramp 0 -> 1 over ramp_steps steps, change the function once a
    new expert scores, survive a state dict (a checkpoint) and block a Mixtral export until they are gone."""
    from grow import masks as M
    from grow.hf.mixtral import to_mixtral_state

    model = random_like(cfg, seed=3)
    strategy = get_strategy("upcycle", new_experts="unused", ramp_steps=4)
    res = grow(model, cfg.replace(n_experts=2 * cfg.n_experts), strategy, stage=2)
    assert rel_delta(model, res.model, cfg) <= 1e-10 and res.metrics["upcycle/masked_experts"] == cfg.n_experts
    dense = random_like(dense_cfg := cfg.replace(n_experts=1, top_k=1))
    assert rel_delta(dense, grow(dense, cfg, strategy, stage=1, generator=torch.Generator().manual_seed(0)).model,
                     dense_cfg) <= 1e-10
    grown = res.model
    mask = grown.layers[0].mlp.mask_experts
    assert mask.tolist() == [1.0] * cfg.n_experts + [0.0] * cfg.n_experts
    copy = M.build_model(grown.config, grown.state_dict()).eval()  # what a resume rebuilds
    assert M.has_masks(copy) and rel_delta(grown, copy, cfg) == 0.0
    with pytest.raises(ValueError, match="growth masks"):
        to_mixtral_state(grown)
    assert strategy.after_step(grown, None, 1) is False and float(grown.layers[0].mlp.mask_experts[-1]) == 0.25
    assert rel_delta(model, grown, cfg) > 1e-6  # the copies now score, as p_e / 4
    changed = [strategy.after_step(grown, None, s) for s in (2, 3, 4)]
    assert changed == [False, False, True] and not M.has_masks(grown)
    assert type(grown.layers[0].mlp).__name__ == "MoE"


def test_every_strategy_upcycles_through_the_one_expansion_and_ligo_refuses():
    """The X expansion is every strategy's (zero's router rule unless the strategy has its own): dense -> experts
    keeps the logits under each (float64) but shrink_perturb, which shrinks every weight by design, and ligo, whose
    maps are of one MLP a layer, refuses before any work."""
    from grow.growth.base import available, strategy_class

    dense = random_like(dense_cfg := LLAMA.replace(n_experts=1, top_k=1))
    batch = [(torch.randint(0, 53, (2, 16), generator=torch.Generator().manual_seed(4)),) * 2]
    for name in available():
        if name == "ligo":
            with pytest.raises(ValueError, match="n_experts=4: must be 1"):
                get_strategy(name).check_transition(dense_cfg, LLAMA)
            continue
        res = grow(dense, LLAMA, name, stage=1, generator=torch.Generator().manual_seed(0), batch=batch)
        if strategy_class(name).exact_with is not None or name == "random":
            assert rel_delta(dense, res.model, LLAMA) <= 1e-10, name


def test_other_dimensions_of_a_mixture_are_refused():
    model = random_like(GPT)
    with pytest.raises(ValueError, match="cannot grow d_ff of a mixture of experts"):
        grow(model, GPT.replace(d_ff=32, n_experts=6), "upcycle", stage=1)


def trained_optimizer(model: Transformer) -> GrowthAwareAdamW:
    opt = GrowthAwareAdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    x = torch.randint(0, model.config.vocab_size, (2, model.config.seq_len), generator=torch.Generator().manual_seed(2))
    model.train()
    for _ in range(2):
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return opt


@pytest.mark.parametrize("moments", ["copy", "fresh"])
@pytest.mark.parametrize("source", ["dense", "experts"])
def test_the_copied_experts_optimizer_state_is_copied_or_fresh_entry_by_entry(moments, source):
    cfg = GPT if source == "experts" else dense(GPT)
    target = GPT if source == "dense" else GPT.replace(n_experts=6, top_k=4)
    model = random_like(cfg)
    opt = trained_optimizer(model)
    before = {n: {b: t.clone() for b, t in s.items()} for n, s in opt.state.items()}
    strategy = get_strategy("upcycle", moments=moments)
    res = grow(model, target, strategy, generator=torch.Generator().manual_seed(0), stage=1)
    opt.grow(res.model.named_parameters(), res.param_map, stage=1)
    strategy.after_growth(opt, res, "adamw")
    X = cfg.n_experts
    for name, _ in res.model.named_parameters():
        if ".experts." not in name:
            continue
        j = int(name.split(".")[4])
        src = name.replace(f".experts.{j}.", f".experts.{j % X}.") if source == "experts" else \
            name.replace(f".experts.{j}.", ".")
        copied = j >= X
        for b, buf in opt.state[name].items():
            want = before[src][b] if (moments == "copy" or not copied) else torch.zeros_like(buf)
            assert torch.equal(buf, want), (name, b)
            assert float(before[src][b].abs().max()) > 0  # two steps taken: a copy is not zeros by chance
        assert int(opt.birth_stage(name).unique().item()) == (1 if copied and moments == "fresh" else 0)
    router = "layers.0.mlp.router.weight"
    if source == "experts":
        rows = torch.arange(target.n_experts) % X
        for b, buf in opt.state[router].items():
            want = before[router][b][rows]
            if moments == "fresh":
                want[X:] = 0
            assert torch.equal(buf, want), b
    else:  # a new router: nothing to copy
        assert all(float(t.abs().max()) == 0 for t in opt.state[router].values())


def test_the_plan_routes_each_stage_to_at_most_its_experts():
    cfg = LLAMA.replace(n_experts=8, top_k=2)
    sched = {"stages": 4, "grow": ["n_experts"], "start": {"n_experts": 1}, "first_stage": 0.1}
    plan = build_plan(cfg, sched, max_tokens=100_000, batch_size=4)
    assert [(s.cfg.n_experts, s.cfg.top_k) for s in plan] == [(1, 1), (2, 2), (4, 2), (8, 2)]
    sched = {**sched, "stages": 2, "grow": ["n_experts", "top_k"], "start": {"n_experts": 4, "top_k": 1}}
    assert [(s.cfg.n_experts, s.cfg.top_k) for s in build_plan(cfg, sched, max_tokens=100_000, batch_size=4)] == \
        [(4, 1), (8, 2)]


def test_a_run_upcycles_through_the_cli_without_changing_its_loss(tmp_path):
    run_dir = tmp_path / "run"
    out = grow_cli("train", "model=llama-tiny", *[a for a in TINY_RUN if not a.startswith("model=")],
                   "model.n_experts=4", "model.top_k=2", "+schedule=exp", "schedule.grow=[n_experts]",
                   "+schedule.start.n_experts=1", "schedule.stages=2", "strategy=upcycle", "trainer.max_tokens=12000",
                   f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (growth,) = [r for r in records if "growth/delta" in r]
    assert abs(growth["growth/delta"]) <= 1e-5  # float32: the experts' weighted sum rounds in the last bits
    assert any("train/router_balance" in r for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_config"]["n_experts"] == 4 and summary["active_params"] < summary["params"]


UPCYCLE_RUN = [*TINY_RUN, "model=llama-tiny", "model.n_experts=4", "model.top_k=2", "+schedule=exp",
               "schedule.grow=[n_experts,top_k]", "+schedule.start.n_experts=1", "schedule.stages=3",
               "strategy=upcycle", "trainer.max_tokens=16000", "trainer.log_every=1", "trainer.ckpt_every=3",
               "model.router_z_coef=0.01", "model.dropout=0.1", "strategy.new_experts=unused", "strategy.ramp_steps=6"]


@pytest.mark.crash
def test_sigkill_inside_an_upcycling_growth_then_reruns_give_the_losses_of_a_run_never_stopped(tmp_path):
    """Killed as the first growth (dense -> 2 experts) starts, inside it after its expansion into experts (before
    the optimizer copies the moments), as it starts again, then 4 steps into a rerun; each rerun resumes the newest
    checkpoint and the run goes on through the second growth (2 -> 4 experts, top_k 1 -> 2). The new experts start
    unused and ramp in over 6 steps (their masks in the checkpoints). The losses, router losses, final validation
    loss and state equal a run never stopped, bitwise."""
    import os
    import signal

    from grow import checkpoint
    from grow import train as train_mod
    from grow.metrics import read_metrics
    from tests.conftest import run_config
    from tests.ranks import forked_grow

    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    env = {**os.environ, "GROW_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    for point in ["growth:1", "expand:1", "growth:1", "step:4", None]:
        resume = bool(checkpoint.list_checkpoints(run_dir))
        argv = ["train", f"resume={run_dir}"] if resume else ["train", *UPCYCLE_RUN, f"hydra.run.dir={run_dir}"]
        out = forked_grow(*argv, cwd=tmp_path, environ={**env, **({"GROW_KILL_AT": point} if point else {})})
        assert out.returncode == (0 if point is None else -signal.SIGKILL), (point, out.stderr[-3000:])
    ref = train_mod.train(run_config(*UPCYCLE_RUN, f"data.cache_dir={cache}"), tmp_path / "reference")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_val_loss"] == ref["final_val_loss"] and summary["state"] == ref["state"]
    assert [len(e) for e in (summary["growth_events"], ref["growth_events"])] == [2, 2]
    assert [e["upcycle/masked_experts"] for e in summary["growth_events"]] == [1.0, 2.0]
    assert abs(summary["growth_events"][0]["growth/delta"]) <= 1e-5  # dense -> 2 (the second also grows top_k)
    losses = lambda rs: [(r.get("train/step"), k, v) for r in rs for k, v in r.items() if "loss" in k or "router" in k]
    assert losses(read_metrics(run_dir)) == losses(read_metrics(tmp_path / "reference"))


@pytest.mark.parametrize("spec", ["moe-upcycle-cpu", "moe-upcycle"])
def test_the_prepared_sweeps_arms_compose_and_spend_equal_flops(spec, capsys):
    """configs/sweep/moe-upcycle{-cpu,}.yaml: every arm's config composes and validates (a dry run of the driver),
    the arms are docs/results.md's (a)-(d), and their stage plans spend the same FLOPs to 1% (the router's)."""
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "scripts"))
    import sweep

    path = ROOT / "configs" / "sweep" / f"{spec}.yaml"
    assert sweep.main([str(path), str(ROOT / "outputs" / "nowhere"), "--dry-run"]) == 0
    assert f"{5 * len(sweep.load_spec(path)['seeds'])} run(s) left" in capsys.readouterr().out
    loaded = sweep.load_spec(path)
    flops = {j["arm"]: sweep.plan_flops(j["overrides"])[0] for j in sweep.jobs_of(loaded, [0], [])}
    assert set(flops) == {"moe-scratch", "dense", "upcycle-25", "upcycle-50", "experts-4to8-50"}
    assert max(flops.values()) / min(flops.values()) <= 1.01
