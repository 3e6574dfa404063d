"""`grow export`'s tokenizer and generation config (docs/hf.md): transformers' ``generate()`` with its
default arguments, on what the exported tokenizer encodes, returns the tokens ``grow sample temperature=0`` draws,
for both families (the GPT family's custom-code export, the Llama family's LlamaForCausalLM), over a context of 64
tokens on briefly trained tiny models. Before, the tokenizer did not prepend the end-of-text token grow conditions
every document on, and generate() stopped at transformers' default 20 tokens."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the hf extra; make test installs it

from grow.data.config import EOT  # noqa: E402
from tests.conftest import TINY_RUN, grow_cli, run_config  # noqa: E402

CONTEXT = 64  # the model's seq_len: room for 32+ generated tokens after the prompt
PROMPT = "def "
FAMILIES = {"gpt": "model=tiny", "llama": "model=llama-tiny"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def exported(request, tmp_path_factory):
    """(family, run directory, export directory) of a tiny model of that family trained 20k tokens at a 64-token
    context (one stage: growth is not the subject), exported by the CLI."""
    from grow import train as train_mod

    root = tmp_path_factory.mktemp(f"gen-{request.param}")
    args = [FAMILIES[request.param], *[a for a in TINY_RUN if not a.startswith("model=")],
            f"model.seq_len={CONTEXT}", "trainer.max_tokens=20000"]
    train_mod.train(run_config(*args), root / "run")
    out = grow_cli("export", f"run={root / 'run'}", f"out={root / 'out'}", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return request.param, root / "run", root / "out"


def test_generate_with_defaults_on_the_exported_tokenizer_returns_grow_samples_greedy_tokens(exported, tmp_path):
    """``hf.generate(**tok(PROMPT, return_tensors="pt"))``, nothing else: the tokenizer prepends the end-of-text
    token (as `grow.sampling.sample` does), generation is greedy up to the model's context (the generation
    config's max_length), and the tokens are grow's greedy ones (`grow.sampling.generate` on the checkpoint), 32
    or more of them; the decoded text is what ``grow sample prompt=... temperature=0`` prints."""
    from grow import runs
    from grow.sampling import Decoding, generate

    family, run, out = exported
    remote = family == "gpt"
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=remote).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=remote)
    model, payload = runs.load_model(runs.find_checkpoint(run, None))
    ours, _ = runs.load_tokenizer(run, payload["config"])
    eot = ours.token_to_id(EOT)
    inputs = tok(PROMPT, return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == [eot, *ours.encode(PROMPT).ids]  # grow sample's context
    assert hf.generation_config.max_length == CONTEXT and tok.model_max_length == CONTEXT
    with torch.no_grad():
        got = hf.generate(**inputs)[0].tolist()
    n_prompt = inputs["input_ids"].shape[1]
    want = generate(model, inputs["input_ids"], CONTEXT - n_prompt, Decoding(0.0, vocab=ours.get_vocab_size(),
                                                                             stop=eot))[0].tolist()
    new = got[n_prompt:]
    assert len(new) >= 32 and eot not in new[:32], (family, new)
    assert got == want[:len(got)] and (len(got) == CONTEXT or got[-1] == eot), (family, got, want)
    printed = grow_cli("sample", f"run={run}", f"prompt={PROMPT}", "temperature=0",
                       f"max_new_tokens={CONTEXT - n_prompt}", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr[-2000:]
    text = tok.decode(got[1:], skip_special_tokens=True)
    assert printed.stdout.rstrip("\n") == text, (printed.stdout, text)
