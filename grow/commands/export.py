"""``grow export``: a run's checkpoint as a Hugging Face model directory (`grow.hf.export`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow.commands import in_place, quote_values, user_errors
from grow.config import CONFIG_DIR
from grow.hf.export import (
    ExportConfig,
    check,
    export,
    load_hint,
)


def normalize(argv: list[str]) -> list[str]:
    """A run directory may contain ``=`` (``svd_width_rate=0.5-seed0``)."""
    return quote_values(argv, keys=("run", "ckpt", "out"))


extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


@hydra.main(config_path=str(CONFIG_DIR), config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """A job of ``grow export ... -m`` (Hydra's launcher; a single one runs `job` through `grow.cli`)."""
    with user_errors():
        config = check(cfg)
    job(config)


def job(config: ExportConfig) -> None:
    """The export of the checked settings (`check`), and how to load it."""
    import json

    with user_errors():
        out = export(config)
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    print(f"exported {arch} to {out}: load it with {load_hint(out, arch)}")


if __name__ == "__main__":
    main()
