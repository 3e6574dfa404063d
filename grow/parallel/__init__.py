"""Several processes, one run: ranks and their collectives under torchrun (`distributed`), and FSDP2's sharding of a
model and its optimizer (`fsdp`) (docs/distributed.md). A growth under FSDP is `grow.fsdp_growth`'s."""
