"""`grow export` and `grow.hf.llama` (docs/hf.md): a Llama-family run after its growths, as a
``transformers`` ``LlamaForCausalLM`` directory, computes grow's logits (float32: 1e-5 relative; float64: 1e-10
with transformers' float32 rotary table and RMSNorms computed in float64, ~1e-7 as it ships), greedy-decodes
grow's tokens, and its tokenizer encodes as the run's. Everything is written by the test; no network."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the hf extra; make test installs it

from grow.data.config import EOT  # noqa: E402
from grow.growth import grow  # noqa: E402
from grow.hf.llama import to_llama, to_llama_state  # noqa: E402
from grow.model import Transformer, TransformerConfig  # noqa: E402
from grow.sampling import Decoding, generate  # noqa: E402
from tests.conftest import assert_one_line_error, grow_cli, run_config  # noqa: E402
from tests.helpers import LLAMA_RUN, in_float64, rel  # noqa: E402

SOURCE = TransformerConfig(vocab_size=61, seq_len=12, n_layers=2, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24,
                           activation="swiglu", positions="rope", rope_dim=8, rope_theta=500.0, mlp_bias=False)
TARGET = SOURCE.replace(d_model=32, n_heads=8, d_qk=8, d_v=8, d_ff=48)


@pytest.mark.parametrize("strategy", ["zero", "vt", "hyperclone", "msg"])
@pytest.mark.parametrize("n_kv_heads, tied", [(None, False), (2, True)])
def test_a_grown_llama_model_is_a_llama_for_causal_lm(strategy, n_kv_heads, tied):
    """Grown along h, E, k, v, p (multipliers from vt and hyperclone folded into the weights; hyperclone's
    W_out multiplier under tying written untied): transformers' logits equal grow's, float64."""
    source = SOURCE.replace(n_kv_heads=n_kv_heads, tie_embeddings=tied)
    torch.manual_seed(0)
    model = Transformer(source).double()
    grown = grow(model, TARGET.replace(n_kv_heads=n_kv_heads, tie_embeddings=tied), strategy,
                 generator=torch.Generator().manual_seed(1)).model
    if strategy == "msg":  # the masks are 0 at the growth: the ramp must end before an export
        with pytest.raises(ValueError, match="growth masks"):
            to_llama_state(grown)
        from grow.growth.msg import ramp

        while ramp(grown, 1):
            pass
    hf = to_llama(grown, torch.float64)
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, own_table = grown(x), hf(x).logits
        in_float64(hf)
        theirs = hf(x).logits
    assert rel(theirs, ours) <= 1e-10
    assert rel(own_table, ours) <= 1e-6  # transformers' float32 rotary table and norms: ~1e-7 here


def test_only_the_llama_family_at_its_own_head_size_is_a_llama():
    """What `llama_blockers` names; such a model exports with its own modeling file (next tests)."""
    for cfg, what in [(SOURCE, "rope_dim=8"), (TARGET.replace(positions="learned", rope_dim=None), "positions=learned"),
                      (TARGET.replace(d_v=4), "head_dim"), (TARGET.replace(activation="gelu"), "SwiGLU")]:
        with pytest.raises(ValueError, match=what):
            to_llama_state(Transformer(cfg))


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """llama-tiny grown through the default schedule (zero), then exported by the CLI."""
    from grow import train as train_mod

    root = tmp_path_factory.mktemp("hf")
    train_mod.train(run_config(*LLAMA_RUN, "+schedule=exp", "trainer.max_tokens=12000"), root / "run")
    out = grow_cli("export", f"run={root / 'run'}", f"out={root / 'out'}", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "run", root / "out"


def test_the_exported_directory_loads_with_auto_classes_and_computes_grows_logits(llama_run):
    from grow import runs

    run, out = llama_run
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                "tokenizer_config.json", "generation_config.json", "README.md"}
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.dtype == torch.float32
    model, payload = runs.load_model(runs.find_checkpoint(run, None))
    x = torch.randint(0, model.config.vocab_size, (2, model.config.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(hf(x).logits, model(x)) <= 1e-5
    # the tokenizer encodes as the run's; greedy decoding gives grow's tokens
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ours, _ = runs.load_tokenizer(run, payload["config"])
    text = "def main(argv):\n    return 0"
    assert tok(text, add_special_tokens=False)["input_ids"] == ours.encode(text).ids
    eot = ours.token_to_id(EOT)
    assert tok.eos_token_id == tok.bos_token_id == eot == hf.generation_config.eos_token_id
    prompt = torch.tensor([[eot, *ours.encode("def ").ids]])
    want = generate(model, prompt, 10, Decoding(0.0, vocab=ours.get_vocab_size(), stop=eot))
    with torch.no_grad():
        got = hf.generate(prompt, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(prompt))
    n = min(got.shape[1], want.shape[1])
    assert got[0, :n].tolist() == want[0, :n].tolist()
    card = (out / "README.md").read_text()
    assert "LlamaForCausalLM" in card and "final validation loss" in card and "zero" in card


def test_export_refuses_in_one_line(llama_run, tmp_path):
    run, out = llama_run
    assert_one_line_error(grow_cli("export", f"run={run}", f"out={out}", cwd=tmp_path), "out")  # not empty
    assert_one_line_error(grow_cli("export", f"run={run}", f"out={tmp_path / 'x'}", "dtype=int8", cwd=tmp_path),
                          "dtype")
    assert_one_line_error(grow_cli("export", f"out={tmp_path / 'y'}", cwd=tmp_path), "run")


@pytest.mark.parametrize("strategy", ["zero", "vt", "hyperclone", "net2net"])
@pytest.mark.parametrize("cfg", [
    TransformerConfig(vocab_size=61, seq_len=12, n_layers=2, d_model=16, n_heads=2, d_qk=4, d_v=6, d_ff=24),
    SOURCE.replace(n_kv_heads=2, tie_embeddings=True)], ids=["learned", "llama-mid-plan"])
def test_any_grown_model_is_a_grow_for_causal_lm_with_its_modeling_file(cfg, strategy, tmp_path):
    """The learned-position family (d_qk != d_v) and a Llama stage before the end of its plan (head size 4,
    rotary table anchored at 8): grown, saved with the modeling file, loaded by AutoModelForCausalLM with
    trust_remote_code: equal logits in float64 (1e-10), and greedy generate gives grow's tokens."""
    from grow.hf.remote import save_remote, to_remote

    torch.manual_seed(0)
    model = Transformer(cfg).double()
    target = cfg.replace(d_model=32, d_ff=48, n_heads=2 * cfg.n_heads)
    opts = {"noise": 0.0} if strategy == "net2net" else {}
    grown = grow(model, target, strategy, generator=torch.Generator().manual_seed(1), **opts).model
    save_remote(to_remote(grown, torch.float64), tmp_path)
    assert (tmp_path / "modeling_grow.py").is_file() and (tmp_path / "grow_model.py").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, dtype=torch.float64)
    assert type(hf).__name__ == "GrowForCausalLM"
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert rel(hf(x).logits, grown(x)) <= 1e-10
        got = hf.generate(x[:1, :3], max_new_tokens=6, do_sample=False)
    want = generate(grown, x[:1, :3], 6, Decoding(0.0))
    assert got.tolist() == want.tolist()


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """model=tiny (learned positions, GELU) grown through the default schedule, exported by the CLI: a
    GrowForCausalLM with grow's own code."""
    from grow import train as train_mod

    root = tmp_path_factory.mktemp("gpt")
    train_mod.train(run_config("model=tiny", *LLAMA_RUN[1:], "+schedule=exp", "trainer.max_tokens=12000"), root / "run")
    out = grow_cli("export", f"run={root / 'run'}", f"out={root / 'out'}", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "run", root / "out", out.stdout


def test_a_learned_position_run_exports_and_loads_with_its_modeling_file(gpt_run):
    """The float32 export computes the run's logits; the printed hint and the card say trust_remote_code=True
    for the model and the tokenizer, and the tokenizer_config names a class every transformers version has."""
    import json

    from grow import runs

    run, out, printed = gpt_run
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    model, _ = runs.load_model(runs.find_checkpoint(run, None))
    x = torch.randint(0, model.config.vocab_size, (2, model.config.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(hf(x).logits, model(x)) <= 1e-5
    for text in (printed, (out / "README.md").read_text()):
        assert "AutoModelForCausalLM.from_pretrained(" in text and "AutoTokenizer.from_pretrained(" in text
        assert text.count("trust_remote_code=True") == 2, text
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert type(transformers.PreTrainedTokenizerFast.from_pretrained(out)).__name__ in ("PreTrainedTokenizerFast",
                                                                                         "TokenizersBackend")


def test_the_exported_code_is_grow_model_verbatim_and_hf_holds_no_second_transformer(gpt_run):
    """The export's grow_model.py is grow/model.py byte for byte, its modeling_grow.py grow.hf's thin wrapper;
    no module of grow/hf defines a layer of its own (the one nn.Module there is the PreTrainedModel wrapper)."""
    import ast
    from pathlib import Path

    import grow.hf
    import grow.model

    _, out, _ = gpt_run
    hf_dir = Path(grow.hf.__file__).parent
    assert (out / "grow_model.py").read_bytes() == Path(grow.model.__file__).read_bytes()
    assert (out / "modeling_grow.py").read_bytes() == (hf_dir / "modeling_grow.py").read_bytes()
    classes = {node.name: [ast.unparse(b) for b in node.bases] for path in hf_dir.glob("*.py")
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
    assert not [name for name, bases in classes.items() if any("Module" in b for b in bases)], classes
    assert set(classes["GrowForCausalLM"]) == {"PreTrainedModel", "GenerationMixin"}


def test_every_exported_file_has_the_umask_mode(gpt_run, llama_run):
    """model.safetensors too (transformers writes it 0600): every file 0666 less the umask, as a plain write."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    for out in (gpt_run[1], llama_run[1]):
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
        assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_generate_with_default_arguments_gives_grows_greedy_tokens(kind, gpt_run, llama_run):
    """``hf.generate(prompt)`` with nothing else (transformers' defaults: greedy, its length and cache settings)
    on both exports: the tokens ``grow sample temperature=0`` draws."""
    from grow import runs

    run, out = (gpt_run[0], gpt_run[1]) if kind == "gpt" else llama_run
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=kind == "gpt").eval()
    model, payload = runs.load_model(runs.find_checkpoint(run, None))
    ours, _ = runs.load_tokenizer(run, payload["config"])
    eot = ours.token_to_id(EOT)
    prompt = torch.tensor([[eot, *ours.encode("def ").ids]])
    with torch.no_grad():
        got = hf.generate(prompt)
    want = generate(model, prompt, got.shape[1] - prompt.shape[1], Decoding(0.0, vocab=ours.get_vocab_size(), stop=eot))
    assert got.shape[1] > prompt.shape[1]
    assert got[0].tolist() == want[0, :got.shape[1]].tolist()


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_init_from_either_export_never_prompts_and_trains_on(kind, gpt_run, llama_run, tmp_path, monkeypatch):
    """``grow train init=<export>`` with stdin at its end: grow reads config.json and the safetensors
    itself (no code of the directory runs, transformers asks nothing: a prompt would meet EOF and fail the
    run) and trains on."""
    import io
    import json
    import sys

    out = gpt_run[1] if kind == "gpt" else llama_run[1]
    model = "model=tiny" if kind == "gpt" else "model=llama-tiny"
    args = [model, *LLAMA_RUN[1:], "trainer.max_tokens=1000", f"init={out}", f"hydra.run.dir={tmp_path / 'run'}"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    done = grow_cli("train", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "custom code" not in done.stdout + done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["init"] == str(out)


def test_a_run_starts_from_grows_own_export_with_its_logits(gpt_run, tmp_path):
    """Stage 0 of ``init=<GrowForCausalLM export>`` computes the export's logits (float64, 1e-12), and a
    run whose learned positions are for another context is refused in one line naming model.seq_len."""
    from grow.train import Trainer

    _, out, _ = gpt_run
    run = run_config("model=tiny", *LLAMA_RUN[1:], f"init={out}", "precision=float64")
    trainer = Trainer(run, tmp_path / "f64")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float64).eval()
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(trainer.model(x), hf(x).logits) <= 1e-12
    refused = grow_cli("train", "model=tiny", *LLAMA_RUN[1:], f"init={out}", "model.seq_len=16", cwd=tmp_path)
    assert_one_line_error(refused, "model.seq_len")
    # an export written before the wrapper (grow's names without ``model.``) reads the same
    import shutil

    from safetensors.torch import load_file, save_file

    from grow.hf.remote import remote_model

    old = tmp_path / "old"
    shutil.copytree(out, old)
    save_file({k.removeprefix("model."): v for k, v in load_file(str(out / "model.safetensors")).items()},
              str(old / "model.safetensors"))
    cfg = trainer.model.config
    a, b = dict(remote_model(old, cfg).named_parameters()), dict(remote_model(out, cfg).named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_without_the_extra_export_names_it(monkeypatch):
    import sys

    from grow.errors import ConfigError
    from grow.hf import require

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[hf\]"'):
        require("command", "export", "safetensors", "transformers")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny random LlamaForCausalLM (grouped-query attention, untied embeddings) saved by save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=12,
                         rope_theta=500.0, tie_word_embeddings=False, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config).double().eval()
    path = tmp_path_factory.mktemp("pretrained")
    hf.save_pretrained(path)
    in_float64(hf)
    return hf, path


@pytest.mark.parametrize("strategy", [None, "zero", "hyperclone"])
def test_a_pretrained_llama_loads_into_grow_and_grows_exactly(pretrained, strategy):
    """`from_llama`: config.json + safetensors -> a grow Transformer with transformers' logits (float64, both
    computing in float64: equal to 1e-12); grown by zero or hyperclone (h, E, p doubled), still equal."""
    from grow.hf.llama import from_llama

    hf, path = pretrained
    model = from_llama(path, dtype=torch.float64)
    cfg = model.config
    assert (cfg.kv_heads, cfg.n_heads, cfg.d_qk, cfg.tie_embeddings) == (2, 4, 4, False)
    assert cfg.norm_eps == pytest.approx(1e-5 * 16)  # eps on the sum of squares: rms_norm_eps x h
    if strategy is not None:
        model = grow(model, cfg.replace(d_model=32, n_heads=8, d_ff=48), strategy,
                     generator=torch.Generator().manual_seed(1)).model
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert rel(model(x), hf(x).logits) <= 1e-12


def test_what_grow_cannot_express_is_refused_in_one_line(pretrained, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from grow.hf.llama import from_llama

    GPT2LMHeadModel(GPT2Config(vocab_size=61, n_positions=12, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        tmp_path / "gpt2")
    with pytest.raises(ValueError, match="model_type='gpt2'") as err:
        from_llama(tmp_path / "gpt2")
    assert "\n" not in str(err.value)
    _, path = pretrained
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match="no model.safetensors"):
        from_llama(broken)


@pytest.fixture(scope="module")
def pretrained_run_dir(llama_run, tmp_path_factory):
    """A tiny random LlamaForCausalLM at llama-tiny's first-stage-like size (h 16, two heads on two key/value
    heads, head size 4, MLP 32, one layer, tied) with a run's tokenizer.json beside it."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    run, _ = llama_run
    path = tmp_path_factory.mktemp("init")
    shutil.copy(run / "tokenizer.json", path / "tokenizer.json")
    config = LlamaConfig(vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=4, max_position_embeddings=32,
                         rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_a_run_starts_from_a_pretrained_llama_and_exports_back(pretrained_run_dir, tmp_path):
    """grow train model=llama-tiny +schedule=exp init=<dir>: stage 0 is the checkpoint (its logits, float64:
    1e-12 once transformers computes in float64), its sizes the schedule's start, the rotary base theta^(K/k0)
    (k 4 -> 8 keeps the pretrained frequencies); the run trains through its growths and exports back."""
    from grow.train import Trainer

    args = [*LLAMA_RUN, "+schedule=exp", "schedule.stages=2", "trainer.max_tokens=12000", f"init={pretrained_run_dir}"]
    run = run_config(*args, "precision=float64")
    assert run.plan[0].cfg.d_model == 16 and run.plan[0].cfg.n_layers == 1 and run.plan[0].cfg.d_qk == 4
    assert run.model.rope_theta == pytest.approx(10000.0 ** 2) and run.plan[0].cfg.rope_anchor == 8
    assert run.model.norm_eps == pytest.approx(1e-5 * 16) and run.model.tie_embeddings
    # the config file the run keeps says the same (RunConfig.replace)
    assert run.raw["model"]["rope_theta"] == run.model.rope_theta and run.raw["schedule"]["start"]["d_model"] == 16
    trainer = Trainer(run, tmp_path / "f64")
    hf = transformers.AutoModelForCausalLM.from_pretrained(pretrained_run_dir, dtype=torch.float64).eval()
    in_float64(hf)
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(trainer.model(x), hf(x).logits) <= 1e-12
    out = grow_cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"init: pretrained weights loaded from {pretrained_run_dir} ({trainer.model.num_params():,} parameters: "
            "stage 1's model)") in out.stdout  # said on the console (#45)
    import json

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["init"] == str(pretrained_run_dir) and summary["stages"] == 2
    exported = grow_cli("export", f"run={tmp_path / 'run'}", f"out={tmp_path / 'out'}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(back).__name__ == "LlamaForCausalLM" and back.config.head_dim == 8


@pytest.fixture(scope="module")
def bad_inits(pretrained_run_dir, tmp_path_factory) -> dict:
    """Directories ``init=`` cannot start from, built once: a GPT-2, a Llama without its weights, a Llama whose
    vocabulary is smaller than its tokenizer's ids."""
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("bad-inits")
    GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=32, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        root / "gpt2")
    shutil.copy(pretrained_run_dir / "tokenizer.json", root / "gpt2" / "tokenizer.json")
    (root / "broken").mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(pretrained_run_dir / name, root / "broken" / name)
    (root / "config-only").mkdir()  # neither weights nor tokenizer: both said at once
    shutil.copy(pretrained_run_dir / "config.json", root / "config-only" / "config.json")
    small = LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=2, head_dim=4, max_position_embeddings=32)
    LlamaForCausalLM(small).save_pretrained(root / "small-vocab")  # its tokenizer has 512 ids
    shutil.copy(pretrained_run_dir / "tokenizer.json", root / "small-vocab" / "tokenizer.json")
    return {f"init={name}": f"init={root / name}" for name in ("gpt2", "broken", "small-vocab", "config-only")}


@pytest.mark.parametrize("change, key, said", [
    ("+schedule.start.d_model=8", "schedule.start.d_model", "whose d_model is 16"),
    ("model.n_kv_heads=1", "model.n_kv_heads", "has n_kv_heads=2"),
    ("init=gpt2", "init", "gpt2"), ("init=broken", "init", "has no model.safetensors"),
    ("init=small-vocab", "init", "more than the model's vocabulary"),
    ("init=config-only", "init", "has no model.safetensors (the weights) and no tokenizer.json"),
    # exp's 4 stages from a model at half the final width: one growth, then two stages that grow nothing
    ("schedule.stages=4", "schedule.stages=4", "reaches the final model at stage 2, so the 2 stage(s) after it "
                                               "would grow nothing: schedule.stages=2")])
def test_a_pretrained_start_is_refused_in_one_line(pretrained_run_dir, bad_inits, tmp_path, change, key, said):
    """A stated start size that contradicts the checkpoint, another structure, a GPT-2 directory, a directory
    without its weights (or without weights and tokenizer), a tokenizer with more ids than the model's vocabulary,
    a schedule longer than the growths from the pretrained sizes: one line naming the key, exit 2, before any work."""
    init = bad_inits.get(change, f"init={pretrained_run_dir}")
    extra = [] if change.startswith("init=") else [change]
    out = grow_cli("train", *LLAMA_RUN, "+schedule=exp", "trainer.max_tokens=12000", init, *extra, cwd=tmp_path)
    assert_one_line_error(out, key)
    assert said in " ".join(out.stderr.split())
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_lm_evaluation_harness_scores_the_exported_model_as_grow_does(llama_run, tmp_path):
    """`grow eval harness=<task> harness_include=<dir>` on a multiple-choice task the test writes (a YAML and a
    jsonl, no network): the per-choice log-likelihoods lm-eval computed equal grow's own for the same strings
    after the document start (the exported tokenizer prepends `<|endoftext|>`, as grow sample does, and lm-eval
    encodes with the tokenizer's default) (float32: 1e-4 nats), its accuracy is grow's argmax accuracy, and the
    results JSON is in the run."""
    import json

    from grow import runs

    run, _ = llama_run
    items = [("def main", ["(argv):", "of the", "xyz"], 0), ("import", ["os", "banana", "the"], 1),
             ("class Foo", ["(object):", "bar baz", "!!"], 0), ("return", ["None", "0", "self"], 2)]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mc.jsonl").write_text("".join(json.dumps({"question": q, "choices": c, "label": y}) + "\n"
                                            for q, c, y in items))
    (tasks / "tiny_mc.yaml").write_text(
        "task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'mc.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    out = grow_cli("eval", f"run={run}", "harness=tiny_mc", f"harness_include={tasks}", "harness_limit=4",
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    saved = json.loads(open(result["path"]).read())
    assert result["path"].startswith(str(run / "harness"))
    model, payload = runs.load_model(runs.find_checkpoint(run, None))
    tok, _ = runs.load_tokenizer(run, payload["config"])
    eot = tok.token_to_id(EOT)
    correct = 0
    for sample, (question, choices, label) in zip(sorted(saved["samples"]["tiny_mc"], key=lambda s: s["doc_id"]),
                                                   items):
        ours = []
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            assert context == question and continuation.strip() in choices
            c, whole = [eot, *tok.encode(context).ids], [eot, *tok.encode(context + continuation).ids]
            cont = whole[len(c):]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([c + cont[:-1]]))[0].double(), -1)
            ll = float(sum(logp[len(c) - 1 + i, t] for i, t in enumerate(cont)))
            assert abs(ll - resp[0][0]) <= 1e-4, (context, continuation, ll, resp)
            ours.append(ll)
        correct += int(max(range(len(ours)), key=ours.__getitem__) == label)
    assert saved["results"]["tiny_mc"]["acc,none"] == pytest.approx(correct / len(items))


def test_a_harness_task_of_the_index_offline_is_one_line_at_once(llama_run, tmp_path, monkeypatch, capsys):
    """Offline (#45; 55 lines after 37 s of retries before): one line saying the task needs the Hub and how to
    run a local one, before lm-eval indexes its tasks or asks the Hub."""
    import lm_eval.tasks

    from grow import cli
    from tests.helpers import no_hub

    url = no_hub(monkeypatch)

    def index(*a, **k):
        raise AssertionError("lm-eval's task index was built")

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", index)
    monkeypatch.chdir(tmp_path)
    run, _ = llama_run
    before = sorted((run / "harness").glob("*")) if (run / "harness").exists() else None  # the fixture's run is shared
    with pytest.raises(SystemExit) as info:
        cli.main(["eval", f"run={run}", "harness=hellaswag", "harness_limit=2"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: harness='hellaswag': the index's tasks read their datasets from the Hub, and "
                               f"the Hugging Face Hub ({url}) is unreachable: ")
    assert "run a local task with harness_include=" in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert (sorted((run / "harness").glob("*")) if (run / "harness").exists() else None) == before  # nothing written


def test_the_harness_refuses_bad_input_in_one_line(llama_run, tmp_path):
    run, _ = llama_run
    assert_one_line_error(grow_cli("eval", f"run={run}", "harness=tiny_mc", f"harness_include={tmp_path / 'none'}",
                                   cwd=tmp_path), "harness_include")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(grow_cli("eval", f"run={run}", "harness=no_such_task", f"harness_include={tmp_path / 'empty'}",
                                   cwd=tmp_path), "harness")
    assert_one_line_error(grow_cli("eval", f"run={run}", "harness=tiny_mc", "harness_limit=0", cwd=tmp_path),
                          "harness_limit")
