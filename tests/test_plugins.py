"""Adding a strategy is one module and one YAML (`grow.plugins`, docs/strategies.md): a toy strategy in a
temporary package, named by ``GROW_PLUGINS``, is found by `grow compare` (``strategy=all`` and by
name), by `make bench`'s list and by the test suite's YAML and preservation tests, with no list edited.

Everything that imports the toy runs in a process of its own (forked warm, tests/growd.py): a plugin registers
itself in process-wide registries (the strategy registry, Hydra's ConfigStore) that the rest of the suite must not
see.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_RUN, assert_one_line_error, grow_cli
from tests.ranks import forked_grow, forked_python

TOY = '''"""A toy strategy: the zero rule with every free entry from the initializer times ``scale``."""
from grow.growth.base import Strategy, register


@register("toy")
class Toy(Strategy):
    defaults = {"scale": 1.0}

    def free_values(self, ctx, site, slot):
        return super().free_values(ctx, site, slot) * float(self.options["scale"])
'''
YAML = "name: toy\nscale: 0.5               # free entries: the initializer's values times this\n"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "toyplug"
    (pkg / "configs" / "strategy").mkdir(parents=True)
    (pkg / "__init__.py").write_text(TOY)
    (pkg / "configs" / "strategy" / "toy.yaml").write_text(YAML)
    path = os.pathsep.join(p for p in (str(root), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"GROW_PLUGINS": "toyplug", "PYTHONPATH": path}


def python(code: str, env: dict) -> str:
    """``python -c <code>`` with the plugin's environment, forked from a server that never loaded a plugin."""
    out = forked_python(code, ROOT, env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_toy_is_a_strategy_everywhere_the_registry_is_read(plugin_env):
    """The registry, the config group and the bench list name the toy; so does `grow compare strategy=all`'s
    list once the plugins are loaded (as `grow.cli.main` does first)."""
    from grow.growth.base import available

    got = json.loads(python(
        "import json, sys; sys.path.insert(0, 'scripts')\n"
        "from grow.growth.base import available, get_strategy\n"
        "from grow.errors import options\n"
        "from benchmarks.common import parse_args\n"
        "got = {'available': available(), 'group': options('strategy'),\n"
        "       'bench': parse_args([]).strategies.split(','), 'options': get_strategy('toy').options}\n"
        "from grow import plugins; plugins.load()\n"
        "from grow.commands.compare import _strategies, _parse\n"
        "got['all'] = _strategies(_parse(['strategy=all'])[0])\n"
        "print(json.dumps(got))", plugin_env))
    assert "toy" in got["available"] and "toy" in got["group"] and "toy" in got["bench"]
    assert got["options"] == {"scale": 0.5}  # from its YAML
    assert "toy" in got["all"] and "zero" in got["all"]
    assert set(got["available"]) - {"toy"} == set(available())  # this process has no plugin loaded


def test_grow_compare_runs_the_toy_by_name(plugin_env, tmp_path):
    sweep = tmp_path / "sweep"
    out = forked_grow("compare", "strategy=toy", "strategy.scale=0.25", "compare.baseline=false", *TINY_RUN,
                   "trainer.max_tokens=6000", f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=plugin_env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((sweep / "toy-seed0" / "summary.json").read_text())
    assert summary["strategy"] == "toy" and len(summary["growth_events"]) >= 1


def test_the_preservation_and_yaml_tests_include_the_toy(plugin_env):
    out = forked_python("import sys, pytest\nsys.exit(pytest.main(['-v', '-p', 'no:cacheprovider', 'tests/test_growth.py', "
                        "'-k', '(every_exact or yaml_files_list) and toy']))", ROOT, plugin_env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "test_every_exact_strategy_preserves_the_function_float64[toy] PASSED" in out.stdout
    assert "test_yaml_files_list_exactly_the_options[toy] PASSED" in out.stdout


def test_a_plugin_that_cannot_be_imported_is_one_line(tmp_path):
    out = grow_cli("train", "model=tiny", cwd=tmp_path, env={"GROW_PLUGINS": "no_such_plugin_module"})
    assert_one_line_error(out, "GROW_PLUGINS")


HALVING = '''"""A toy strategy and a toy trigger in one plugin module: each one class, each one YAML beside it."""
from grow.errors import ConfigError
from grow.growth.base import Strategy, register
from grow.triggers import Trigger
from grow.triggers import register as register_trigger


@register("halving")
class Halving(Strategy):
    """The zero rule with the free entries from the initializer halved; refuses a run without evaluations."""

    defaults = {"layer_position": "end"}

    def free_values(self, ctx, site, slot):
        return super().free_values(ctx, site, slot) * 0.5

    def check(self, run):
        if run.trainer.eval_every == 0:
            raise ConfigError("trainer.eval_every", 0, "an integer >= 1 with strategy=halving (its own check)")


@register_trigger("after_steps")
class AfterSteps(Trigger):
    """A stage ends after ``steps`` steps (its option and default: its YAML beside the module)."""

    def begin_stage(self, memory, progress):
        memory["steps"] = 0

    def after_step(self, memory, progress):
        memory["steps"] = memory.get("steps", 0) + 1
        return memory["steps"] >= self.options["steps"]
'''


def test_a_new_strategy_and_a_new_trigger_are_one_module_and_one_yaml_each(tmp_path):
    """Nothing but the plugin's module and its two YAMLs: `grow train` composes, checks (the strategy's own
    `check` hook refuses in one line) and trains with both; the trigger ends the first stage after its 4 steps."""
    pkg = tmp_path / "halvingplug"
    (pkg / "configs" / "strategy").mkdir(parents=True)
    (pkg / "configs" / "schedule" / "trigger").mkdir(parents=True)
    (pkg / "__init__.py").write_text(HALVING)
    (pkg / "configs" / "strategy" / "halving.yaml").write_text("name: halving\nlayer_position: end   # new layers\n")
    (pkg / "configs" / "schedule" / "trigger" / "after_steps.yaml").write_text("name: after_steps\nsteps: 4   # per stage\n")
    path = os.pathsep.join(p for p in (str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"GROW_PLUGINS": "halvingplug", "PYTHONPATH": path}
    args = [*TINY_RUN, "+schedule=exp", "schedule.stages=2", "strategy=halving", "schedule/trigger=after_steps",
            "trainer.max_tokens=6000", "trainer.ckpt_every=0"]
    refused = forked_grow("train", *args, f"hydra.run.dir={tmp_path / 'refused'}", cwd=tmp_path, env=env)
    assert_one_line_error(refused, "trainer.eval_every=0: an integer >= 1 with strategy=halving")
    done = forked_grow("train", *args, "trainer.eval_every=100", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (growth,) = [r for r in records if "growth/delta" in r]
    assert growth["train/step"] == 4, growth  # the trigger's rule: the plan's first stage is 1 step
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["strategy"] == "halving"


def plugin_from_page(section: str, tmp_path: Path) -> tuple[list[str], str]:
    """A docs/extending.md section's plugin, its files written under ``tmp_path/plugins`` as the page names them:
    (the files' paths, the page's one command)."""
    import re

    page = (ROOT / "docs" / "extending.md").read_text().split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", page, re.S)
    files = {text.splitlines()[0].removeprefix("# ~/plugins/"): text for lang, text in blocks if lang in ("python", "yaml")}
    for rel, text in files.items():
        (tmp_path / "plugins" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "plugins" / rel).write_text(text)
    (command,) = [text.strip() for lang, text in blocks if lang == "bash"]
    return sorted(files), command


def train_with_plugin(command: str, plugin: str, tmp_path: Path) -> dict:
    """The page's command, at a tiny size, from outside the checkout: the run's summary."""
    assert command.startswith(f"PYTHONPATH=~/plugins GROW_PLUGINS={plugin} grow train ")
    args = command.split(" grow train ", 1)[1].split()
    path = os.pathsep.join(p for p in (str(tmp_path / "plugins"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    run = tmp_path / "run"
    out = forked_grow("train", *args, *TINY_RUN, "trainer.max_tokens=6000", f"hydra.run.dir={run}", cwd=tmp_path,
                      env={"GROW_PLUGINS": plugin, "PYTHONPATH": path})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((run / "summary.json").read_text())


def test_the_plugin_of_docs_extending_md_trains_as_the_page_says(tmp_path):
    """#65: docs/extending.md's minimal plugin, its two files copied from the page, the command from the page (a
    tiny size): it trains with strategy=half; without PYTHONPATH naming its directory, the page's one line."""
    files, command = plugin_from_page("A plugin, whole", tmp_path)
    assert files == ["halfplug/__init__.py", "halfplug/configs/strategy/half.yaml"]
    summary = train_with_plugin(command, "halfplug", tmp_path)
    assert summary["strategy"] == "half" and len(summary["growth_events"]) == 3
    out = grow_cli("train", "model=tiny", cwd=tmp_path, env={"GROW_PLUGINS": "halfplug"})  # its directory not importable
    assert_one_line_error(out, "GROW_PLUGINS")
    assert "GROW_PLUGINS='halfplug': importable module names, comma-separated (halfplug: No module named 'halfplug')" \
        in out.stderr


def test_the_trigger_plugin_of_docs_extending_md_grows_where_the_page_says(tmp_path):
    """#62: docs/extending.md's trigger walkthrough, its two files copied from the page, trains from outside the
    checkout: each stage but the last ends after the page's 4 optimizer steps (the plan's would differ)."""
    files, command = plugin_from_page("A growth trigger", tmp_path)
    assert files == ["stepplug/__init__.py", "stepplug/configs/schedule/trigger/every_steps.yaml"]
    summary = train_with_plugin(command, "stepplug", tmp_path)
    assert summary["trigger"].startswith("every_steps")
    assert [e["train/step"] for e in summary["growth_events"]] == [4, 8]  # 3 stages: 2 growths
    # its option's default is its YAML's (the class declares none) and the class checks the value: one line
    path = os.pathsep.join(p for p in (str(tmp_path / "plugins"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    out = forked_grow("schedule", "+schedule=exp", "schedule/trigger=every_steps", "schedule.trigger.steps=0",
                      cwd=tmp_path, env={"GROW_PLUGINS": "stepplug", "PYTHONPATH": path})
    assert_one_line_error(out, "schedule.trigger.steps=0: must be an integer >= 1")


FLAG_CHECKS = '''import importlib.util, json, pathlib, tempfile, torch
from grow import plugins, schema
from grow.families import export_blockers
from grow.growth import grow
from grow.growth.base import available, get_strategy, strategy_class
from grow.hf.remote import to_remote_state
from grow.memory import activation_bytes_per_token, measured_bytes_per_token
from grow.model import Transformer, TransformerConfig
from tests.helpers import BASE, gen, max_delta, tokens, trained_like
from tests.test_llama_growth import DOUBLED, SOURCE
plugins.load()
ON = (("layer_scale", 0.1),)  # the plugin flag on, as TransformerConfig.flags holds it
cfg = BASE.replace(flags=ON)
llama = SOURCE.replace(n_kv_heads=2, tie_embeddings=True, flags=ON)  # rotary, SwiGLU, grouped heads, tied
cases = {"gpt": (cfg, cfg.replace(n_layers=4, d_model=32, n_heads=4, d_qk=8, d_v=12, d_ff=48)),  # h, k, v, p, E, N
         "llama": (llama, llama.replace(**DOUBLED)), "experts": (cfg, cfg.replace(n_experts=2))}
out = {"names": sorted(schema.param_names(cfg)), "params": sorted(n for n, _ in Transformer(cfg).named_parameters()),
       "count": [cfg.num_params(), Transformer(cfg).num_params()], "gain": float(Transformer(cfg).layers[1].mlp_scale[0]),
       "round_trip": TransformerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg,
       "written": cfg.to_dict().get("layer_scale"), "off": "layer_scale" in BASE.to_dict(),
       "blockers": export_blockers(cfg), "strategies": {},
       "saved": [measured_bytes_per_token(Transformer(cfg), 8) - measured_bytes_per_token(Transformer(BASE), 8),
                 activation_bytes_per_token(cfg) - activation_bytes_per_token(BASE)]}
try:
    to_remote_state(Transformer(cfg))
except ValueError as exc:
    out["export"] = str(exc)
if importlib.util.find_spec("transformers"):  # a run from a transformers checkpoint (init=<dir>), which has no gains
    import transformers
    from grow.hf.pretrained import reconcile
    with tempfile.TemporaryDirectory() as d:
        transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=24,
            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16)).save_pretrained(d)
        ours = TransformerConfig(vocab_size=61, seq_len=16, n_layers=2, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24,
                                 activation="swiglu", positions="rope", mlp_bias=False).replace(flags=ON)
        try:
            reconcile(pathlib.Path(d), ours, None, 61)
            out["init"] = "accepted"
        except Exception as exc:
            out["init"] = str(exc)
for case, (source, target) in cases.items():
    model, idx = trained_like(source), tokens(source)  # every gain random: the function depends on them
    with torch.no_grad():
        scale = float(model(idx).abs().max())
    batches = [(tokens(source, seed=10 + i), tokens(source, seed=20 + i)) for i in range(6)]
    for name in available():
        cls = strategy_class(name)
        if cls.exact_with is None:
            continue
        try:
            get_strategy(name, **cls.exact_with).check_transition(source, target)
        except ValueError as exc:
            out["strategies"][case, name] = str(exc)
            continue
        grown = grow(model, target, name, batch=batches, generator=gen(), stage=1, **cls.exact_with).model
        out["strategies"][case, name] = max_delta(model, grown, idx) / scale
out["strategies"] = {f"{case} {name}": v for (case, name), v in out["strategies"].items()}
from tests.test_fsdp_growth import PLAIN, assert_units_are_whole, grown_target
out["units"] = []  # under FSDP, one unit at a time: the whole growth's tensors, bit for bit
for name in PLAIN:
    assert_units_are_whole(trained_like(cfg.replace(d_ff=25)), grown_target(name, "all").replace(flags=ON), name)
    out["units"].append(name)
print(json.dumps(out))
'''


def test_the_model_flag_of_docs_extending_md_grows_exactly_and_resumes(tmp_path):
    """#62: docs/extending.md's model flag (LayerScale), its file copied from the page, from outside the checkout:
    the schema names exactly the model's parameters, `num_params` counts them and grow.memory its saved bytes;
    every exact strategy grows a GPT- and a Llama-style model with random gains in h, k, v, p, E and N at once
    (and into experts) keeping its float64 logits to 1e-10 (or refuses in one line), and by units (FSDP) as a
    whole; the config round-trips; export and a start from a transformers checkpoint refuse it in one line, as a
    bad value; the page's command trains (float64: each growth moves the loss by <= 1e-8) and a run killed
    mid-way resumes to the same losses."""
    files, command = plugin_from_page("A model flag", tmp_path)
    assert files == ["lsplug/__init__.py"]
    path = os.pathsep.join(p for p in (str(tmp_path / "plugins"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"GROW_PLUGINS": "lsplug", "PYTHONPATH": path}
    got = json.loads(python(FLAG_CHECKS, env).splitlines()[-1])
    assert got["names"] == got["params"] and {"layers.0.attn_scale", "layers.1.mlp_scale"} <= set(got["names"])
    assert got["count"][0] == got["count"][1] and abs(got["gain"] - 0.1) <= 1e-8  # float32
    if importlib.util.find_spec("transformers"):  # the hf extra
        assert got["init"].startswith("model.layer_scale=0.1: must be off"), got["init"]
    assert got["saved"] == [2 * 2 * 4 * 16] * 2  # 2 layers x 2 branches x float32 x h: measured = grow.memory's
    assert got["round_trip"] and got["written"] == 0.1 and not got["off"]
    assert got["blockers"][-1] == "layer_scale=0.1 (a plugin's model flag)" and "model.layer_scale=0.1" in got["export"]
    assert {"gpt zero", "llama hyperclone", "experts upcycle"} <= set(got["strategies"])
    for name, delta in got["strategies"].items():  # a refusal is one line
        assert (isinstance(delta, float) and delta <= 1e-10) or "\n" not in delta, (name, delta)
    widths = {k: d for k, d in got["strategies"].items() if not k.startswith("experts")}
    assert all(isinstance(d, float) for d in widths.values()), widths  # every exact strategy grows it
    assert isinstance(got["strategies"]["experts upcycle"], float)
    assert {"zero", "hyperclone", "msg", "vt"} <= set(got["units"])  # each grew by units as a whole growth

    assert command == "PYTHONPATH=~/plugins GROW_PLUGINS=lsplug grow train +schedule=exp model.layer_scale=0.1"
    args = [*command.split(" grow train ", 1)[1].split(), *TINY_RUN, "trainer.max_tokens=6000", "precision=float64",
            "trainer.ckpt_every=5"]
    bad = forked_grow("train", *args, "model.layer_scale=-1", f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path, env=env)
    assert_one_line_error(bad, "model.layer_scale=-1: must be a number > 0")
    runs = {}
    for name, kill in (("whole", None), ("killed", "step:9")):
        run = tmp_path / name
        out = forked_grow("train", *args, f"hydra.run.dir={run}", cwd=tmp_path,
                          env={**env, **({"GROW_KILL_AT": kill} if kill else {})})
        if kill:
            assert out.returncode != 0 and not (run / "summary.json").exists(), out.stderr[-3000:]
            out = forked_grow("train", f"resume={run}", cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = json.loads((run / "summary.json").read_text())
    whole, resumed = runs["whole"], runs["killed"]
    assert whole["final_config"]["layer_scale"] == 0.1 and len(whole["growth_events"]) == 3
    assert all(abs(e["growth/delta"]) <= 1e-8 for e in whole["growth_events"]), whole["growth_events"]
    assert resumed["final_val_loss"] == whole["final_val_loss"] and resumed["state"] == whole["state"]
    if importlib.util.find_spec("transformers"):  # grow export: the hf extra
        out = forked_grow("export", f"run={tmp_path / 'whole'}", f"out={tmp_path / 'out'}", cwd=tmp_path, env=env)
        assert_one_line_error(out, "model.layer_scale=0.1 is a plugin's model flag")
        assert not (tmp_path / "out").exists()
