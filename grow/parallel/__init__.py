"""Several processes, one run: DDP under torchrun (`distributed`), FSDP2 (`fsdp`), a growth by FSDP units on every
rank (`fsdp_growth`, `fsdp_svd`) and its cost model (`fsdp_cost`) (docs/distributed.md)."""
