"""The parts of `make gpu-check` beyond training (scripts/gpu_check.py runs them): the optimizer after
growths against torch's fused AdamW (`optimizer`), a profiler trace of the final stage (`profiling`),
liger-kernel's kernels against grow's own (`liger`), growth shares of the plan's wall-clock and the
memory plan's ratios (`plan`)."""
