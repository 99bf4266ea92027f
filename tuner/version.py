"""tuner's version (pyproject.toml's), in a module of its own so that any module can name it
without importing the package's face, which imports the driver."""

__version__ = "0.1.0"
