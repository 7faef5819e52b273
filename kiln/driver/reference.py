"""The ``reference`` target's model: the graph run by kiln's reference interpreter."""

from __future__ import annotations

from typing import Any

from kiln.driver.artifact import save
from kiln.driver.model import Model
from kiln.ir.graph import Graph
from kiln.ops.interpreter import Interpreter


class ReferenceModel(Model):
    """The oracle: the graph run by kiln's reference interpreter."""

    target = "reference"

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.interpreter = Interpreter(graph)

    def _execute(self, inputs: list[Any]) -> list[Any]:
        return self.interpreter.run(inputs)

    def save(self, path: str) -> Any:
        """Write a ``.kiln`` artifact (IR and weights); ``kiln.load`` reads it."""
        return save(self, path)
