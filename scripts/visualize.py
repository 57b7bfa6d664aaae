"""See what the attention does: `python scripts/visualize.py ckpt=RUN/checkpoints/best.pt input=VOLUME voxel=[i,j,k]`.

Writes, into ``output``, the attention maps of one query voxel (``voxel`` indices of the file, or ``world`` mm; by
default the centre of the predicted foreground) in every attention slot and block of the checkpoint's network:
``attention.json`` (mean attention distance in mm, entropy, gamma per head), PNG montages and 4D NIfTI maps on the
input's grid. Exit code 1 with one line for a bad checkpoint, input, point, slot or block.
"""

import sys

from medseg.commands import run_command

if __name__ == "__main__":
    sys.exit(run_command("visualize"))  # `medseg visualize` runs the same command
