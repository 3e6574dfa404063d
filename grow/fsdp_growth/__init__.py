"""A growth under FSDP, by the path ``trainer.fsdp_growth`` chooses (docs/distributed.md, "FSDP2"): `sharded`, every
rank growing the model one unit at a time and keeping its own rows; `passes`, a strategy's whole-model passes
around the units; `cost`, what a growth costs each rank on either path (host or sharded)."""
