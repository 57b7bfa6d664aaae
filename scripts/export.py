"""Export a checkpoint: `python scripts/export.py ckpt=RUN/checkpoints/best.pt format=onnx|torchscript output=DIR`.

Writes the network (``model.onnx`` or ``model.pt``) and ``preprocessing.json``, everything evaluation does around it,
into ``output``; all files appear together or none. Exit code 1 with one line when the checkpoint, the format's
runtime or the export fails.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("export"))  # `medseg export` runs the same command
