"""`make bench`'s measurements, one module each (``scripts/bench.py`` runs them):

- `benchmarks.common`: the run config, timing helpers, the trainer driven block by block;
- `benchmarks.step`: the trainer's step against a plain PyTorch loop (framework overhead);
- `benchmarks.optimizer`: the growth-aware AdamW against torch's, one stage and after growths;
- `benchmarks.growth`: each strategy's growths and their share of the default run;
- `benchmarks.stages`: tokens/s and MFU per stage of the default schedule;
- `benchmarks.report`: targets, the JSON's schema, the table.
"""
