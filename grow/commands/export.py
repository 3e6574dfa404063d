"""``grow export``: a run's checkpoint as a Hugging Face model directory (`grow.hf.export`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow.commands import in_place, quote_values, user_errors
from grow.config import CONFIG_DIR
from grow.hf.export import (
    ExportConfig,
    check,  # noqa: F401 - the command's validation (grow.cli runs it before Hydra)
    export,
    load_hint,
)


def normalize(argv: list[str]) -> list[str]:
    """A run directory may contain ``=`` (``svd_width_rate=0.5-seed0``)."""
    return quote_values(argv, keys=("run", "ckpt", "out"))


extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


@hydra.main(config_path=str(CONFIG_DIR), config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    import json

    with user_errors():
        out = export(ExportConfig.from_node(cfg))
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    print(f"exported {arch} to {out}: load it with {load_hint(out, arch)}")


if __name__ == "__main__":
    main()
