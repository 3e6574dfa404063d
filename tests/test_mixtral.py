"""The Llama-family mixture of experts as transformers' ``MixtralForCausalLM`` (`grow.hf.mixtral`, docs/hf.md):
an upcycled run exports natively (loads without remote code, logits and greedy tokens grow's), the mapping is
exact in float64, ``init=`` starts from a random tiny Mixtral made by transformers, and the GPT family's mixture
exports through grow's own modeling file. Everything is written by the test; no network."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the hf extra

from grow.data.config import EOT  # noqa: E402
from grow.growth import grow  # noqa: E402
from grow.hf.mixtral import to_mixtral, to_mixtral_state  # noqa: E402
from grow.model import Transformer, TransformerConfig  # noqa: E402
from grow.sampling import Decoding, generate  # noqa: E402
from tests.conftest import grow_cli, run_config  # noqa: E402
from tests.helpers import LLAMA_RUN, rel  # noqa: E402

DENSE = TransformerConfig(vocab_size=61, seq_len=12, n_layers=2, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24,
                          activation="swiglu", positions="rope", rope_theta=500.0, mlp_bias=False, n_kv_heads=2)
UPCYCLE = ["model.n_experts=4", "model.top_k=2", "+schedule=exp", "schedule.grow=[n_experts]",
           "+schedule.start.n_experts=1", "schedule.stages=2", "strategy=upcycle"]


def mixtral_in_float64(hf) -> None:
    """transformers computes the rotary table, every RMSNorm and the router's softmax in float32 whatever the
    model's dtype; for a float64 comparison of the mapping itself, the three in float64 here (the same formulas)."""
    cfg = hf.config
    theta, k = cfg.rope_parameters["rope_theta"], cfg.head_dim
    inv = 1.0 / theta ** (torch.arange(0, k, 2, dtype=torch.float64) / k)

    def rotary(x, position_ids):
        angles = position_ids[..., None].double() * inv
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def router(m):
        def forward(x):
            logits = torch.nn.functional.linear(x.reshape(-1, m.hidden_dim), m.weight)
            top, idx = torch.softmax(logits, dim=-1).topk(m.top_k, dim=-1)
            return logits, top / top.sum(dim=-1, keepdim=True), idx
        return forward

    hf.set_experts_implementation("eager")  # the default grouped_mm kernel takes no float64
    hf.model.rotary_emb.forward = rotary
    for module in hf.modules():
        name = type(module).__name__
        if name == "MixtralRMSNorm":
            module.forward = (lambda m: lambda x: m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                                + m.variance_epsilon))(module)
        elif name == "MixtralTopKRouter":
            module.forward = router(module)


@pytest.mark.parametrize("tied", [False, True])
def test_an_upcycled_llama_is_a_mixtral_for_causal_lm(tied):
    """Upcycled from a random dense model, the experts then made to differ: transformers' logits equal grow's,
    float64 (1e-10 with its float32 rotary table, norms and router computed in float64; 1e-6 as it ships)."""
    torch.manual_seed(0)
    dense = Transformer(DENSE.replace(tie_embeddings=tied)).double()
    model = grow(dense, dense.config.replace(n_experts=4, top_k=2), "upcycle",
                 generator=torch.Generator().manual_seed(1)).model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.add_(torch.randn_like(p) * 0.05)
    hf = to_mixtral(model, torch.float64)
    assert type(hf).__name__ == "MixtralForCausalLM"
    hf.set_experts_implementation("eager")  # the default grouped_mm kernel takes no float64
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, shipped = model(x), hf(x).logits
        mixtral_in_float64(hf)
        theirs = hf(x).logits
    assert rel(theirs, ours) <= 1e-10
    assert rel(shipped, ours) <= 1e-6


def test_only_a_llama_family_mixture_is_a_mixtral():
    for cfg, what in [(DENSE, "n_experts=1"), (DENSE.replace(n_experts=2, activation="gelu"), "SwiGLU")]:
        with pytest.raises(ValueError, match=what):
            to_mixtral_state(Transformer(cfg))


@pytest.fixture(scope="module")
def upcycled_run(tmp_path_factory):
    """llama-tiny trained dense, upcycled to 4 experts (top 2) half-way, exported by the CLI."""
    from grow import train as train_mod

    root = tmp_path_factory.mktemp("mixtral")
    train_mod.train(run_config(*LLAMA_RUN, *UPCYCLE, "trainer.max_tokens=12000"), root / "run")
    out = grow_cli("export", f"run={root / 'run'}", f"out={root / 'out'}", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "run", root / "out"


def test_the_export_loads_without_remote_code_with_grows_logits_and_greedy_tokens(upcycled_run):
    from grow import runs

    run, out = upcycled_run
    assert not (out / "modeling_grow.py").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "MixtralForCausalLM" and hf.config.num_local_experts == 4
    model, payload = runs.load_model(runs.find_checkpoint(run, None))
    assert model.config.n_experts == 4
    x = torch.randint(0, model.config.vocab_size, (2, model.config.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(hf(x).logits, model(x)) <= 1e-5  # float32 both
    ours, _ = runs.load_tokenizer(run, payload["config"])
    eot = ours.token_to_id(EOT)
    prompt = torch.tensor([[eot, *ours.encode("def ").ids]])
    want = generate(model, prompt, 10, Decoding(0.0, vocab=ours.get_vocab_size(), stop=eot))
    with torch.no_grad():
        got = hf.generate(prompt, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(prompt))
    n = min(got.shape[1], want.shape[1])
    assert got[0, :n].tolist() == want[0, :n].tolist()
    assert "MixtralForCausalLM" in (out / "README.md").read_text()


def test_a_run_starts_from_a_random_tiny_mixtral(upcycled_run, tmp_path):
    """init=<a MixtralForCausalLM saved by transformers (the hub's per-expert layout)>: stage 0 computes its
    logits (float64, 1e-10 with transformers' float32 parts in float64), and the run trains on."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from grow.train import Trainer

    run, _ = upcycled_run
    path = tmp_path / "mixtral"
    path.mkdir()
    shutil.copy(run / "tokenizer.json", path / "tokenizer.json")
    config = MixtralConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
                           rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-5, num_local_experts=4,
                           num_experts_per_tok=2, sliding_window=None)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(path)
    args = [*LLAMA_RUN, "model.n_experts=4", "model.top_k=2", "trainer.max_tokens=2000", f"init={path}"]
    trainer = Trainer(run_config(*args, "precision=float64"), tmp_path / "f64")
    assert (trainer.model.config.n_experts, trainer.model.config.top_k) == (4, 2)
    hf = MixtralForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    mixtral_in_float64(hf)
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    trainer.model.eval()
    with torch.no_grad():
        assert rel(trainer.model(x), hf(x).logits) <= 1e-10
    done = grow_cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["init"] == str(path)


def test_a_gpt_family_mixture_exports_with_its_modeling_file(tmp_path):
    from grow.hf.remote import save_remote, to_remote

    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=61, seq_len=12, n_layers=2, d_model=16, n_heads=2, d_qk=4, d_v=6, d_ff=24,
                            n_experts=3, top_k=2)
    model = Transformer(cfg).double().eval()
    save_remote(to_remote(model, torch.float64), tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, dtype=torch.float64)
    assert type(hf).__name__ == "GrowForCausalLM" and hf.config.num_experts_per_tok == 2
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert rel(hf(x).logits, model(x)) <= 1e-10


def test_a_dense_llama_checkpoint_is_upcycled_in_a_run_and_exported_as_a_mixtral(upcycled_run, tmp_path):
    """init=<a random tiny LlamaForCausalLM> with model.n_experts=4 and an n_experts schedule: stage 1 is the
    checkpoint (dense), the growth upcycles it without changing the validation loss, and the run's end exports as
    a MixtralForCausalLM whose logits are grow's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grow import runs

    run, _ = upcycled_run
    path = tmp_path / "llama"
    path.mkdir()
    shutil.copy(run / "tokenizer.json", path / "tokenizer.json")
    config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
                         rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    done = grow_cli("train", *LLAMA_RUN, *UPCYCLE, "trainer.max_tokens=6000", f"init={path}",
                    f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [s["config"].get("n_experts", 1) for s in summary["stage_plan"]] == [1, 4]
    assert abs(summary["growth_events"][0]["growth/delta"]) <= 1e-5
    out = grow_cli("export", f"run={tmp_path / 'run'}", f"out={tmp_path / 'out'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    model, _ = runs.load_model(runs.find_checkpoint(tmp_path / "run", None))
    assert type(hf).__name__ == "MixtralForCausalLM"
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(hf(x).logits, model(x)) <= 1e-5
