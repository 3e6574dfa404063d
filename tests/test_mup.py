"""μP (``model.parametrization: mup``, grow/mup.py): the rules, growth kept in μP with the function
unchanged, a coordinate check and the learning-rate transfer it buys."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from grow.growth import grow
from grow.model import HIDDEN, Transformer, TransformerConfig
from grow.optim import build_optimizer
from tests.conftest import TINY_RUN, grow_cli

ADAM = SimpleNamespace(name="adamw", lr=1e-2, weight_decay=0.0, new_warmup_steps=0, betas=(0.9, 0.999), eps=1e-8,
                       fused=False, compile=False)


def config(h: int, par: str = "mup", **kw) -> TransformerConfig:
    base = dict(vocab_size=256, seq_len=32, d_model=h, n_heads=4, d_qk=h // 4, d_v=h // 4, d_ff=2 * h, n_layers=2,
                parametrization=par, mup_base_width=32 if par == "mup" else None)
    return TransformerConfig(**{**base, **kw})


def test_mup_rules_init_output_multiplier_and_learning_rates():
    m = Transformer(config(128), generator=torch.Generator().manual_seed(0))
    assert m.config.width_mult == 4.0 and m.lm_head.mult == 0.25
    stds = {n: float(p.detach().std()) for n, p in m.named_parameters()}
    assert stds["layers.0.attn.q.weight"] == pytest.approx(0.02 / 2, rel=0.05)  # sigma / sqrt(m)
    assert stds["wte.weight"] == pytest.approx(0.02, rel=0.05) and stds["lm_head.weight"] == pytest.approx(0.02, rel=0.05)
    opt = build_optimizer(m, ADAM)
    for name in opt.params:
        assert opt.multipliers.get(name, {}).get(0, 1.0) == (0.25 if name.endswith(HIDDEN) else 1.0), name
    standard = Transformer(config(128, "standard"), generator=torch.Generator().manual_seed(0))
    assert standard.lm_head.mult == 1.0 and not build_optimizer(standard, ADAM).multipliers
    assert "parametrization" not in standard.config.to_dict()  # standard configs are written as before mup


@pytest.mark.parametrize("strategy", ["zero", "hyperclone", "msg"])
def test_a_growth_keeps_mup_and_the_function(strategy):
    """h 16 -> 32 (m 0.5 -> 1): W_out x 2, its multiplier / 2, logits unchanged (float64, 1e-12 relative)."""
    small = config(16, d_qk=8, d_v=8, vocab_size=64, seq_len=16)
    big = small.replace(d_model=32, d_ff=64, n_heads=4, d_qk=16, d_v=16, n_layers=3)
    m = Transformer(small, generator=torch.Generator().manual_seed(0)).double()
    x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    before = m(x).detach()
    res = grow(m, big, strategy=strategy, generator=torch.Generator().manual_seed(1), stage=1)
    after = res.model(x).detach()
    assert float((after - before).abs().max() / before.abs().max()) <= 1e-12
    assert res.model.lm_head.mult * res.model.config.width_mult == pytest.approx(1.0)  # 1/m' again


def test_a_mup_run_grows_without_a_jump_and_its_hidden_rates_follow_the_width(tmp_path):
    run = tmp_path / "run"
    out = grow_cli("train", *TINY_RUN, "+schedule=exp", "strategy=zero", "precision=float64", "trainer.max_tokens=20000",
                   "model.parametrization=mup", "model.mup_base_width=32", f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert len(s["growth_events"]) == 3 and all(abs(e["growth/delta"]) < 1e-10 for e in s["growth_events"])
    assert s["final_config"]["parametrization"] == "mup"
    from grow.checkpoint import latest, load

    payload = load(latest(run))
    mults = payload["optimizer"]["multipliers"]
    hidden = [n for n in payload["optimizer"]["state"] if n.endswith(HIDDEN)]
    assert hidden and all(set(mults[n].values()) == {1.0} for n in hidden)  # final width = base: eta / 1
    assert math.isclose(payload["model"]["lm_head._extra_state"]["mult"], 1.0)


def _train(h: int, par: str, lr: float, steps: int):
    """(std of the logits' change, final loss) of ``steps`` AdamW steps on one fixed batch (next token of
    random sequences: the model memorizes it), width h, four heads, p = 2h."""
    m = Transformer(config(h, par), generator=torch.Generator().manual_seed(0))
    x = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))
    opt = build_optimizer(m, SimpleNamespace(**{**vars(ADAM), "lr": lr}))
    with torch.no_grad():
        start = m(x)
    for _ in range(steps):
        _, loss = m(x, x.roll(-1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        return float((m(x) - start).std()), float(loss)


def test_coordinate_check_mup_updates_do_not_grow_with_width():
    """Yang et al.'s coordinate check: after 5 AdamW steps at one learning rate, the logits move by an
    amount that grows with the width in standard (measured x6.3 from h = 32 to 256) and stays put
    under mup (x0.76)."""
    widths = (32, 64, 128, 256)
    std = {par: [_train(h, par, 1e-2, 5)[0] for h in widths] for par in ("standard", "mup")}
    assert std["standard"][-1] / std["standard"][0] > 3
    assert 0.5 < std["mup"][-1] / std["mup"][0] < 1.5


@pytest.mark.slow
def test_the_best_learning_rate_transfers_across_width_under_mup():
    """An 8-point grid of learning rates (factors of 2) at h = 32 and 128, 30 steps: the best rate
    moves by at most one grid step under mup (measured: 1) and by at least two in standard (3)."""
    grid = [1e-3 * 2 ** k for k in range(8)]

    def best(h, par):
        losses = [_train(h, par, lr, 30)[1] for lr in grid]
        return min(range(len(grid)), key=losses.__getitem__)

    assert abs(best(128, "mup") - best(32, "mup")) <= 1
    assert abs(best(128, "standard") - best(32, "standard")) >= 2


def test_mup_needs_adamw_and_untied_embeddings(tmp_path):
    for extra, key in ((["optim=sgd"], "model.parametrization"), (["model.tie_embeddings=true"], "model.tie_embeddings"),
                       ([], "model.mup_base_width")):
        args = ["model.parametrization=mup", *([] if key == "model.mup_base_width" else ["model.mup_base_width=32"])]
        out = grow_cli("train", *TINY_RUN, *args, *extra, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(f"error: {key}="), out.stderr


def test_the_late_expansion_preset_is_one_depth_growth_at_80_percent_under_wsd_and_mup():
    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        run = load_run(compose("train", overrides=["+experiment=late-expansion"]))
    plan = run.plan
    assert [s.cfg.n_layers for s in plan] == [1, run.model.n_layers] and run.model.n_layers > 1
    assert all(s.cfg.d_model == run.model.d_model for s in plan)  # depth only
    assert abs(plan[0].tokens / run.trainer.max_tokens - 0.8) < 0.01
    assert run.model.parametrization == "mup" and run.optim.schedule == "wsd" and run.optim.decay_fraction == 0.2


@pytest.mark.slow
def test_late_expansion_compares_at_equal_flops(tmp_path):
    out = grow_cli("compare", "+experiment=late-expansion", "strategy=zero", "model=tiny", *TINY_RUN[1:3],
                   "model.mup_base_width=16", "trainer.max_tokens=20000", "trainer.progress=false",
                   "trainer.eval_batches=2", f"hydra.sweep.dir={tmp_path / 'sweep'}",  # the experiment sets equal_flops
                   cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((tmp_path / "sweep" / "zero-seed0" / "summary.json").read_text())
    assert len(s["growth_events"]) == 1 and abs(s["growth_events"][0]["growth/delta"]) < 1e-5
    assert (tmp_path / "sweep" / "equal_flops-seed0" / "summary.json").is_file()


@pytest.mark.parametrize("strategy", ["zero", "msg"])
def test_new_output_columns_get_mups_init_at_the_new_width(strategy):
    """h 16 -> 32 (m 0.5 -> 1): the old W_out entries are stored x m'/m = 2, the new columns are mup's W_out init
    at the new width, sigma, exactly the draw the same growth makes in standard (where nothing is rescaled);
    before they were drawn at sigma and then doubled with the old ones."""
    small = config(16, d_qk=8, d_v=8, vocab_size=64, seq_len=16)
    big = small.replace(d_model=32)
    grown = {}
    for par in ("mup", "standard"):
        cfg = small.replace(parametrization=par, mup_base_width=32 if par == "mup" else None)
        m = Transformer(cfg, generator=torch.Generator().manual_seed(0)).double()
        res = grow(m, big.replace(parametrization=par, mup_base_width=cfg.mup_base_width), strategy=strategy,
                   generator=torch.Generator().manual_seed(1), stage=1)
        grown[par] = (m.lm_head.weight.detach(), res.model.lm_head.weight.detach())
    (old, mup), (_, std) = grown["mup"], grown["standard"]
    assert torch.equal(mup[:, :16], 2 * old)
    assert torch.equal(mup[:, 16:], std[:, 16:]) and float(std[:, 16:].std()) == pytest.approx(0.02, rel=0.1)
