"""Print the automatic plan of a dataset: `python scripts/plan.py data=msd data.root=DIR [model=...]`.

``data.format=demo`` (the default data config) generates the demo dataset at ``data.root`` first if
it is missing. Dataset and config errors print one line and exit with status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from medseg.data.datalist import DatasetError, DatasetInfo, load_dataset
from medseg.data.demo import ensure_demo_dataset
from medseg.data.planning import (
    FINGERPRINT_FILE,
    PlanError,
    compute_fingerprint,
    default_cache_dir,
    format_plan,
    plan_from_config,
)


def load_info(data_cfg: dict[str, Any]) -> DatasetInfo:
    """The dataset of a data config; format ``demo`` is an MSD folder, generated when missing."""
    root, fmt = Path(str(data_cfg["root"])).expanduser(), str(data_cfg["format"])
    if fmt == "demo":
        ensure_demo_dataset(root, num_cases=int(data_cfg["num_cases"]))
        fmt = "msd"
    return load_dataset(root, fmt)


def user_set(data_cfg: dict[str, Any], model_cfg: dict[str, Any]) -> list[str]:
    """The plannable keys the configs already set (kept as they are, planned around)."""
    keys = [(f"data.{k}", data_cfg.get(k)) for k in ("spacing", "patch_size", "normalization")]
    keys.append(("model.strides", model_cfg.get("strides")))
    return [f"{name}={value}" for name, value in keys if value is not None]


def report(cfg: DictConfig) -> str:
    """The fingerprint-and-plan report for the composed config."""
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True, throw_on_missing=True)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True, throw_on_missing=True)
    info = load_info(data_cfg)
    cache_file = default_cache_dir(info, data_cfg) / FINGERPRINT_FILE
    fingerprint = compute_fingerprint(info, cache_file, progress=bool(cfg.progress))
    text = format_plan(plan_from_config(fingerprint, data_cfg, model_cfg), fingerprint)
    kept = user_set(data_cfg, model_cfg)
    note = f"\nkept from the config (set them to null to plan them): {'; '.join(kept)}" if kept else ""
    return text + note


@hydra.main(version_base="1.3", config_path="../configs", config_name="plan")
def main(cfg: DictConfig) -> None:
    try:
        print(report(cfg))
    except (DatasetError, PlanError, MissingMandatoryValue) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
