"""The distribution's version, read by the build backend and by version-skew checks."""

__version__ = "0.2.0"
