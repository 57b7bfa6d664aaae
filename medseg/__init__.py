"""medseg: medical image segmentation with attention-slotted U-Nets."""

__version__ = "0.1.0"
