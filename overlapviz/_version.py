"""The package version, importable without importing the package's other modules."""

__version__ = "0.1.0"
