"""kiln's version: part of every cache key and artifact (a new version never reads an old plan)."""

__version__ = "0.1.0"
