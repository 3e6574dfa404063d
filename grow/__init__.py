"""grow: an experiment runner for growing transformer language models during training."""

__version__ = "0.1.0"
