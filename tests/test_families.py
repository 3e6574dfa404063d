"""The checkpoint families (docs/design.md, "Checkpoint families"; grow/families.py): transformers-made random
Llama (3.x rotary scaling), Mistral (sliding window), Qwen2 (q/k/v biases), Qwen3 (per-head q/k norms) and Gemma
(GeGLU, (1 + w) norms, sqrt(d) embedding scale, head_dim != d / heads) checkpoints, grouped-query heads, tied
and untied, imported with transformers' logits (float64 on both sides: <= 1e-10 relative; measured ~1e-15),
grown by zero in width and by llama_pro in depth without changing the function (<= 1e-10; dus: its block
order), exported and reloaded as the same class with grow's logits; what grow cannot express refused in one line."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the hf extra; make test installs it

from grow.errors import ConfigError  # noqa: E402
from grow.growth import grow  # noqa: E402
from grow.growth.base import get_strategy  # noqa: E402
from grow.hf.llama import from_llama, to_llama  # noqa: E402
from grow.model import Transformer, TransformerConfig, rope_freqs  # noqa: E402
from tests.helpers import in_float64, rel  # noqa: E402

TOL = 1e-10
V, T = 61, 12
COMMON = dict(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=T, rms_norm_eps=1e-5)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 4}  # short: every kind of frequency (kept, smoothed, divided)
FAMILIES = {  # family -> (class, its config's own keys)
    "llama": ("LlamaForCausalLM", dict(head_dim=4, rope_parameters=LLAMA3)),
    "mistral": ("MistralForCausalLM", dict(head_dim=4, sliding_window=5, rope_theta=500.0)),
    "qwen2": ("Qwen2ForCausalLM", dict(rope_theta=500.0)),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=4, rope_theta=500.0)),
    "gemma": ("GemmaForCausalLM", dict(head_dim=6, rope_theta=500.0)),  # 4 heads of 6 in h = 16
}


def hf_model(family: str, tied: bool, path, **changes):
    """A transformers-made random model of ``family``, every parameter moved off its initializer (norm gains,
    biases), saved with save_pretrained in ``path``; float64, eval."""
    cls, own = FAMILIES[family]
    config = transformers.CONFIG_MAPPING[family](**{**COMMON, **own, **changes}, tie_word_embeddings=tied)
    torch.manual_seed(0)
    hf = getattr(transformers, cls)(config).double().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(family, tied) -> (transformers model computing in float64, its directory)."""
    out = {}
    for family in FAMILIES:
        for tied in (False, True):
            path = tmp_path_factory.mktemp(f"{family}-{'tied' if tied else 'untied'}")
            hf = hf_model(family, tied, path)
            in_float64(hf)
            out[family, tied] = hf, path
    return out


def tokens(seed: int = 3) -> torch.Tensor:
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(seed))


CASES = [(f, t) for f in FAMILIES for t in (False, True)]


@pytest.mark.parametrize("family, tied", CASES)
def test_a_checkpoint_imports_with_transformers_logits(checkpoints, family, tied):
    hf, path = checkpoints[family, tied]
    model = from_llama(path, dtype=torch.float64)
    cfg = model.config
    assert (cfg.family, cfg.tie_embeddings, cfg.kv_heads, cfg.n_heads) == (family, tied, 2, 4)
    x = tokens()
    with torch.no_grad():
        assert rel(model(x), hf(x).logits) <= TOL


def test_each_flag_changes_the_function(checkpoints):
    """The flags are not idle: without Mistral's window, Llama 3's scaling, Qwen2's biases, Qwen3's norms or
    Gemma's scale and (1 + w) gains, the logits move by more than 1e-3 relative."""
    x = tokens()
    undo = {"mistral": {"sliding_window": None}, "llama": {"rope_factor": 1.0}, "qwen3": {"qk_norm": False},
            "gemma": {"embed_scale": 1.0}}
    for family, change in undo.items():
        model = from_llama(checkpoints[family, False][1], dtype=torch.float64)
        other = Transformer(model.config.replace(family=None, **change)).double()
        other.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            assert rel(other(x), model(x)) > 1e-3, family
    model = from_llama(checkpoints["qwen2", False][1], dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        for layer in model.layers:
            layer.attn.q.bias.zero_()
        assert rel(model(x), before) > 1e-3


def test_llama3_frequencies_equal_transformers_own(checkpoints):
    """grow's Llama 3 frequencies (float64) against transformers' float32 ones: float32 rounding apart."""
    hf, path = checkpoints["llama", False]
    cfg = from_llama(path).config
    theirs = transformers.LlamaForCausalLM(hf.config).model.rotary_emb.inv_freq.double()
    ours = rope_freqs(cfg.d_qk, cfg.rope_theta, None, None, cfg)
    assert rel(ours, theirs) <= 1e-6
    assert rel(rope_freqs(cfg.d_qk, cfg.rope_theta), theirs) > 0.1  # the scaling is there


WIDTH = {"d_model": 32, "n_heads": 8, "d_ff": 48}  # d_v, d_qk: one head_dim, so both or none (below)


def width(family: str) -> dict:
    """Every width the family can grow exactly: h, E, p, and k = v doubled (not k under Qwen3's q/k norms)."""
    k = FAMILIES[family][1].get("head_dim", 4)
    return WIDTH if family == "qwen3" else {**WIDTH, "d_qk": 2 * k, "d_v": 2 * k}


def grown(model: Transformer, target: TransformerConfig, name: str) -> Transformer:
    strategy = get_strategy(name)
    strategy.check_transition(model.config, target)
    return grow(model, target, strategy, generator=torch.Generator().manual_seed(1)).model


def anchored(path, family: str) -> Transformer:
    """The checkpoint as a stage-0 model whose rotary frequencies are anchored at the doubled head size (what
    `grow.hf.pretrained` does for a run that grows k: base theta^(K/K0), the same frequencies)."""
    model = from_llama(path, dtype=torch.float64)
    cfg = model.config
    if "d_qk" not in width(family):
        return model
    new = cfg.replace(rope_dim=2 * cfg.d_qk, rope_theta=cfg.rope_theta ** 2)
    out = Transformer(new).double()
    out.load_state_dict(model.state_dict())
    return out.eval()


@pytest.mark.parametrize("family, tied", CASES)
def test_zero_grows_every_width_exactly_and_exports_as_the_same_class(checkpoints, family, tied, tmp_path):
    hf, path = checkpoints[family, tied]
    model = anchored(path, family)
    x = tokens()
    with torch.no_grad():
        before = model(x)
        big = grown(model, model.config.replace(**width(family)), "zero")
        after = big(x)
    assert rel(after, before) <= TOL
    out = to_llama(big, torch.float64)
    out.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert type(back).__name__ == FAMILIES[family][0] and back.config.model_type == family
    in_float64(back)
    with torch.no_grad():
        theirs = back(x).logits
    if family != "qwen3":
        assert rel(theirs, after) <= TOL
        return
    # Qwen3: one rms_norm_eps for the hidden norms (eps / h: h grew) and the q/k norms (eps_qk / k: k did not);
    # the export writes the hidden one, so the q/k norms' eps on the mean moves from 1e-5 to 5e-6: each normalized
    # head changes by a relative |d eps| / (2 (mean square + eps)) at most (docs/design.md, "Checkpoint families"),
    # 7e-5 in these logits (heads of 4 random coordinates: small mean squares); at Qwen3's 1e-6, ten times less
    assert 0 < rel(theirs, after) <= 1e-3
    for module in back.modules():
        if type(module).__name__ == "Qwen3RMSNorm" and module.weight.shape[0] == big.config.d_qk:
            module.variance_epsilon = big.config.qk_norm_eps / big.config.d_qk
    in_float64(back)
    with torch.no_grad():
        assert rel(back(x).logits, after) <= TOL  # with the q/k norms' own eps: exact


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_pro_adds_identity_blocks_and_dus_its_block_order(checkpoints, family):
    hf, path = checkpoints[family, False]
    model = from_llama(path, dtype=torch.float64)
    x = tokens()
    with torch.no_grad():
        before = model(x)
        pro = grown(model, model.config.replace(n_layers=4), "llama_pro")
        assert rel(pro(x), before) <= TOL
        assert rel(to_llama(pro, torch.float64)(x).logits, before) <= 1e-6  # transformers' float32 norms
        dus = grown(model, model.config.replace(n_layers=4), "dus")  # SOLAR: blocks 0, 1 of two copies
    for n, source in enumerate([0, 1, 0, 1]):
        for name, p in dus.layers[n].named_parameters():
            assert torch.equal(p, model.layers[source].get_parameter(name)), (n, name)


def test_qk_norm_refuses_key_size_growth():
    from grow.growth.base import check_growth

    cfg = TransformerConfig(vocab_size=V, seq_len=T, n_layers=1, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24,
                            activation="swiglu", positions="rope", mlp_bias=False, qk_norm=True, family="qwen3")
    with pytest.raises(ValueError, match="per-head q/k norms"):
        check_growth(cfg, cfg.replace(d_qk=8, d_v=8, rope_dim=8))


@pytest.mark.parametrize("change, key", [
    ({"family": "qwen2", "qkv_bias": False}, "qkv_bias"),
    ({"family": "gemma"}, "activation"),
    ({"family": "qwen4"}, "family"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"rope_factor": 0.5}, "rope_factor"),
])
def test_a_config_breaking_a_family_rule_is_refused_naming_the_flag(change, key):
    base = dict(vocab_size=V, seq_len=T, n_layers=1, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24,
                activation="swiglu", positions="rope", mlp_bias=False)
    with pytest.raises(ConfigError) as err:
        TransformerConfig(**{**base, **change})
    assert err.value.key == key and "\n" not in str(err.value)


@pytest.mark.parametrize("family, change, field", [
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 1}, "use_sliding_window"),
    ("gemma", {"hidden_act": "relu"}, "hidden_act"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0}}, "rope_type"),
    ("qwen3", {"attention_bias": True}, "attention_bias"),
    ("llama", {"mlp_bias": True}, "mlp_bias"),
])
def test_what_a_family_sets_beyond_grow_is_refused_in_one_line(family, change, field, tmp_path):
    hf_model(family, False, tmp_path, **change)
    with pytest.raises(ValueError) as err:
        from_llama(tmp_path)
    assert str(err.value).startswith(f"{field}=") and "\n" not in str(err.value)


# ---- a run from a checkpoint: grow train init=<dir> ----------------------------------------------------------------
TEXT = "Growing transformers: width, depth, heads, and the checkpoints people actually have. 1234 + 5678 = 6912.\n"


def run_dir(root, family: str):
    """A transformers-made random model of ``family`` (4 layers, h 16, two query heads on one key/value head,
    tied; Gemma's heads of 6) saved with save_pretrained beside a byte-level BPE of its own whose end of sequence
    is '</s>' (not grow's '<|endoftext|>'), and a small text corpus: (directory, the data overrides)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = root / "ckpt"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT * 20], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>", "<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if family == "llama":  # Llama's tokenizer begins every text with <s>
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    cls, own = FAMILIES[family]
    own = {**own, "rope_parameters": {**LLAMA3, "original_max_position_embeddings": 16}} if family == "llama" else own
    config = transformers.CONFIG_MAPPING[family](
        **{**own, "vocab_size": 300, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4,
           "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": True, "eos_token_id": 1})
    torch.manual_seed(0)
    getattr(transformers, cls)(config).save_pretrained(path)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>").save_pretrained(path)
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(24):
        (corpus / f"{i:02d}.txt").write_text(f"document {i}. " + TEXT * 30)
    return path, ["data=text", f"data.files=[{corpus}/*.txt]", "trainer.progress=false"]


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return run_dir(tmp_path_factory.mktemp("qwen2-run"), "qwen2")


def test_init_alone_takes_the_family_sizes_and_tokenizer_from_the_checkpoint(qwen2_dir):
    """``grow train init=<dir> +schedule=depth model.n_layers=8 strategy=llama_pro``: nothing else (the CLI picks
    model=pretrained, `grow.commands.train.normalize`); every flag and size but the depth is the checkpoint's,
    its tokenizer the run's with its own end of sequence."""
    from grow.commands.train import normalize
    from tests.conftest import run_config

    path, data = qwen2_dir
    args = normalize([f"init={path}", "+schedule=depth", "model.n_layers=8", "strategy=llama_pro", *data])
    assert args[0] == "model=pretrained" and args[-1] == "~schedule.start"  # depth.yaml's 2 layers give way
    assert normalize(["model=llama-tiny", f"init={path}"]) == ["model=llama-tiny", f"init={path}"]
    run = run_config(*args)
    m = run.model
    assert (m.family, m.qkv_bias, m.n_layers, m.d_model, m.n_heads, m.kv_heads, m.d_qk, m.d_ff, m.vocab_size) == \
        ("qwen2", True, 8, 16, 2, 1, 8, 32, 300)
    assert run.plan[0].cfg.n_layers == 4 and m.norm_eps == pytest.approx(1e-6 * 16) and m.tie_embeddings
    assert run.data.tokenizer == str(path / "tokenizer.json") and run.data.eot_token == "</s>"
    wide = run_config(*normalize([f"init={path}", "+schedule=exp", "schedule.grow=[d_model]", "schedule.stages=2",
                                  "model.d_model=32", *data]))
    assert (wide.model.family, wide.model.d_model, wide.model.n_layers, wide.plan[0].cfg.d_model) == ("qwen2", 32, 4, 16)


def test_grow_compare_with_init_grows_the_checkpoint_against_its_model_from_scratch(qwen2_dir, tmp_path):
    """``grow compare init=<dir>``, as `grow train`'s: the grown arm starts from the checkpoint (model=pretrained
    picked by the CLI), the baseline trains the same final model, flags and tokenizer from scratch (init=auto: the
    checkpoint has 4 layers, not the baseline's 8). Before, the arms were composed with model=small's learned
    positions and refused."""
    import yaml

    from tests.conftest import grow_cli

    path, data = qwen2_dir
    out = grow_cli("compare", f"init={path}", "schedule=depth", "model.n_layers=8", "strategy=llama_pro", *data,
                   "trainer.max_tokens=512", "trainer.batch_size=2", "trainer.ckpt_every=0", "trainer.eval_batches=2",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    grown, base = (yaml.safe_load((tmp_path / "sweep" / arm / "config.yaml").read_text())
                   for arm in ("llama_pro-seed0", "baseline-seed0"))
    assert grown["init"] == str(path) and base["init"] == "auto"
    for cfg in (grown, base):
        assert (cfg["model"]["family"], cfg["model"]["n_layers"], cfg["data"]["tokenizer"]) == \
            ("qwen2", 8, str(path / "tokenizer.json"))


def test_a_model_that_contradicts_the_checkpoint_is_one_line(qwen2_dir, tmp_path):
    """model=gemma-tiny against a Qwen2 checkpoint; a Qwen2 whose window covers some layers only (grow cannot
    express it): each one line naming the key, exit 2, before any work."""
    import json
    import shutil

    from tests.conftest import assert_one_line_error, grow_cli

    path, data = qwen2_dir
    out = grow_cli("train", "model=gemma-tiny", f"init={path}", "+schedule=depth", "model.n_layers=8",
                   "strategy=llama_pro", *data, cwd=tmp_path)
    assert_one_line_error(out, "model.activation")
    windowed = tmp_path / "windowed"
    shutil.copytree(path, windowed)
    config = json.loads((windowed / "config.json").read_text())
    (windowed / "config.json").write_text(json.dumps({**config, "use_sliding_window": True, "max_window_layers": 2}))
    out = grow_cli("train", f"init={windowed}", "+schedule=depth", "model.n_layers=8", "strategy=llama_pro", *data,
                   cwd=tmp_path)
    assert_one_line_error(out, "init")
    assert "use_sliding_window=True" in out.stderr
    assert not list(tmp_path.rglob("metrics.jsonl"))


@pytest.mark.parametrize("family, strategy", [("qwen2", "llama_pro"), ("qwen2", "dus"), ("llama", "llama_pro"),
                                              ("mistral", "llama_pro"), ("qwen3", "llama_pro"), ("gemma", "dus")])
def test_the_experiment_grows_a_checkpoint_and_exports_it_as_its_class(qwen2_dir, family, strategy, tmp_path):
    """+experiment=grow-pretrained, float64: llama_pro's growth changes the loss by <= 1e-8 (dus's by more than
    1e-6); the export is the family's class with 8 layers whose float32 logits are the run's (1e-5), and greedy
    generate() gives grow's greedy tokens."""
    import json

    from grow import runs
    from tests.conftest import grow_cli

    path, data = qwen2_dir if family == "qwen2" else run_dir(tmp_path, family)
    out = grow_cli("train", "+experiment=grow-pretrained", f"init={path}", "model.n_layers=8", f"strategy={strategy}",
                   "precision=float64", "trainer.max_tokens=1024", "trainer.eval_batches=2", *data,
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)  # (the evaluations: no assertion reads them)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    delta = [e["growth/delta"] for e in events if "growth/delta" in e]
    assert len(delta) == 1 and (abs(delta[0]) <= 1e-8 if strategy == "llama_pro" else abs(delta[0]) > 1e-6)
    exported = grow_cli("export", f"run={tmp_path / 'run'}", f"out={tmp_path / 'out'}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == FAMILIES[family][0] and back.config.num_hidden_layers == 8
    model, _ = runs.load_model(runs.find_checkpoint(tmp_path / "run"), "cpu")
    x = tokens()[:, :8] % 300
    with torch.no_grad():
        assert rel(back(x).logits, model.float()(x)) <= 1e-5
    # the tokenizer is the checkpoint's, its '</s>' the document start the export prepends; greedy generate()
    # gives grow sample temperature=0's tokens
    from grow.sampling import Decoding, generate

    # (transformers 5's AutoTokenizer loads a qwen2 directory as Qwen2Tokenizer, which splits by its own regex, not
    # this test's byte-level pre-tokenizer; PreTrainedTokenizerFast reads tokenizer.json as written)
    tok = (transformers.PreTrainedTokenizerFast if family == "qwen2" else transformers.AutoTokenizer).from_pretrained(
        tmp_path / "out")
    prompt = tok("Growing transformers", return_tensors="pt")["input_ids"]
    assert prompt[0, 0].item() == tok.convert_tokens_to_ids("</s>") == 1 and len(tok) == 300
    ours = runs.load_tokenizer(tmp_path / "run", runs.load_model(runs.find_checkpoint(tmp_path / "run"))[1]["config"])[0]
    assert prompt[0].tolist() == [1, *ours.encode("Growing transformers").ids]  # grow sample's prompt
    assert (prompt[0, 1].item() == 2) == (family == "llama")  # the checkpoint's own <s>, where its template has it
    with torch.no_grad():
        got = back.generate(prompt, max_new_tokens=12, do_sample=False)
        want = generate(model.float(), prompt, 12, Decoding(0.0, vocab=300, stop=1))
    assert got.shape[1] > prompt.shape[1] and got[0].tolist() == want[0, :got.shape[1]].tolist()


# ---- docs/usage.md's table: every family x every registered strategy ------------------------------------------------
def strategy_names() -> list[str]:
    from grow.growth.base import available

    return sorted(available())


def batches(cfg: TransformerConfig, n: int = 8):
    g = torch.Generator().manual_seed(5)
    return [tuple(torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g) for _ in range(2)) for _ in range(n)]


@pytest.mark.parametrize("name", strategy_names())
@pytest.mark.parametrize("family", FAMILIES)
def test_every_strategy_grows_every_family(checkpoints, family, name):
    """The cells of docs/usage.md's families x strategies table: each strategy grows each family's checkpoint
    in every width the family allows and in depth at once (upcycle: into two experts), with the strategy's exact
    options; one that claims preservation (`Strategy.exact_with`) keeps the float64 logits to 1e-10, the others
    give finite logits of the grown config."""
    from grow.growth.base import strategy_class

    model = anchored(checkpoints[family, False][1], family)
    cfg = model.config
    target = cfg.replace(n_experts=2) if name == "upcycle" else cfg.replace(n_layers=4, **width(family))
    cls = strategy_class(name)
    strategy = get_strategy(name, **(cls.exact_with or {}))
    strategy.check_transition(cfg, target)
    x = tokens()
    with torch.no_grad():
        before = model(x)
    out = grow(model, target, strategy, batch=batches(cfg), generator=torch.Generator().manual_seed(3), stage=1).model
    with torch.no_grad():
        after = out(x)
    assert out.config == target and torch.isfinite(after).all()
    if cls.exact_with is not None:
        assert rel(after, before) <= TOL, rel(after, before)


def test_a_family_model_that_is_no_transformers_class_exports_with_grows_code(checkpoints, tmp_path):
    """An upcycled Qwen2 (experts: not Qwen2ForCausalLM, and Mixtral's layers have no q/k/v biases) and a Gemma
    mid-plan (k != v) are GrowForCausalLM exports (grow's own code, every flag kept): float64 logits to 1e-10."""
    from grow.hf.mixtral import mixtral_blockers
    from grow.hf.remote import save_remote, to_remote

    qwen2 = from_llama(checkpoints["qwen2", False][1], dtype=torch.float64)
    upcycled = grow(qwen2, qwen2.config.replace(n_experts=2), "upcycle", generator=torch.Generator().manual_seed(1)).model
    gemma = anchored(checkpoints["gemma", True][1], "gemma")
    midway = grow(gemma, gemma.config.replace(d_v=12), "zero", generator=torch.Generator().manual_seed(1)).model
    x = tokens()
    for n, model in enumerate([upcycled, midway]):
        assert mixtral_blockers(model.config) and (n == 1 or "family=qwen2" in " ".join(mixtral_blockers(model.config)))
        with pytest.raises(ValueError, match="not a"):
            to_llama(model)
        save_remote(to_remote(model, torch.float64), tmp_path / str(n))
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / str(n), trust_remote_code=True,
                                                                 dtype=torch.float64).eval()
        assert type(back).__name__ == "GrowForCausalLM"
        with torch.no_grad():
            assert rel(back(x).logits, model(x)) <= TOL


@pytest.mark.parametrize("name, family", [("llama3-tiny", "llama"), ("mistral-tiny", "mistral"), ("qwen2-tiny", "qwen2"),
                                          ("qwen3-tiny", "qwen3"), ("gemma-tiny", "gemma")])
def test_each_family_yaml_builds_a_model_that_exports_as_its_class(name, family):
    """configs/model/<family>-tiny.yaml: a valid config of the family (its rules hold), exported as the class."""
    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR
    from tests.helpers import model_of

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = model_of(compose("train", overrides=[f"model={name}", "data.vocab_size=512"]).model)
    assert cfg.family == family
    model = Transformer(cfg).double().eval()
    assert model.num_params() == cfg.num_params()  # the counts know the biases and the q/k norms
    hf = to_llama(model, torch.float64)
    assert type(hf).__name__ == FAMILIES[family][0]
    in_float64(hf)
    x = torch.randint(0, 512, (2, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(hf(x).logits, model(x)) <= TOL


def test_a_family_yaml_with_a_broken_rule_is_one_line(tmp_path):
    from tests.conftest import assert_one_line_error, grow_cli

    out = grow_cli("train", "model=qwen2-tiny", "model.qkv_bias=false", "data.vocab_size=512", cwd=tmp_path)
    assert_one_line_error(out, "model.qkv_bias")


def test_grow_schedule_plans_a_run_from_the_checkpoint_as_grow_train_would(qwen2_dir, tmp_path):
    from tests.conftest import grow_cli

    path, data = qwen2_dir
    out = grow_cli("schedule", f"init={path}", "+schedule=depth", "model.n_layers=8", "strategy=llama_pro", *data,
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    import re

    rows = [[c.strip() for c in line.split("│")[1:5]] for line in out.stdout.splitlines() if re.match(r"│ +[12] │", line)]
    assert rows[:2] == [["1", "4", "16", "2"], ["2", "8", "16", "2"]], out.stdout  # stage, N, h, E: 4 -> 8 layers


def test_a_qwen3_schedule_that_grows_the_key_size_is_one_line(tmp_path):
    from tests.conftest import TINY_DATA, assert_one_line_error, grow_cli

    out = grow_cli("train", "model=qwen3-tiny", "+schedule=exp", *TINY_DATA, cwd=tmp_path)
    assert_one_line_error(out, "strategy")
    assert "per-head q/k norms" in out.stderr


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_trained_from_scratch_grows_exactly_and_exports_as_its_class(family, tmp_path):
    """configs/model/<family>-tiny.yaml under +schedule=exp (h, E, p, N; zero; float64): every growth/delta
    <= 1e-8 in the trainer (optimizer state and biases through the growth), and the export is the class."""
    import json

    from tests.conftest import TINY_DATA, grow_cli

    name = "llama3-tiny" if family == "llama" else f"{family}-tiny"
    out = grow_cli("train", f"model={name}", "+schedule=exp", "schedule.grow=[d_model,n_heads,d_ff,n_layers]",
                   "schedule.stages=2", "precision=float64", "trainer.max_tokens=2560", "trainer.batch_size=8",
                   "trainer.progress=false", "trainer.eval_every=0", "trainer.full_val=false", "trainer.eval_batches=2",
                   *TINY_DATA, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    delta = [e["growth/delta"] for e in events if "growth/delta" in e]
    assert len(delta) == 1 and abs(delta[0]) <= 1e-8, delta
    exported = grow_cli("export", f"run={tmp_path / 'run'}", f"out={tmp_path / 'out'}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [FAMILIES[family][0]]


@pytest.mark.parametrize("family, change, field", [
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0}}, "rope_type"),
    ("mistral", {"hidden_act": "relu"}, "hidden_act"),
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 2}, "use_sliding_window"),
    ("qwen3", {"attention_bias": True}, "attention_bias"),
    ("gemma", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
])
def test_init_from_a_checkpoint_grow_cannot_express_is_one_line(qwen2_dir, family, change, field, tmp_path):
    """Each family's config.json with a field grow cannot express: grow train init=<dir> says which, one line,
    exit 2, before any work."""
    import json
    import shutil

    from tests.conftest import assert_one_line_error, grow_cli

    path, data = qwen2_dir
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    config = transformers.CONFIG_MAPPING[family](vocab_size=300, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                                 head_dim=8).to_dict()
    (bad / "config.json").write_text(json.dumps({**config, **change}))
    out = grow_cli("train", f"init={bad}", "+schedule=depth", "model.n_layers=8", "strategy=llama_pro", *data,
                   cwd=tmp_path)
    assert_one_line_error(out, "init")
    assert f"{field}=" in out.stderr
    assert not list(tmp_path.rglob("metrics.jsonl"))
