"""Export a checkpoint: `python scripts/export.py ckpt=RUN/checkpoints/best.pt format=onnx|torchscript output=DIR`.

Writes the network (``model.onnx`` or ``model.pt``) and ``preprocessing.json``, everything evaluation does around it,
into ``output``; all files appear together or none. Exit code 1 with one line when the checkpoint, the format's
runtime or the export fails.
"""

import hydra
from omegaconf import DictConfig

from medseg.cli import one_line_errors, run
from medseg.config import ExportConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="export")
@one_line_errors
def main(cfg: DictConfig) -> None:
    """Hydra entry point: export."""
    from medseg.export import export_cli  # torch and MONAI load only when a job runs

    export_cli(cfg)


if __name__ == "__main__":
    run(main, ExportConfig)
