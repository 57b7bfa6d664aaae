"""See what the attention does: one voxel's attention maps in every attention slot of a checkpoint's network
(:mod:`.visualize`); placing the window (:mod:`.window`), the measures (:mod:`.measures`), the figures (:mod:`.montage`)
and the NIfTI maps (:mod:`.volumes`)."""

from medseg.visualize.visualize import VisualizeResult, select_maps, visualize, visualize_cli

__all__ = ["VisualizeResult", "select_maps", "visualize", "visualize_cli"]
