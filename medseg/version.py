"""medseg's version, a leaf module: checkpoints and exports record it without importing the package's API."""

__version__ = "0.1.0"
