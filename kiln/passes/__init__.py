"""Graph -> Graph optimization passes; ``kiln.passes.pipeline`` lists them in order."""

from kiln.passes.pipeline import PASS_NAMES, PIPELINE, optimize
from kiln.passes.specialize import specialize

__all__ = ["PASS_NAMES", "PIPELINE", "optimize", "specialize"]
