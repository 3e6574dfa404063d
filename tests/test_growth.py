"""The six expansions of A. Gesmundo and K. Maile, "Composable Function-preserving Expansions for
Transformer Architectures", arXiv:2308.06103 (2023), and the zero / random / net2net strategies
(docs/model.md, "The six expansions"; docs/strategies.md)."""

from __future__ import annotations

import math

import pytest
import torch

from grow.growth import (
    ORDER,
    GrowthResult,
    Strategy,
    add_layers,
    available,
    compose_maps,
    get_strategy,
    grow,
    grow_hidden_size,
    grow_key_size,
    grow_model,
    identity_map,
    layer_positions,
    new_entry_mask,
)
from grow.growth.zero import Zero
from grow.model import Transformer, TransformerConfig
from tests.helpers import BASE, CASES, TARGETS, _new_slices, gen, max_delta, target, tokens, trained_like


class Fill42(Zero):
    """Gesmundo & Maile's constraints, every free entry 42 (docs/model.md, "The six expansions": only the constraints
    matter)."""

    def free_values(self, ctx, site, slot):
        return torch.full(slot.new_shape(), 42.0, dtype=ctx.dtype, device=ctx.device)


# ---------------------------------------------------------------------------------------------
# Function preservation
# ---------------------------------------------------------------------------------------------
DOUBLED = BASE.replace(n_layers=4, d_model=32, n_heads=4, d_qk=8, d_v=12, d_ff=48)  # integer factors: hyperclone too


def exact_strategies() -> list[str]:
    """Every registered strategy (plugins of GROW_PLUGINS included) that declares itself exact."""
    from grow.growth.base import strategy_class

    return [n for n in available() if strategy_class(n).exact_with is not None]


@pytest.mark.parametrize("name", exact_strategies())
def test_every_exact_strategy_preserves_the_function_float64(name):
    """`Strategy.exact_with`: grown in all six dimensions at once (each doubled), with the batches a
    data-driven strategy needs, the logits within 1e-10 of the largest one (float64)."""
    from grow.growth.base import strategy_class

    model, idx = trained_like(), tokens()
    batches = [(tokens(seed=10 + i), tokens(seed=20 + i)) for i in range(6)]
    res = grow(model, DOUBLED, name, batch=batches, generator=gen(), stage=1, **strategy_class(name).exact_with)
    assert res.model.config == DOUBLED
    with torch.no_grad():
        scale = float(model(idx).abs().max())
    assert max_delta(model, res.model, idx) <= 1e-10 * scale


@pytest.mark.parametrize("case", CASES)
def test_zero_preserves_function_float64(case):
    model, idx = trained_like(), tokens()
    tgt = target(case)
    res = grow(model, tgt, "zero", generator=gen())
    assert isinstance(res, GrowthResult)
    assert res.model.config == tgt
    assert res.model is not model
    assert next(res.model.parameters()).dtype == torch.float64
    assert max_delta(model, res.model, idx) <= 1e-10
    assert res.flops == 0.0 and res.lr_multipliers is None


@pytest.mark.parametrize("case", CASES)
def test_zero_preserves_function_float32(case):
    model, idx = trained_like(dtype=torch.float32), tokens()
    grown = grow_model(model, target(case), "zero", generator=gen())
    assert next(grown.parameters()).dtype == torch.float32
    with torch.no_grad():
        before, after = model(idx), grown(idx)
    scale = float(before.abs().max())
    assert float((after - before).abs().max()) <= 1e-5 * scale


@pytest.mark.parametrize("case", CASES)
def test_free_entries_do_not_matter(case):
    """Free entries at 42 instead of the initializer: same logits (only the constraints matter)."""
    model, idx = trained_like(), tokens()
    grown = grow_model(model, target(case), Fill42())
    n42 = sum(int((p == 42.0).sum()) for p in grown.parameters())
    assert n42 > 0
    assert max_delta(model, grown, idx) <= 1e-10


def test_each_dimension_alone_composes_with_the_others():
    """The six single-dimension functions applied one after the other (another order than
    grow()'s) are function-preserving, and composing their maps gives a valid map."""
    model, idx = trained_like(), tokens()
    from grow.growth import EXPANSIONS

    current, pmap = model, identity_map(model)
    for dim in ("N", "E", "p", "v", "k", "h"):  # reverse of ORDER
        fld = {"h": "d_model", "k": "d_qk", "v": "d_v", "p": "d_ff", "E": "n_heads", "N": "n_layers"}[dim]
        current, step = EXPANSIONS[dim](current, getattr(target("all"), fld), "zero", generator=gen())
        pmap = compose_maps(pmap, step)
    assert current.config == target("all")
    assert max_delta(model, current, idx) <= 1e-10
    check_param_map(model, current, pmap)


# ---------------------------------------------------------------------------------------------
# The rescalings are needed (the tests above would fail without them)
# ---------------------------------------------------------------------------------------------
def undo_old_factor(res, suffix: str, factor: float):
    """A copy of the grown model with the old entries of every parameter ending in ``suffix``
    divided by ``factor`` (the expansion's own rescaling undone)."""
    broken = _copy(res.model)
    params = dict(broken.named_parameters())
    with torch.no_grad():
        for old, (new, pos) in res.param_map.items():
            if old.endswith(suffix):
                params[new].view(-1)[pos.reshape(-1)] /= factor
    return broken


def test_key_rescaling_is_needed():
    """Undo the sqrt(k_hat/k) factor on the old W^K entries: the logits change well beyond the
    tolerance, so the preservation test above would catch an implementation without it."""
    model, idx = trained_like(), tokens()
    tgt = target("k")
    res = grow(model, tgt, "zero", generator=gen())
    assert max_delta(model, res.model, idx) <= 1e-10
    broken = undo_old_factor(res, "attn.k.weight", math.sqrt(tgt.d_qk / BASE.d_qk))
    assert max_delta(model, broken, idx) > 1e-3


def test_norm_gain_rescaling_is_needed():
    """Undo the sqrt(h/h_hat) factor on the old norm gains: the logits change."""
    model, idx = trained_like(), tokens()
    tgt = target("h")
    res = grow(model, tgt, "zero", generator=gen())
    assert max_delta(model, res.model, idx) <= 1e-10
    broken = undo_old_factor(res, "norm.weight", math.sqrt(BASE.d_model / tgt.d_model))
    assert max_delta(model, broken, idx) > 1e-3


def _copy(model: Transformer) -> Transformer:
    import copy

    return copy.deepcopy(model)


# ---------------------------------------------------------------------------------------------
# The residual stream under h growth
# ---------------------------------------------------------------------------------------------
def test_new_residual_coordinates_are_exactly_zero():
    model, idx = trained_like(), tokens()
    grown = grow_model(model, target("h"), "zero", generator=gen())
    h = BASE.d_model
    seen = []

    def hook(module, args):
        seen.append(args[0][..., h:].detach().clone())

    handles = [layer.register_forward_pre_hook(hook) for layer in grown.layers]
    handles.append(grown.norm.register_forward_pre_hook(hook))
    with torch.no_grad():
        grown(idx)
    for hd in handles:
        hd.remove()
    assert len(seen) == BASE.n_layers + 1
    for x in seen:
        assert x.numel() > 0 and torch.count_nonzero(x) == 0


@pytest.mark.parametrize("case", CASES)
def test_every_new_block_gets_gradient_within_two_steps(case):
    """Gesmundo & Maile's zeros leave no dead unit: every new row/column of every parameter (a new
    neuron, head, value or key coordinate, residual channel, or any row/column of a new layer)
    receives a non-zero gradient in one of the first two AdamW steps."""
    model = trained_like()
    res = grow(model, target(case), "zero", generator=gen())
    grown = res.model
    masks = new_entry_mask(res.param_map, grown)
    opt = torch.optim.AdamW(grown.parameters(), lr=1e-2, weight_decay=0.0)
    seen = {n: torch.zeros_like(p) for n, p in grown.named_parameters()}
    for step in range(2):
        idx = tokens(B=8, seed=10 + step)
        _, loss = grown(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        for n, p in grown.named_parameters():
            seen[n] += p.grad.abs()
        opt.step()
    dead = []
    checked = 0
    for n, mask in masks.items():
        if not mask.any():
            continue
        for axis, i in _new_slices(mask):
            checked += 1
            if n == "wpe.weight" and axis == 0:
                continue  # a position row: the last one is never used with inputs of length s - 1
            if n == "wte.weight" and axis == 0:
                continue  # a token row: tokens absent from the batch get no gradient (not new anyway)
            if float(seen[n].select(axis, i).abs().sum()) == 0.0:
                dead.append((n, axis, i))
    assert checked > 0
    assert not dead, f"dead new slices: {dead[:10]}"


def test_zeroed_gains_would_kill_new_channels():
    """Why the new gain entries are free (correction to Gesmundo & Maile Thm 3.5): with them at
    0 as the paper writes, the new residual channels' writers never get a gradient."""

    class SeedGains(Zero):
        def free_values(self, ctx, site, slot):
            if slot.role == "gain":
                return torch.zeros(slot.new_shape(), dtype=ctx.dtype, device=ctx.device)
            return super().free_values(ctx, site, slot)

    model = trained_like()
    res = grow(model, target("h"), SeedGains(), generator=gen())
    grown = res.model
    idx = tokens(B=8)
    _, loss = grown(idx[:, :-1], idx[:, 1:])
    loss.backward()
    h = BASE.d_model
    assert float(grown.layers[0].attn.o.weight.grad[h:].abs().sum()) == 0.0
    assert float(grown.layers[0].attn_norm.weight.grad[h:].abs().sum()) == 0.0


# ---------------------------------------------------------------------------------------------
# The param map
# ---------------------------------------------------------------------------------------------
def check_param_map(old_model, new_model, pmap):
    """Every old parameter maps into a parameter of the new model, at distinct positions, with
    its value there (up to the known rescalings: W^K by sqrt(k_hat/k), gains by sqrt(h/h_hat))."""
    old_params = dict(old_model.named_parameters())
    new_params = dict(new_model.named_parameters())
    assert set(pmap) == set(old_params)
    a, b = old_model.config, new_model.config
    targets = set()
    for old, (new, pos) in pmap.items():
        assert new in new_params and new not in targets
        targets.add(new)
        assert pos.shape == old_params[old].shape and pos.dtype == torch.long
        assert pos.unique().numel() == pos.numel()
        assert int(pos.min()) >= 0 and int(pos.max()) < new_params[new].numel()
        value = new_params[new].detach().view(-1)[pos]
        expected = old_params[old].detach()
        if old.endswith("attn.k.weight"):
            expected = expected * math.sqrt(b.d_qk / a.d_qk)
        if old.endswith("norm.weight"):
            expected = expected * math.sqrt(a.d_model / b.d_model)
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("case", CASES)
def test_param_map(case):
    model = trained_like()
    res = grow(model, target(case), "zero", generator=gen())
    check_param_map(model, res.model, res.param_map)


def test_param_map_renames_layers():
    model = trained_like()
    grown, pmap = add_layers(model, 4, "zero", generator=gen(), where=[0, 2])
    assert pmap["layers.0.attn.q.weight"][0] == "layers.1.attn.q.weight"
    assert pmap["layers.1.mlp.fc2.weight"][0] == "layers.3.mlp.fc2.weight"
    assert pmap["wte.weight"][0] == "wte.weight"
    check_param_map(model, grown, pmap)
    # the inserted layers are identities and hold Gesmundo & Maile's zeros
    for n in (0, 2):
        assert torch.count_nonzero(grown.layers[n].attn.o.weight) == 0
        assert torch.count_nonzero(grown.layers[n].mlp.fc2.weight) == 0
        assert torch.count_nonzero(grown.layers[n].mlp.fc2.bias) == 0
        assert torch.count_nonzero(grown.layers[n].attn.q.weight) > 0


@pytest.mark.parametrize("where", ["end", "start", "interleave", [1, 3]])
def test_layers_at_any_position(where):
    model, idx = trained_like(), tokens()
    res = grow(model, BASE.replace(n_layers=4), "zero", generator=gen(), layer_position=where)
    assert max_delta(model, res.model, idx) <= 1e-10
    check_param_map(model, res.model, res.param_map)


def test_layer_positions():
    assert layer_positions(4, 6, "end") == [4, 5]
    assert layer_positions(4, 6, "start") == [0, 1]
    assert layer_positions(4, 6, "interleave") == [2, 5]
    assert layer_positions(4, 8, "interleave") == [1, 3, 5, 7]
    assert layer_positions(2, 3, [1]) == [1]
    with pytest.raises(ValueError, match="distinct indices"):
        layer_positions(2, 4, [1, 1])
    with pytest.raises(ValueError, match="layer_position"):
        layer_positions(2, 4, "middle")


# ---------------------------------------------------------------------------------------------
# random and net2net
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_random_changes_the_function(case):
    model, idx = trained_like(), tokens()
    grown = grow_model(model, target(case), "random", generator=gen())
    assert grown.config == target(case)
    assert max_delta(model, grown, idx) > 1e-4


@pytest.mark.parametrize("case", CASES)
def test_net2net_without_noise_preserves_function(case):
    model, idx = trained_like(), tokens()
    for choice in ("random", "cycle"):
        res = grow(model, target(case), "net2net", generator=gen(), noise=0.0, choice=choice)
        assert res.model.config == target(case)
        assert max_delta(model, res.model, idx) <= 1e-10


def test_net2net_splits_units():
    """A copied MLP neuron: same incoming weights as its source, outgoing weights shared."""
    model = trained_like()
    grown = grow_model(model, target("p"), "net2net", generator=gen(), noise=0.0, choice="cycle")
    p, q = BASE.d_ff, target("p").d_ff
    old1, new1 = model.layers[0].mlp.fc1.weight, grown.layers[0].mlp.fc1.weight
    old2, new2 = model.layers[0].mlp.fc2.weight, grown.layers[0].mlp.fc2.weight
    for u in range(q - p):
        src = u % p
        torch.testing.assert_close(new1[p + u], old1[src], rtol=0, atol=0)
        torch.testing.assert_close(new2[:, p + u], old2[:, src] / 2, rtol=1e-15, atol=0)
        torch.testing.assert_close(new2[:, src], old2[:, src] / 2, rtol=1e-15, atol=0)


@pytest.mark.parametrize("case", CASES)
def test_net2net_noise_changes_only_split_dimensions(case):
    model, idx = trained_like(), tokens()
    from grow.growth.net2net import Net2Net

    grown = grow_model(model, target(case), "net2net", generator=gen(), noise=0.05)
    dims = set(TARGETS) if case == "all" else {case}
    if dims & set(Net2Net.SPLIT_DIMS):
        assert max_delta(model, grown, idx) > 1e-6
    else:
        assert max_delta(model, grown, idx) <= 1e-10


# ---------------------------------------------------------------------------------------------
# Refusals, no-op, options, registry
# ---------------------------------------------------------------------------------------------
def test_same_config_is_a_no_op():
    model, idx = trained_like(), tokens()
    res = grow(model, BASE, "zero", state={"carry": 1})
    assert res.model.config == BASE and res.model is not model
    assert max_delta(model, res.model, idx) == 0.0
    for name, p in model.named_parameters():
        assert torch.equal(dict(res.model.named_parameters())[name], p)
        new, pos = res.param_map[name]
        assert new == name and torch.equal(pos.view(-1), torch.arange(p.numel()))
    assert res.state == {"carry": 1}


@pytest.mark.parametrize(
    "change", [dict(d_model=8), dict(d_qk=2), dict(d_v=4), dict(d_ff=16), dict(n_heads=1), dict(n_layers=1)]
)
def test_shrinking_is_refused(change):
    with pytest.raises(ValueError, match="cannot shrink"):
        grow(trained_like(), BASE.replace(**change), "zero")


def test_shrink_in_one_dimension_is_refused_even_when_others_grow():
    with pytest.raises(ValueError, match="cannot shrink d_ff"):
        grow(trained_like(), BASE.replace(d_model=32, d_ff=8), "zero")


@pytest.mark.parametrize(
    "change", [dict(vocab_size=99), dict(seq_len=32), dict(activation="relu"), dict(norm_eps=1e-3)]
)
def test_fixed_fields_are_refused(change):
    with pytest.raises(ValueError, match="cannot change"):
        grow(trained_like(), BASE.replace(d_model=24, **change), "zero")


def test_dropout_and_init_std_follow_the_target():
    model, idx = trained_like(), tokens()
    tgt = BASE.replace(dropout=0.1, init_std=0.01)
    grown = grow_model(model, tgt, "zero").eval()
    assert grown.config == tgt
    assert max_delta(model.eval(), grown, idx) == 0.0


def test_unknown_strategy_and_option():
    with pytest.raises(ValueError, match="unknown growth strategy 'nope'.*available: .*zero"):
        grow(trained_like(), target("p"), "nope")
    with pytest.raises(ValueError, match="strategy.bogus=1: not an option of strategy zero; allowed"):
        grow(trained_like(), target("p"), "zero", bogus=1)


def test_yaml_defaults_and_overrides():
    s = get_strategy("net2net")
    assert s.options == {"noise": 0.01, "choice": "random", "layer_position": "end"}
    assert get_strategy("net2net", noise=0.0).options["noise"] == 0.0
    # a Hydra-like node: name + options; keyword options win
    s = get_strategy({"name": "net2net", "noise": 0.2, "choice": "cycle"}, noise=0.3)
    assert s.options["noise"] == 0.3 and s.options["choice"] == "cycle"
    inst = Zero()
    assert get_strategy(inst) is inst


@pytest.mark.parametrize("name, key", [("net2net", "noise"), ("hyperclone", "noise"), ("shrink_perturb", "noise"),
                                       ("shrink_perturb", "shrink"), ("vt", "noise_ratio")])
def test_a_noise_option_is_checked_in_one_style(name, key):
    """strategy.noise (and its kin) is a finite number >= 0 wherever a strategy has it: a string, a bool, NaN, inf or a
    negative number ends in the same one line naming the option (net2net and vt raised float()'s own ValueError
    for a string and took inf and True; shrink_perturb took NaN)."""
    from grow.errors import ConfigError

    for bad in ("abc", True, float("nan"), float("inf"), -0.5):
        with pytest.raises(ConfigError, match=rf"^strategy\.{key}=.*: must be a number >= 0 \(strategy {name}\)$"):
            get_strategy(name, **{key: bad})
    assert get_strategy(name, **{key: 0}).options[key] == 0


@pytest.mark.parametrize("name", available())
def test_yaml_files_list_exactly_the_options(name):
    """Every strategy (the registry and configs/strategy/): its YAML names it and is the one place of its
    options' defaults (the class declares none: it checks them), one commented line each."""
    from grow.growth.base import configs_dir, strategy_class, yaml_options, yaml_path

    path = yaml_path(name)
    text = path.read_text()
    assert f"name: {name}" in text
    opts = yaml_options(name)
    if path.is_relative_to(configs_dir()):  # in the package: the YAML alone holds the defaults
        assert strategy_class(name).defaults == {}
    assert get_strategy(name).options == opts
    for line in text.splitlines():  # one commented line per knob
        if line and not line.startswith("#") and not line.startswith("name:"):
            assert "#" in line, line


# ---------------------------------------------------------------------------------------------
# Persistence, multipliers, tying, determinism
# ---------------------------------------------------------------------------------------------
def test_grown_model_saves_and_reloads(tmp_path):
    model, idx = trained_like(), tokens()
    res = grow(model, target("all"), "zero", generator=gen())
    path = tmp_path / "grown.pt"
    torch.save(
        {"config": res.model.config.to_dict(), "model": res.model.state_dict(), "param_map": res.param_map},
        path,
    )
    blob = torch.load(path, weights_only=True)
    again = Transformer(TransformerConfig.from_dict(blob["config"])).to(torch.float64)
    again.load_state_dict(blob["model"])
    with torch.no_grad():
        assert torch.equal(again(idx), res.model(idx))
    assert set(blob["param_map"]) == set(res.param_map)


def test_forward_multipliers_are_kept():
    """A model whose Linears carry forward multipliers (as after a vt growth) grows exactly."""
    model, idx = trained_like(), tokens()
    model.layers[0].attn.k.mult = 0.7
    model.layers[1].mlp.fc2.mult = 1.3
    model.lm_head.mult = 0.5
    for case in CASES:
        grown = grow_model(model, target(case), "zero", generator=gen())
        assert max_delta(model, grown, idx) <= 1e-10
        mults = {n: m.mult for n, m in grown.named_modules() if hasattr(m, "mult")}
        assert mults["lm_head"] == 0.5


def test_tied_embeddings():
    cfg = BASE.replace(tie_embeddings=True)
    model, idx = trained_like(cfg), tokens(cfg)
    res = grow(model, target("all", cfg), "zero", generator=gen())
    assert res.model.lm_head.weight is res.model.wte.weight
    assert "lm_head.weight" not in res.param_map
    assert max_delta(model, res.model, idx) <= 1e-10


def test_generator_makes_growth_reproducible():
    model = trained_like()
    a = grow_model(model, target("all"), "random", generator=gen(5))
    b = grow_model(model, target("all"), "random", generator=gen(5))
    c = grow_model(model, target("all"), "random", generator=gen(6))
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not all(torch.equal(pa[n], pc[n]) for n in pa)


def test_input_model_is_untouched():
    model = trained_like()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grow(model, target("all"), "net2net", generator=gen())
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])


def test_grow_applies_the_dimensions_in_the_documented_order(monkeypatch):
    """`grow` calls the expansions in ``ORDER``, and docs/model.md, "The six expansions" states that order."""
    import re

    import grow.growth as G
    from tests.conftest import ROOT

    called = []
    for dim, fn in list(G.EXPANSIONS.items()):
        monkeypatch.setitem(G.EXPANSIONS, dim, lambda *a, _f=fn, _d=dim, **k: called.append(_d) or _f(*a, **k))
    grow(trained_like(), target("all").replace(n_experts=2), "zero", generator=gen())  # X (experts) last
    assert tuple(called) == ORDER
    design = (ROOT / "docs" / "model.md").read_text()
    stated = re.search(r"one at a time in the\s+order ([hkvpENX](?:, [hkvpENX])+)", design)
    assert stated and tuple(stated.group(1).split(", ")) == ORDER


def test_single_dimension_functions_return_model_and_map():
    model, idx = trained_like(), tokens()
    grown, pmap = grow_key_size(model, 8)
    assert grown.config == BASE.replace(d_qk=8)
    check_param_map(model, grown, pmap)
    grown2, pmap2 = grow_hidden_size(grown, 20)
    assert max_delta(model, grown2, idx) <= 1e-10
    check_param_map(model, grown2, compose_maps(pmap, pmap2))


class _Recorder(Strategy):
    defaults = {"layer_position": "end"}

    def __init__(self, **o):
        super().__init__(**o)
        self.calls = []

    def setup(self, ctx):
        self.calls.append(("setup", ctx.stage))

    def before_expansion(self, ctx, dim):
        self.calls.append(("before", dim))

    def after_expansion(self, ctx, dim, model, pmap):
        self.calls.append(("after", dim))

    def finish(self, ctx, model, pmap):
        self.calls.append(("finish",))
        ctx.metrics["rec/n"] = 1.0
        ctx.flops += 5.0
        ctx.state = {"seen": len(self.calls)}


def test_hooks_order_and_outputs():
    s = _Recorder()
    res = grow(trained_like(), target("all").replace(n_experts=2), s, stage=1, batch=(tokens(), tokens()))
    dims = [c[1] for c in s.calls if c[0] == "before"]
    assert dims == list(ORDER)
    assert s.calls[0] == ("setup", 1) and s.calls[-1] == ("finish",)
    assert res.metrics == {"rec/n": 1.0} and res.flops == 5.0 and res.state == {"seen": 2 + 2 * len(ORDER)}


@pytest.mark.parametrize("name", ["zero", "random", "net2net", "vt", "hyperclone", "shrink_perturb", "msg"])
def test_a_tensor_draws_the_same_whatever_else_grows_with_it(name):
    """docs/strategies.md, "Random draws": each grown tensor's draws come from its own stream (the
    generator's seed, the dimension, the tensor's name), so two models that share their blocks but
    not their embedding's size (which changes what the embedding draws) grow every block alike: what a
    growth under FSDP that grows one unit at a time relies on. One shared stream gave the tensors drawn
    after the embedding other draws."""
    models = [trained_like(DOUBLED.replace(tie_embeddings=False, vocab_size=v)) for v in (61, 67)]
    models[1].load_state_dict({k: v for k, v in models[0].state_dict().items() if k.startswith("layers.")},
                              strict=False)
    grown = [dict(grow_model(m, m.config.replace(d_model=64, n_heads=8, d_qk=16, d_v=24, d_ff=96), name,
                             generator=gen(3)).named_parameters()) for m in models]
    blocks = [n for n in grown[0] if n.startswith("layers.")]
    assert {n: torch.equal(grown[0][n], grown[1][n]) for n in blocks} == {n: True for n in blocks}


@pytest.mark.parametrize("key", [None, ""])
def test_a_draw_without_its_tensors_key_is_refused(key):
    """`GrowthContext.stream` (and `randn`/`rand` through it) needs the drawn tensor's name: a draw without
    one would come from a stream every unkeyed draw shares, so a unit grown alone would draw other numbers
    than the whole growth (issue 59). Refused with or without a generator."""
    from grow.growth.base import GrowthContext

    model = Transformer(BASE)
    for generator in (gen(1), None):
        ctx = GrowthContext(source=BASE, target=BASE, model=model, batches=[], generator=generator, stage=0,
                            state=None)
        with pytest.raises(ValueError, match="key"):
            ctx.stream(key)
        with pytest.raises((ValueError, TypeError)):
            ctx.randn((2, 2)) if key is None else ctx.randn((2, 2), key=key)
        with pytest.raises((ValueError, TypeError)):
            ctx.rand((2, 2)) if key is None else ctx.rand((2, 2), key=key)
        assert ctx.randn((2, 2), key="w").shape == (2, 2)


# ---------------------------------------------------------------------------------------------
# Which entries are new, and how the old ones' optimizer state maps (docs/strategies.md: `rescaled`)
# ---------------------------------------------------------------------------------------------
def _exact_strategies() -> list[str]:
    from grow.growth.base import strategy_class

    return [n for n in available() if strategy_class(n).exact_with is not None]


@pytest.mark.parametrize("case", ["h", "k", "v", "p", "E", "N"])
@pytest.mark.parametrize("name", _exact_strategies())
def test_every_kept_moment_is_the_old_one_in_the_grown_models_gradient_units(name, case):
    """Every function-preserving strategy (its `exact_with`, noise 0), every dimension: at every old entry of a
    parameter that keeps its state (not `fresh`) the grown model's gradient is the old gradient / c (`rescaled`,
    a number or a factor per entry: net2net's split units take 1/c_j of theirs), float64 1e-10 relative; and the
    growth-aware AdamW moved onto the grown model keeps exp_avg / c, exp_avg_sq / c^2 there, zero elsewhere. Was:
    net2net's split units kept their moments unconverted (0.5x their gradient), hyperclone restarted every one."""
    from grow.growth.base import DIMS, strategy_class
    from grow.optim import GrowthAwareAdamW

    cls = strategy_class(name)
    model = trained_like()
    opts = {**cls.exact_with, **({"noise": 0.0} if "noise" in cls.option_defaults() else {})}
    tgt = DOUBLED.replace(**{f: getattr(BASE, f) for f in DIMS.values() if f != DIMS[case]}) \
        if name == "hyperclone" else target(case)
    batches = [(tokens(B=4, seed=s), tokens(B=4, seed=s)) for s in range(4)]
    opt = GrowthAwareAdamW(list(model.named_parameters()), lr=1e-2, weight_decay=0.1)
    idx = tokens(B=4, seed=5)
    for _ in range(2):
        model.zero_grad()
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt.step()
    before = {n: {b: t.clone() for b, t in st.items()} for n, st in opt.state.items()}
    res = grow(model, tgt, name, generator=gen(), stage=1, batch=batches, **opts)
    grads = []
    for m in (model, res.model):
        m.zero_grad()
        m(idx[:, :-1], idx[:, 1:])[1].backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    opt.grow(list(res.model.named_parameters()), res.param_map, 1, fresh=res.fresh, rescaled=res.rescaled)
    for old, (new, pos) in res.param_map.items():
        if new in res.fresh:
            continue
        flat = pos.reshape(-1)
        c = res.rescaled.get(new, 1.0)
        c = c.reshape(-1)[flat] if isinstance(c, torch.Tensor) else c
        want = grads[0][old].reshape(-1) / c
        got = grads[1][new].reshape(-1)[flat]
        assert float((got - want).abs().max()) <= 1e-10 * max(float(want.abs().max()), 1e-30), (old, new)
        m, v = opt.state[new]["exp_avg"].reshape(-1), opt.state[new]["exp_avg_sq"].reshape(-1)
        torch.testing.assert_close(m[flat], before[old]["exp_avg"].reshape(-1) / c, rtol=1e-14, atol=0)
        torch.testing.assert_close(v[flat], before[old]["exp_avg_sq"].reshape(-1) / c ** 2, rtol=1e-14, atol=0)
        rest = torch.ones_like(m, dtype=torch.bool)
        rest[flat] = False
        assert not m[rest].any() and not v[rest].any()
