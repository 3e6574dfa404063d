"""The warm-start and depth operators of issue 48 (docs/strategies.md, "shrink_perturb, llama_pro, dus; training only the new layers; the MIDAS and SPARKLING recipes"): ``shrink_perturb`` (Ash & Adams,
NeurIPS 2020, as Mallik et al., arXiv 2605.13405, use it), ``llama_pro`` (Wu et al., ACL 2024) and ``dus``
(Kim et al., arXiv 2312.15166)."""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch

from grow.growth import grow, new_entry_mask
from grow.growth.zero import Zero
from grow.model import init_like
from tests.helpers import BASE, gen, target, tokens, trained_like

LLAMA = BASE.replace(activation="swiglu", positions="rope", mlp_bias=False, n_heads=4, n_kv_heads=2, d_qk=4, d_v=4)


# grown dimension -> target, per family (a rotary model grows k under a rope_dim anchor: test_llama_growth)
SP_TARGETS = [(BASE, target(case)) for case in ("h", "k", "p", "E", "N", "all")] + [
    (LLAMA, LLAMA.replace(**change)) for change in
    (dict(d_model=24), dict(d_ff=40), dict(n_heads=8), dict(n_layers=4), dict(n_layers=4, d_model=24, n_heads=8, d_ff=40))]


@pytest.mark.parametrize("cfg, tgt", SP_TARGETS, ids=[f"{'llama' if c is LLAMA else 'gpt'}-{i}" for i, (c, _) in
                                                      enumerate(SP_TARGETS)])
def test_shrink_perturb_is_lambda_times_the_zero_padding_plus_sigma_times_a_fresh_initialization(cfg, tgt):
    """Old entries = lambda x (the zero strategy's placed, rescaled old value) + sigma x z, new entries = sigma x z,
    z one draw of the grown model's initializer per parameter, from that parameter's own stream of the growth's
    finish (docs/strategies.md "Random draws": seeded by blake2b of "<growth seed>/finish/<name>")."""
    model, lam, sigma = trained_like(cfg), 0.3, 0.05
    grown = grow(model, tgt, "shrink_perturb", generator=gen(7), shrink=lam, noise=sigma)
    padded = grow(model, tgt, _ZeroPad(), generator=gen(7))  # the same placement, every new entry 0
    masks = new_entry_mask(grown.param_map, grown.model)
    assert grown.param_map.keys() == padded.param_map.keys()
    for name, p in grown.model.named_parameters():
        text = f"{gen(7).initial_seed()}/finish/{name}".encode()
        draws = torch.Generator().manual_seed(int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1)
        z = init_like(tgt, name, p.shape, dtype=torch.float64, generator=draws)
        pad = padded.model.get_parameter(name)
        assert torch.equal(pad[masks[name]], torch.zeros_like(pad[masks[name]]))
        assert torch.allclose(p, lam * pad + sigma * z, rtol=0, atol=1e-15), name
        assert torch.allclose(p[masks[name]], sigma * z[masks[name]], rtol=0, atol=1e-15), name
    assert grown.metrics == {"shrink_perturb/shrink": lam, "shrink_perturb/noise": sigma}


class _ZeroPad(Zero):
    """Zero padding: every new entry 0, constrained or free."""

    def free_values(self, ctx, site, slot):
        return self.constrained_values(ctx, site, slot)


def test_shrink_perturb_at_lambda_one_and_no_noise_is_the_function_preserving_zero_padding():
    model, idx = trained_like(), tokens()
    res = grow(model, target("all"), "shrink_perturb", generator=gen(), shrink=1.0, noise=0.0)
    with torch.no_grad():
        assert float((res.model(idx) - model(idx)).abs().max()) <= 1e-10 * float(model(idx).abs().max())


def test_shrink_perturb_defaults_are_ash_and_adams_reference_values():
    """lambda = 0.4, sigma = 0.1: JordanAsh/warm_start run.py's --shrink / --perturb defaults (and its README's
    command), in its YAML, which the strategy takes them from."""
    import yaml

    from grow.errors import CONFIG_DIR
    from grow.growth.shrink_perturb import ShrinkPerturb

    node = yaml.safe_load((CONFIG_DIR / "strategy" / "shrink_perturb.yaml").read_text())
    built = ShrinkPerturb().options
    assert (node["shrink"], node["noise"]) == (built["shrink"], built["noise"]) == (0.4, 0.1)


@pytest.mark.parametrize("parametrization", ["standard", "mup"])
def test_shrink_perturb_noise_is_a_fresh_initialization_of_the_grown_model_in_every_parametrization(parametrization):
    """h 64 -> 128 at lambda = 0, sigma = 1: every grown parameter is the noise alone, and its effective std
    (W_out: x its forward multiplier, 1/m' under mup) is a fresh model's at the grown size, within 5% over
    its thousands of entries (was 2.001x for W_out under mup: the mup rescale ran after the noise)."""
    from grow.model import Transformer

    mup_cfg = dict(parametrization="mup", mup_base_width=32) if parametrization == "mup" else {}
    small = BASE.replace(d_model=64, d_ff=128, d_qk=16, d_v=16, n_heads=4, vocab_size=256, **mup_cfg)
    big = small.replace(d_model=128)
    model = Transformer(small, generator=torch.Generator().manual_seed(0)).double()
    grown = grow(model, big, "shrink_perturb", generator=gen(5), stage=1, shrink=0.0, noise=1.0).model
    fresh = Transformer(big, generator=torch.Generator().manual_seed(1)).double()
    for name in ("lm_head.weight", "wte.weight", "layers.0.attn.q.weight", "layers.1.mlp.fc2.weight"):
        std = [float(m.get_parameter(name).detach().std()) * (m.lm_head.mult if name == "lm_head.weight" else 1.0)
               for m in (grown, fresh)]
        assert std[0] == pytest.approx(std[1], rel=0.05), (name, std[0] / std[1])
    # exactly: W_out is the grown model's initializer's draw from its stream, read through a fresh model's multiplier
    text = f"{gen(5).initial_seed()}/finish/lm_head.weight".encode()
    draws = torch.Generator().manual_seed(int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1)
    z = init_like(big, "lm_head.weight", grown.lm_head.weight.shape, dtype=torch.float64, generator=draws)
    torch.testing.assert_close(grown.lm_head.weight.detach(), z, rtol=1e-15, atol=1e-18)
    assert grown.lm_head.mult == pytest.approx(fresh.lm_head.mult, rel=1e-15)


def test_shrink_perturb_restarts_the_optimizer_by_default_as_the_reference_and_keeps_it_on_request():
    """moments=reset (JordanAsh/warm_start builds a new optimizer every round): every parameter fresh, so after the
    growth the grown AdamW steps exactly as a new AdamW on the grown model (float64, 1e-15); moments=keep: no
    parameter fresh, the zero padding's map and rescalings (what keeps the function at lambda = 1, sigma = 0)."""
    from grow.optim import GrowthAwareAdamW

    model, idx = trained_like(), tokens(B=4)
    opt = GrowthAwareAdamW(list(model.named_parameters()), lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        model.zero_grad()
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt.step()
    res = grow(model, target("all"), "shrink_perturb", generator=gen(), stage=1)
    assert res.fresh == {n for n, _ in res.model.named_parameters()} and res.rescaled == {}
    twin = copy.deepcopy(res.model)
    opt.grow(list(res.model.named_parameters()), res.param_map, 1, fresh=res.fresh, rescaled=res.rescaled)
    new = GrowthAwareAdamW(list(twin.named_parameters()), lr=1e-2, weight_decay=0.1)
    for m, o in ((res.model, opt), (twin, new)):
        for _ in range(2):
            m.zero_grad()
            m(idx[:, :-1], idx[:, 1:])[1].backward()
            o.step()
    for (name, a), (_, b) in zip(res.model.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-15, atol=1e-15, msg=name)
    kept = grow(model, target("all"), "shrink_perturb", generator=gen(), stage=1, moments="keep")
    padded = grow(model, target("all"), _ZeroPad(), generator=gen(), stage=1)
    assert kept.fresh == set() and kept.rescaled == padded.rescaled != {}


def test_shrink_perturb_by_units_draws_only_what_each_unit_holds():
    """A growth by units (docs/distributed.md, "FSDP2") draws, over all its units, the whole growth's noise once: as many
    initializer draws, of as many entries, as one process growing the whole model (was: every unit drew the
    whole grown model's noise and kept its own share), and the same values (test_fsdp_growth)."""
    from unittest import mock

    import grow.growth.base as growth_base
    from grow.growth.units import grow_by_units

    model = trained_like(BASE.replace(tie_embeddings=False))
    tgt = target("all", model.config)
    drawn: list[int] = []
    real = growth_base.init_like

    def counted(cfg, name, shape, **kw):
        drawn.append(int(torch.Size(shape).numel()))
        return real(cfg, name, shape, **kw)

    with mock.patch.object(growth_base, "init_like", counted):
        grow(model, tgt, "shrink_perturb", generator=gen(3), stage=1)
        whole, drawn[:] = list(drawn), []
        sd = model.state_dict()
        skeleton = {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
        grow_by_units(model.config, skeleton, sd.__getitem__, tgt, "shrink_perturb", lambda n, t: None,
                      generator=gen(3), stage=1)
    assert (len(drawn), sum(drawn)) == (len(whole), sum(whole))
    assert sum(whole) == tgt.num_params()


@pytest.mark.parametrize("option, value", [("shrink", -0.1), ("noise", "big"), ("shrink", True), ("moments", "zero")])
def test_shrink_perturb_refuses_a_bad_option(option, value):
    with pytest.raises(ValueError, match=f"{option}="):
        grow(trained_like(), target("p"), "shrink_perturb", **{option: value})


# ---------------------------------------------------------------------------------------------
# llama_pro and dus: the block orders
# ---------------------------------------------------------------------------------------------
def reference_block_expansion(original_layers: int, layers: int) -> list[tuple[int, bool]]:
    """TencentARC/LLaMA-Pro scripts/block_expansion.py's loop, re-derived: for each output layer, (the input
    layer its tensors come from, whether its down_proj and o_proj are zeros). Its lines:
        split = int(args.original_layers / (args.layers - args.original_layers))
        for i in range(args.original_layers):
            <copy layer i to layer_cnt>; layer_cnt += 1
            if (i+1) % split == 0: <copy layer i to layer_cnt, 'down_proj' / 'o_proj' zeros_like>; layer_cnt += 1
        assert layer_cnt==args.layers"""
    split = int(original_layers / (layers - original_layers))
    out = []
    for i in range(original_layers):
        out.append((i, False))
        if (i + 1) % split == 0:
            out.append((i, True))
    assert len(out) == layers
    return out


@pytest.mark.parametrize("n_old, n_new", [(1, 2), (2, 4), (4, 5), (4, 6), (6, 8), (6, 9), (32, 40), (24, 32)])
def test_llama_pro_places_blocks_as_the_reference_script(n_old, n_new):
    from grow.growth.llama_pro import expansion_order
    from grow.growth.stack import copy_positions

    ref = reference_block_expansion(n_old, n_new)
    assert expansion_order(n_old, n_new) == [src for src, _ in ref]
    assert copy_positions(expansion_order(n_old, n_new)) == [j for j, (_, zeroed) in enumerate(ref) if zeroed]


@pytest.mark.parametrize("n_old, n_new", [(3, 5), (4, 7), (2, 5)])
def test_llama_pro_refuses_what_the_reference_asserts_against(n_old, n_new):
    from grow.growth.llama_pro import expansion_order

    with pytest.raises(ValueError, match=f"{n_old} -> {n_new} layers: LLaMA Pro"):
        expansion_order(n_old, n_new)


@pytest.mark.parametrize("name, n_new, text", [("llama_pro", 7, "4 -> 7 layers: LLaMA Pro"),
                                                ("dus", 9, "4 -> 9 layers: depth up-scaling")])
def test_a_block_copier_refuses_a_depth_its_order_cannot_reach_through_the_shared_check(name, n_new, text):
    """BlockCopies.check_transition asks the strategy's own order (`sources`): no subclass repeats the check."""
    from grow.growth.base import get_strategy
    from grow.growth.stack import BlockCopies

    strategy = get_strategy(name)
    assert isinstance(strategy, BlockCopies) and "check_transition" not in type(strategy).__dict__
    with pytest.raises(ValueError, match=text):
        strategy.check_transition(BASE.replace(n_layers=4), BASE.replace(n_layers=n_new))
    strategy.check_transition(BASE.replace(n_layers=4), BASE.replace(n_layers=8))  # a depth it reaches


@pytest.mark.parametrize("n_old, n_new, order", [
    (32, 48, list(range(24)) + list(range(8, 32))),  # SOLAR 10.7B: n = 32, m = 8
    (4, 6, [0, 1, 2, 1, 2, 3]), (3, 4, [0, 1, 1, 2]), (2, 4, [0, 1, 0, 1]), (1, 2, [0, 0])])
def test_dus_gives_the_solar_layer_order(n_old, n_new, order):
    """Kim et al. §2: the base model duplicated, the final m layers of the original and the initial m of the
    duplicate removed, concatenated: 2n - 2m layers."""
    from grow.growth.dus import dus_order

    assert dus_order(n_old, n_new) == order
    m = n_old - n_new // 2
    assert order == list(range(n_old))[: n_old - m] + list(range(n_old))[m:]


@pytest.mark.parametrize("n_old, n_new", [(4, 7), (3, 8)])
def test_dus_refuses_a_depth_it_cannot_reach(n_old, n_new):
    from grow.growth.dus import dus_order

    with pytest.raises(ValueError, match="2n - 2m"):
        dus_order(n_old, n_new)


@pytest.mark.parametrize("name, n_new", [("llama_pro", 6), ("dus", 6)])
@pytest.mark.parametrize("cfg", [BASE, LLAMA], ids=["gpt", "llama"])
def test_every_block_is_the_old_one_its_order_names(name, n_new, cfg):
    """Block i of the grown model equals old block s(i), W^O, W2 (and b2) of llama_pro's new blocks zero."""
    from grow.growth.dus import dus_order
    from grow.growth.llama_pro import expansion_order
    from grow.growth.stack import copy_positions

    model = trained_like(cfg.replace(n_layers=4))
    order = (expansion_order if name == "llama_pro" else dus_order)(4, n_new)
    res = grow(model, model.config.replace(n_layers=n_new), name, generator=gen())
    new = set(copy_positions(order))
    for i, layer in enumerate(res.model.layers):
        old = dict(model.layers[order[i]].named_parameters())
        for key, p in layer.named_parameters():
            zeroed = name == "llama_pro" and i in new and key in ("attn.o.weight", "mlp.fc2.weight", "mlp.fc2.bias")
            assert torch.equal(p, torch.zeros_like(p) if zeroed else old[key]), (i, key)
    mapped = {new_name.split(".")[1] for _, (new_name, _) in res.param_map.items() if new_name.startswith("layers.")}
    assert mapped == {str(i) for i in range(n_new) if i not in new}


# ---------------------------------------------------------------------------------------------
# From a pretrained LlamaForCausalLM: llama_pro (its new blocks trained alone) and dus, exported back
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A random LlamaForCausalLM with grouped heads (4 query heads on 2 key/value heads) at llama-tiny's sizes but
    2 layers, saved by save_pretrained, with the tiny data's tokenizer.json beside it."""
    import shutil

    transformers = pytest.importorskip("transformers")
    from grow import data as data_lib
    from tests.conftest import run_config
    from tests.helpers import LLAMA_RUN

    path = tmp_path_factory.mktemp("llama")
    run = run_config(*LLAMA_RUN)
    shutil.copy(data_lib.load(run.data, 32, log=lambda *a: None).tokenizer_path, path / "tokenizer.json")
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=32, rope_theta=10000.0, tie_word_embeddings=True,
                                      rms_norm_eps=1e-5)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def _hf64(path):
    import transformers

    from tests.helpers import in_float64

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    in_float64(hf)
    return hf


@pytest.mark.parametrize("name, n_new", [("llama_pro", 4), ("llama_pro", 3), ("dus", 4)])
def test_a_pretrained_llama_grown_by_llama_pro_or_dus_is_a_llama_for_causal_lm(llama_dir, name, n_new):
    """llama_pro keeps transformers' logits to 1e-10 (float64) at the growth; both export as a native
    LlamaForCausalLM computing the grown model's logits."""
    from grow.hf.llama import from_llama, to_llama
    from tests.helpers import in_float64, rel

    model = from_llama(llama_dir, dtype=torch.float64)
    grown = grow(model, model.config.replace(n_layers=n_new), name, generator=gen()).model
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(3))
    hf = to_llama(grown, torch.float64)
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.num_hidden_layers == n_new
    with torch.no_grad():
        ours = grown(x)
        if name == "llama_pro":
            assert rel(ours, _hf64(llama_dir)(x).logits) <= 1e-10
        in_float64(hf)
        assert rel(hf(x).logits, ours) <= 1e-10


@pytest.mark.parametrize("n_new", [3, 4])
def test_llama_pro_on_a_pretrained_llama_equals_the_reference_script_tensor_for_tensor(llama_dir, n_new):
    """TencentARC/LLaMA-Pro scripts/block_expansion.py applied to the saved LlamaForCausalLM's state dict (its loop
    re-derived: output layer j takes input layer i's tensors under the new index, an inserted one with o_proj and
    down_proj zeros, every non-layer tensor as is) equals grow's llama_pro growth exported by to_llama, bitwise."""
    from grow.hf.llama import from_llama, to_llama

    ckpt = _hf64(llama_dir).state_dict()
    ref = {}
    for j, (i, inserted) in enumerate(reference_block_expansion(2, n_new)):  # j: the output layer
        for k, v in ckpt.items():
            if f"layers.{i}." in k:
                zero = inserted and ("down_proj" in k or "o_proj" in k)
                ref[k.replace(f"layers.{i}.", f"layers.{j}.")] = torch.zeros_like(v) if zero else v
    ref.update({k: v for k, v in ckpt.items() if "layers" not in k})
    model = from_llama(llama_dir, dtype=torch.float64)
    ours = to_llama(grow(model, model.config.replace(n_layers=n_new), "llama_pro", generator=gen()).model,
                    torch.float64).state_dict()
    assert sorted(ours) == sorted(ref)
    for k in ref:
        assert torch.equal(ours[k], ref[k]), k


def test_llama_pro_with_only_the_new_blocks_trained_leaves_the_old_weights_bitwise_and_exports(
        llama_dir, tmp_path):
    """grow train init=<dir> strategy=llama_pro trainer.train_new_only=true: after the growth only the new blocks
    (grown layers 1 and 3 of 2 -> 4) have requires_grad and optimizer state; after training, every old block,
    the embeddings and the final norm are bitwise the growth's; the new blocks moved; the counted FLOPs are the
    plan's, stage 2's `frozen_flops_per_token`; the run exports as a LlamaForCausalLM."""
    import json

    import transformers

    from grow import events
    from grow.plan import frozen_flops_per_token
    from grow.train import Trainer
    from tests.conftest import grow_cli, run_config
    from tests.helpers import LLAMA_RUN

    args = [*LLAMA_RUN, "+schedule=exp", "schedule.stages=2", "schedule.grow=[n_layers]", "model.n_layers=4",
            f"init={llama_dir}", "strategy=llama_pro", "trainer.train_new_only=true", "trainer.max_tokens=12000"]
    run = run_config(*args, "precision=float64")
    at_growth = {}

    def grown(trainer, stage):
        at_growth.update({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        at_growth["trainable"] = sorted(n for n, p in trainer.model.named_parameters() if p.requires_grad)
        at_growth["opt"] = sorted(trainer.opt.params)

    trainer = Trainer(run, tmp_path / "run")
    with events.observing("grown", grown):
        summary = trainer.run()
    new = [n for n, _ in trainer.model.named_parameters() if n.split(".")[:2] in (["layers", "1"], ["layers", "3"])]
    assert at_growth["trainable"] == at_growth["opt"] == sorted(new)
    for n, p in trainer.model.named_parameters():
        if n in new:
            if not n.endswith(("attn.o.weight", "mlp.fc2.weight")):  # zero W^O / W2: the first steps move them
                continue
            assert not torch.equal(p, at_growth[n]), n
        else:
            assert torch.equal(p, at_growth[n]), n
    plan = run.plan
    assert plan[1].flops == frozen_flops_per_token(plan[1].cfg, [1, 3]) * plan[1].tokens
    assert summary["train_flops"] == plan.total_flops
    out = grow_cli("train", *args, f"hydra.run.dir={tmp_path / 'cli'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    exported = grow_cli("export", f"run={tmp_path / 'cli'}", f"out={tmp_path / 'out'}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(back).__name__ == "LlamaForCausalLM" and back.config.num_hidden_layers == 4
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["strategy"] == "llama_pro"


# ---------------------------------------------------------------------------------------------
# trainer.train_new_only: the FLOPs of a step with frozen layers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("trainable", [None, [1, 3], [2], [0], [3]])
def test_frozen_flops_per_token_is_what_autograd_runs(trainable):
    """torch's FlopCounterMode over one forward and backward of a 4-layer model whose only trainable parameters
    are the layers ``trainable`` (None: all of them) counts exactly `frozen_flops_per_token` x tokens (every
    matmul, the attention products included): below the lowest trainable layer nothing runs backward, above
    it the activation gradients do, and only trainable layers take weight gradients."""
    from torch.utils.flop_counter import FlopCounterMode

    from grow.growing import freeze_all_but
    from grow.model import Transformer
    from grow.plan import frozen_flops_per_token

    cfg = BASE.replace(n_layers=4)
    model = Transformer(cfg).double()
    if trainable is not None:
        freeze_all_but(model, {n for n, _ in model.named_parameters()
                               if n.startswith("layers.") and int(n.split(".")[1]) in trainable})
    idx = tokens(cfg)
    with FlopCounterMode(display=False) as counter:
        model(idx).sum().backward()
    per_token = cfg.flops_per_token() if trainable is None else frozen_flops_per_token(cfg, trainable)
    assert counter.get_total_flops() == per_token * idx.numel()
    if trainable is not None:
        assert frozen_flops_per_token(cfg, range(4)) + 2 * cfg.d_model * cfg.vocab_size == cfg.flops_per_token()


# ---------------------------------------------------------------------------------------------
# grow compare
# ---------------------------------------------------------------------------------------------
# One sweep per family feeds the tests of test_operators, test_ligo and test_llama_growth's `grow compare`:
# each arm's own assertions, one baseline and one report for all (hyperclone on the Llama family, as before).
COMPARED = {"tiny": ["ligo", "shrink_perturb", "zero", "llama_pro", "dus"],
            "llama-tiny": ["ligo", "shrink_perturb", "zero", "llama_pro", "dus", "hyperclone"]}


LIGO_STEPS = 10  # the reference's 100 would be most of the sweep's time


@pytest.fixture(scope="module", params=list(COMPARED))
def compared(request, tmp_path_factory):
    """(the family, the sweep directory, its summary's arms by name) of `grow compare` over COMPARED's strategies
    on that family at a toy size (6000 tokens, 11 steps: the default schedule's three growths; ligo's operator trains
    `LIGO_STEPS` steps, given to its arms alone by ``compare.options``, which the other strategies would refuse)."""
    import json

    from tests.conftest import TINY_RUN, grow_cli

    family, tmp = request.param, tmp_path_factory.mktemp("compare")
    d = tmp / "sweep"
    out = grow_cli("compare", f"strategy={','.join(COMPARED[family])}", *TINY_RUN, f"model={family}",
                   "trainer.max_tokens=6000", f"compare.options.ligo.steps={LIGO_STEPS}", f"hydra.sweep.dir={d}", cwd=tmp)
    assert out.returncode == 0, out.stderr[-4000:]
    arms = {a["arm"]: a for a in json.loads((d / "summary.json").read_text())["arms"]}
    return family, d, arms


def test_grow_compare_runs_the_new_strategies(compared):
    """`grow compare strategy=shrink_perturb,llama_pro,dus,...` at a toy size on both families (what `make sweep EXP=strategies
    ARGS="model=llama-small"` runs, smaller): every arm trains through the default schedule's growths, its counted
    FLOPs are its plan's, the report is written, llama_pro, zero and hyperclone preserve the function."""
    family, d, arms = compared
    assert list(arms) == ["baseline", *COMPARED[family]]
    assert all(a["accounting_check"] is True for a in arms.values())
    assert (d / "report.md").is_file()
    for name in ("llama_pro", "zero", "hyperclone"):
        if name in arms:
            assert arms[name]["max_abs_growth_delta"]["mean"] < 1e-4, name
    assert arms["shrink_perturb"]["max_abs_growth_delta"]["mean"] > 1e-3  # not function-preserving


def test_compare_ligo_zero_counts_the_operators_learning_steps(compared):
    """strategy=ligo (docs/strategies.md, "ligo") in that sweep: ligo's growth FLOPs in the report are, growth by growth,
    its logged steps x the growth batches' tokens x the grown stage's FLOPs per token, plus the two evaluations and
    the maps' forwards and backwards, each growth's ``ligo/operator_flops`` (zero's and shrink_perturb's: 0)."""
    import json

    from grow.model import TransformerConfig

    _, d, arms = compared
    assert arms["zero"]["runs"][0]["growth_flops"] == arms["shrink_perturb"]["runs"][0]["growth_flops"] == 0.0
    assert arms["shrink_perturb"]["runs"][0]["flops"] == arms["zero"]["runs"][0]["flops"]  # the same plan
    summary = json.loads((d / "ligo-seed0" / "summary.json").read_text())
    stages = {s["stage"]: TransformerConfig.from_dict(s["config"]) for s in summary["stage_plan"]}
    batch, nb = 16, 6  # trainer.batch_size (TINY_RUN), trainer.growth_batches (configs/train.yaml)
    expect, learning, done = 0.0, 0.0, 0.0
    for ev in summary["growth_events"]:
        tgt = stages[ev["growth/stage"]]
        tok, fpt = batch * tgt.seq_len, tgt.flops_per_token()
        assert ev["ligo/steps"] == LIGO_STEPS and ev["ligo/loss_end"] < ev["ligo/loss_start"]
        learning += ev["ligo/steps"] * tok * fpt
        steps = ev["ligo/steps"]
        expect += (steps * tok * fpt + 2 * nb * tok * fpt / 3 + (steps + 2) * ev["ligo/map_flops"]
                   + steps * ev["ligo/map_backward_flops"])
        assert ev["ligo/operator_flops"] == pytest.approx(expect - done, rel=1e-12)  # the panel's: the whole growth's
        done = expect
    assert len(summary["growth_events"]) == 3
    assert arms["ligo"]["runs"][0]["growth_flops"] == pytest.approx(expect, rel=1e-9) and expect > learning > 0
    assert arms["ligo"]["runs"][0]["flops"] == pytest.approx(arms["zero"]["runs"][0]["flops"] + expect, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# +experiment=midas and +experiment=sparkling
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("experiment", ["midas", "sparkling"])
def test_the_named_recipes_train_through_grow_train(experiment, tmp_path):
    """`grow train +experiment=<name>` at a toy size: the recipe's strategy, schedule and optimizer settings
    are the run's, and every growth happens (midas: depth only by middle copies; sparkling: widths x2 once,
    mid-run, the function kept, the new channels re-warmed)."""
    import json

    from grow.errors import CONFIG_DIR
    from grow.metrics import read_metrics
    from tests.conftest import TINY_RUN, grow_cli, run_config

    header = (CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text().split("\ndefaults:")[0]
    assert "arXiv" in header and "What it reproduces" in header and ("What it changes" in header or
                                                                      "What it does not" in header)
    args = [f"+experiment={experiment}", *TINY_RUN, "model.n_layers=4", "trainer.max_tokens=12000"]
    run = run_config(*args)
    plan = run.plan
    if experiment == "midas":
        assert run.strategy.name == "stack" and run.strategy.options["order"] == "middle"
        assert [s.cfg.n_layers for s in plan] == [1, 2, 3, 4]  # one block of b = 1 more per stage, not doubling
        assert all(s.cfg.replace(n_layers=4) == run.model for s in plan)  # depth only
        # PROP-1: stage i of 4 gets floor(12000 i / 10) tokens in whole steps of 16 x 32 = 512 (the last: the rest)
        assert [s.steps for s in plan] == [2, 5, 7, 9] and [s.tokens for s in plan[:3]] == [1024, 2560, 3584]
    else:
        assert run.strategy.name == "hyperclone" and run.optim.new_warmup_steps == 20
        assert [(s.cfg.d_model, s.cfg.d_ff, s.cfg.n_heads) for s in plan] == [(16, 32, 1), (32, 64, 2)]
        assert plan[0].tokens == pytest.approx(plan[1].tokens, rel=0.1)  # the growth mid-run
    out = grow_cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["strategy"] == run.strategy.name and summary["stages"] == len(plan)
    growths = [r for r in read_metrics(tmp_path / "run") if "growth/loss_after" in r]
    assert len(growths) == len(plan) - 1
    if experiment == "sparkling":
        assert abs(growths[0]["growth/delta"]) <= 1e-4  # hyperclone keeps the function (noise cancels in pairs)
        # the asymmetric reset in the run's optimizer: every entry of the stage-0 model is still born at stage 0
        # (its moments kept, its rate not re-warmed), every other entry at the growth (was: all of them re-born)
        from grow.checkpoint import latest

        raw = torch.load(latest(tmp_path / "run")["path"], weights_only=True)
        opt = raw["optimizer"]
        assert opt["stage"] == 1 and opt["stage_steps"][0] > opt["stage_steps"][1] > 0
        born = [torch.as_tensor(e["birth"]).expand(e["exp_avg"].shape) for e in opt["state"].values()]
        assert sum(int((b == 0).sum()) for b in born) == plan[0].params
        assert sum(int((b == 1).sum()) for b in born) == plan[1].params - plan[0].params


def test_a_run_training_only_new_layers_resumes_as_if_never_stopped(tmp_path):
    """trainer.train_new_only across two growths (llama_pro, 1 -> 2 -> 4 layers), stopped inside stage 2 and
    resumed: the resumed process freezes what the checkpoint's optimizer does not hold, and ends bitwise where
    the uninterrupted run ends (final loss, FLOPs, state); the FLOPs are the plan's."""
    from grow import train as train_mod
    from grow.checkpoint import Interrupted
    from tests.conftest import TINY_RUN, run_config
    from tests.helpers import StopAt

    args = [*TINY_RUN, "+schedule=exp", "schedule.stages=3", "schedule.grow=[n_layers]", "model.n_layers=4",
            "strategy=llama_pro", "trainer.train_new_only=true", "trainer.max_tokens=20000", "trainer.ckpt_every=5"]
    run = run_config(*args)  # composed once for the plan and the uninterrupted run (a RunConfig is frozen)
    plan = run.plan
    assert [s.cfg.n_layers for s in plan] == [1, 2, 4]
    ref = train_mod.train(run, tmp_path / "ref")
    assert ref["train_flops"] == plan.total_flops < sum(s.cfg.flops_per_token() * s.tokens for s in plan)
    mid = plan.start_step(1) + plan[1].steps // 2 + 1
    with pytest.raises(Interrupted):
        train_mod.train(run_config(*args), tmp_path / "run", stop=StopAt("step", step=mid + 1 if mid % 5 == 0 else mid))
    summary = train_mod.train(run_config(*args, f"resume={tmp_path / 'run'}"), tmp_path / "run")
    assert summary["final_val_loss"] == ref["final_val_loss"]
    assert summary["flops"] == ref["flops"] and summary["state"] == ref["state"]


def test_the_report_recounts_a_triggered_run_training_only_new_layers_at_its_frozen_cost(tmp_path):
    """Under a moving trigger (periodic, not the plan's boundaries) the report's expected FLOPs of a
    trainer.train_new_only run are each stage's frozen per-token cost x the tokens it trained: what it counted."""
    from grow import train as train_mod
    from grow.report.stats import expected_flops
    from grow.runs import FoundRun
    from tests.conftest import TINY_RUN, run_config

    args = [*TINY_RUN, "+schedule=exp", "schedule.stages=3", "schedule.grow=[n_layers]", "model.n_layers=4",
            "strategy=llama_pro", "trainer.train_new_only=true", "trainer.max_tokens=16000",
            "schedule/trigger=periodic", "schedule.trigger.every_tokens=3000"]
    run = run_config(*args)  # composed once for the plan and the run (a RunConfig is frozen)
    plan = run.plan
    s = train_mod.train(run, tmp_path / "run")
    trained = [t["steps"] for t in s["stages_trained"]]
    assert s["trigger"].startswith("periodic") and trained[:2] != [st.steps for st in plan][:2]
    full = sum(plan[t["stage"] - 1].cfg.flops_per_token() * t["tokens"] for t in s["stages_trained"])
    assert expected_flops(FoundRun(tmp_path, {"plan_flops": plan.total_flops}, s)) == s["train_flops"] < full
