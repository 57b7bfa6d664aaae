"""Export a checkpoint's network for use outside medseg, ONNX or TorchScript with a ``preprocessing.json`` beside it
(:mod:`.export`); the formats (:mod:`.formats`) and the description of what surrounds the network
(:mod:`.description`)."""

from medseg.export.description import PREPROCESSING_FILE, read_description
from medseg.export.export import ExportResult, export, export_cli, load_exported

__all__ = ["PREPROCESSING_FILE", "ExportResult", "export", "export_cli", "load_exported", "read_description"]
