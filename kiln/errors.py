"""Errors kiln raises for users. Each names what failed (file, node, input) and what was expected."""

from __future__ import annotations


class KilnError(Exception):
    """Base class of every error kiln raises on purpose."""


class ModelLoadError(KilnError):
    """The model file or bytes could not be read as ONNX."""


class InvalidModelError(KilnError):
    """The model is readable but malformed (cycle, undefined value, bad types)."""


class UnsupportedModelError(KilnError):
    """The model uses ops, opsets or attributes kiln does not support; lists all of them at once."""

    def __init__(self, problems: list[str], source: str = "model") -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} unsupported construct(s):\n{lines}")


class ShapeInferenceError(KilnError):
    """Type/shape inference failed for one node (the frontend adds the node's name)."""


class ArgumentError(KilnError, ValueError):
    """An argument to kiln's API is outside its domain: names it, what it accepts, what was given."""


class InputError(KilnError):
    """A run-time input has the wrong name, shape or dtype."""


class ExecutionError(KilnError):
    """A node failed while the model ran; names the node."""


class CompilerError(KilnError):
    """A target's toolchain rejected generated code (a kiln bug) or is missing (no C compiler)."""


class ResourceError(KilnError):
    """A resource ran out: memory for an allocation of the size named, or disk space."""


class VerificationError(KilnError):
    """The IR verifier found a broken invariant; lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("IR verification failed:\n" + "\n".join(f"  - {p}" for p in problems))


class InternalError(KilnError):
    """An invariant of kiln itself failed: a kiln bug. The message names the stage and the
    reproducer written for it (``python -m kiln.driver.repro DIR``)."""
