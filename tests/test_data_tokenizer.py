"""A pretrained tokenizer.json (data.tokenizer) is used as given; the model's vocabulary follows it;
every data.* key is checked before any work, with one line naming it (DataConfig)."""

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from grow import cli, data
from grow import train as train_mod
from grow.config import CONFIG_DIR
from grow.run import load as load_run
from grow.run import validate
from tests.helpers import model_of

QUIET = lambda *a, **k: None  # noqa: E731
TEXT = "Growing transformers: width, depth, heads — and the café's naïve résumé. 1234 + 5678 = 6912.\n"


def corpus(tmp_path, n=30):
    d = tmp_path / "corpus"
    d.mkdir(exist_ok=True)
    for i in range(n):
        (d / f"{i:02d}.txt").write_text(f"document {i}. " + TEXT * 40)
    return str(d / "*.txt")


@pytest.fixture
def tokenizer_json(tmp_path):
    """A byte-level BPE that is not grow's: two special tokens, '</s>' the end of text, ids 0..299."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT * 20, "other words entirely " * 50], trainer)
    path = tmp_path / "my-tokenizer.json"
    tok.save(str(path))
    return path


def make_cfg(*overrides):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    validate(cfg)
    return cfg


def test_a_given_tokenizer_is_used_as_given_and_sets_the_vocabulary(tmp_path, tokenizer_json):
    given = Tokenizer.from_file(str(tokenizer_json))
    n_ids = max(given.get_vocab(with_added_tokens=True).values()) + 1
    cfg = make_cfg("model=tiny", "data=text", f"data.files=[{corpus(tmp_path)}]", f"data.tokenizer={tokenizer_json}",
                   "data.eot_token='</s>'", f"data.cache_dir={tmp_path / 'cache'}", "data.num_proc=1")
    assert cfg.data.vocab_size == n_ids == model_of(cfg.model).vocab_size == 300
    d = data.load(cfg.data, 32, log=QUIET)
    assert (d.cache_dir / "tokenizer.json").read_bytes() == tokenizer_json.read_bytes()  # byte for byte
    tok = data.load_tokenizer(d.cache_dir)
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    assert ids == given.encode(TEXT, add_special_tokens=False).ids
    assert tok.decode(ids) == given.decode(ids) and tok.decode(ids).strip() == TEXT.strip()  # round trip
    first = given.encode("document 0. " + TEXT * 40, add_special_tokens=False).ids + [given.token_to_id("</s>")]
    assert [int(t) for t in d.train[0][: len(first)]] == first  # the cache holds exactly its ids
    run_dir = tmp_path / "run"
    assert d.save_tokenizer(run_dir).read_bytes() == tokenizer_json.read_bytes()  # a moved run keeps it


def test_training_with_a_given_tokenizer(tmp_path, tokenizer_json):
    cfg = make_cfg("model=tiny", "data=text", f"data.files=[{corpus(tmp_path)}]", f"data.tokenizer={tokenizer_json}",
                   "data.eot_token='</s>'", f"data.cache_dir={tmp_path / 'cache'}", "trainer.max_tokens=3000",
                   "trainer.batch_size=8", "trainer.eval_batches=1", "trainer.eval_batch_size=8",
                   "trainer.progress=false", "trainer.eval_every=0")
    summary = train_mod.train(load_run(cfg), tmp_path / "run")
    assert summary["final_config"]["vocab_size"] == 300


def test_the_trained_bpe_keeps_its_default_vocabulary(tmp_path):
    cfg = make_cfg("model=tiny", "data=text", f"data.files=[{corpus(tmp_path)}]")
    assert cfg.data.vocab_size == model_of(cfg.model).vocab_size == 4096
    assert make_cfg("model=tiny", "data.vocab_size=512").model.vocab_size == 512


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return info.value.code, [ln for ln in err.splitlines() if ln.strip()]


BAD = [
    (["data.tokenizer=/nonexistent/tokenizer.json"], "data.tokenizer='/nonexistent/tokenizer.json': no such file"),
    (["data.tokenizer={tok}"], "data.eot_token='<|endoftext|>': not a token of"),  # its end of text is </s>
    (["data.tokenizer={tok}", "data.eot_token='</s>'", "data.vocab_size=512"], "data.vocab_size=512: must be 300"),
    (["data.tokenizer={bad}"], "not a HuggingFace tokenizer.json"),
    (["data.verify=sometimes"], "data.verify='sometimes'"),
    (["data.num_proc=0"], "data.num_proc=0"),
    (["data.tokenizer_sample_bytes=-5"], "data.tokenizer_sample_bytes=-5"),
    (["+data.bogus=1"], "data.bogus=1: not a key of data=stdlib"),
    (["data=hf", "data.path=x/y", "data.streaming=maybe"], "data.streaming='maybe'"),
    (["data=bin", "data.train=[/nonexistent/*.bin]", "data.val=[/nonexistent/*.bin]"],
     "data.train='/nonexistent/*.bin': no such file"),
    (["data=bin"], "data.train: give the train shards"),
    (["data=bin", "data.train=[{tok}]", "data.val=[{tok}]", "data.vocab_size=70000"], "data.vocab_size=70000"),
]


@pytest.mark.parametrize("overrides,text", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_data_keys_are_one_line_and_exit_2_before_any_work(tmp_path, monkeypatch, capsys, tokenizer_json,
                                                                 overrides, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    fill = {"tok": str(tokenizer_json), "bad": str(tmp_path / "bad.json")}
    overrides = [o.format(**fill) for o in overrides]
    code, lines = run_cli(["train", "model=tiny", *overrides, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: data"), lines
    assert text.format(**fill) in lines[0], lines[0]
    assert not (tmp_path / "run").exists()  # refused before any work


def test_data_config_is_a_frozen_dataclass_with_attribute_access(tmp_path, tokenizer_json):
    node = OmegaConf.create({"name": "text", "files": [corpus(tmp_path)], "vocab_size": 300, "eot_token": "</s>",
                             "tokenizer": str(tokenizer_json), "max_bytes": 1e6, "num_proc": None})
    c = data.DataConfig.from_node(node)
    assert c.files == (corpus(tmp_path),) and c.max_bytes == 1_000_000 and c.workers >= 1
    assert data.DataConfig.from_node(c) is c
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.vocab_size = 5


def test_the_fineweb_recipe_composes_with_a_local_gpt2_style_tokenizer(tmp_path, monkeypatch, capsys):
    """data=fineweb: FineWeb-Edu streamed from the hub with the tokenizer at $GROW_GPT2_TOKENIZER (no network
    here: only the configuration is checked)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT * 10], trainer)
    tok.save(str(tmp_path / "gpt2.json"))
    monkeypatch.setenv("GROW_GPT2_TOKENIZER", str(tmp_path / "gpt2.json"))
    cfg = make_cfg("model=tiny", "data=fineweb")
    c = data.DataConfig.from_node(cfg.data)
    assert (c.name, c.path, c.streaming, c.eot_token) == ("hf", "HuggingFaceFW/fineweb-edu", True, "<|endoftext|>")
    assert c.vocab_size == model_of(cfg.model).vocab_size == 280
    monkeypatch.setenv("GROW_GPT2_TOKENIZER", str(tmp_path / "missing.json"))
    monkeypatch.chdir(tmp_path)
    code, lines = run_cli(["train", "model=tiny", "data=fineweb", f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and len(lines) == 1 and "data.tokenizer=" in lines[0] and "huggingface-cli download" in lines[0]
