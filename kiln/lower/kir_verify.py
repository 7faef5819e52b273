"""The kernel IR's invariants, checked without running anything: ``verify_kernel(kernel)`` lists every
problem (an empty list: none).

* every loop index, scalar and helper parameter is defined in an enclosing scope before its use;
* indices are integers; a store goes to a buffer among the kernel's writes (its scratch too:
  memory planning gives a buffer its lifetime from the kernels' reads and writes), never to one
  it only reads;
* **static bounds**: an access evaluated on every path whose index interval follows from constant
  loop bounds (affine arithmetic, constant division and remainder, selects) must lie inside its
  buffer. Loop bounds that are run-time sizes (``kiln_d<i>``, ``kiln_len``) count at every value
  their ranges allow, where the caller gives those ranges. Accesses under an ``If``, in a select's
  branches or with loop bounds read from data are left to the run-time checks (``KILN_DEBUG``)
  and the interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.ir.types import DType
from kiln.lower.kir import (
    ENGINE_CALLS,
    STATUS_NAME,
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    Function,
    If,
    Index,
    Kernel,
    Let,
    Load,
    Scalar,
    Select,
    Stmt,
    Store,
    Unary,
    epilogue_of,
    evaluated_always,
    is_run_time_scalar,
    postorder,
)

Interval = tuple[int, int] | None  # inclusive; None: not known statically

COMPARISONS = ("<", "<=", ">", ">=", "==", "!=", "&&", "||")
BIG = 1 << 62
# x OP c: the values of x that take the true branch, then those that take the false one
NARROWING = {
    "<": lambda c: ((-BIG, c - 1), (c, BIG)),
    "<=": lambda c: ((-BIG, c), (c + 1, BIG)),
    ">": lambda c: ((c + 1, BIG), (-BIG, c)),
    ">=": lambda c: ((c, BIG), (-BIG, c - 1)),
}


def verify_kernel(kernel: Kernel, run_time: dict[str, Interval] | None = None) -> list[str]:
    """Every broken invariant of ``kernel`` (and its helpers), as readable lines. ``run_time``: the
    values the run-time sizes it reads may take (``kiln_d<i>``, ``kiln_len``: their declared
    ranges), so accesses under loops bounded by them are checked at every size they allow."""
    checker = _Checker(kernel, run_time or {})
    checker.block(kernel.body, dict(checker.run_time), guarded=False)
    return checker.problems


def _integer(e: Expr) -> bool | None:
    """Whether ``e`` has an integer type (None: cannot tell)."""
    if isinstance(e, Const):
        return not e.dtype.is_float
    if isinstance(e, Index):
        return True
    if isinstance(e, Scalar):
        return not e.dtype.is_float
    if isinstance(e, Load):
        return not e.buffer.dtype.is_float
    if isinstance(e, Cast):
        return not e.dtype.is_float
    if isinstance(e, Binary):
        if e.op in COMPARISONS:
            return True
        a, b = _integer(e.a), _integer(e.b)
        return None if a is None or b is None else a and b
    if isinstance(e, Select):
        return _integer(e.a)
    return None


class _Checker:
    def __init__(self, kernel: Kernel, run_time: dict[str, Interval]) -> None:
        self.kernel = kernel
        self.run_time = run_time  # the run-time sizes' values, declared in every function
        self.problems: list[str] = []
        self.only_read = {b for b in kernel.reads if b not in kernel.writes}
        self.writes = set(kernel.writes)

    def problem(self, text: str) -> None:
        self.problems.append(f"kernel {self.kernel.name} ({self.kernel.kind}): {text}")

    def block(self, body: Sequence[Stmt], ranges: dict[str, Interval], guarded: bool) -> None:
        scope = dict(ranges)
        for stmt in body:
            if isinstance(stmt, For):
                bounds = [b if isinstance(b, int) else self.interval(b, scope) for b in (stmt.start, stmt.extent)]
                for bound in (stmt.start, stmt.extent):
                    if not isinstance(bound, int):
                        self.expression(bound, scope, guarded)
                # (a bound known as an interval, a run-time size's: the index's widest values)
                start = bounds[0] if isinstance(bounds[0], int) else (bounds[0][0] if bounds[0] else None)
                stop = bounds[1] if isinstance(bounds[1], int) else (bounds[1][1] if bounds[1] else None)
                inner = dict(scope)
                inner[stmt.index.name] = (start, stop - 1) if start is not None and stop is not None else None
                if start is not None and stop is not None and stop <= start:
                    continue  # never runs
                self.block(stmt.body, inner, guarded)
            elif isinstance(stmt, If):
                self.expression(stmt.cond, scope, guarded)
                self.block(stmt.body, scope, guarded=True)
            elif isinstance(stmt, (Let, Assign)):
                self.expression(stmt.value, scope, guarded)
                if isinstance(stmt, Assign) and stmt.scalar.name not in scope:
                    self.problem(f"{stmt.scalar.name} is assigned before it is declared")
                scope[stmt.scalar.name] = self.interval(stmt.value, scope) if isinstance(stmt, Let) else None
            elif isinstance(stmt, Store):
                self.expression(stmt.value, scope, guarded)
                self.access(stmt.buffer, stmt.index, scope, guarded, "store")
                if stmt.buffer in self.only_read:
                    self.problem(f"stores into {stmt.buffer.name}, which it only reads")
                elif stmt.buffer not in self.writes and stmt.buffer.name != STATUS_NAME:
                    self.problem(f"stores into {stmt.buffer.name}, which is not among its writes")
            elif isinstance(stmt, ENGINE_CALLS):
                epilogue = epilogue_of(stmt)
                if epilogue is not None:
                    self.helper(epilogue)
            else:
                self.problem(f"unknown statement {type(stmt).__name__}")

    def helper(self, function: Function) -> None:
        params: dict[str, Interval] = {**self.run_time, **{p.name: None for p in function.params}}
        self.block(function.body, params, guarded=True)  # tile bounds come at run time

    def expression(self, root: Expr, scope: dict[str, Interval], guarded: bool) -> None:
        order = postorder(root)
        always = evaluated_always(root, order)
        for node in order:
            if isinstance(node, (Index, Scalar)) and node.name not in scope and not is_run_time_scalar(node.name):
                self.problem(f"{node.name} is used outside the loop or block that defines it")
            elif isinstance(node, Load):
                self.access(node.buffer, node.index, scope, guarded or id(node) not in always, "load")

    def access(self, buffer: Buffer, index: Expr, scope: dict[str, Interval], guarded: bool, what: str) -> None:
        if _integer(index) is False:
            self.problem(f"{what} of {buffer.name} has a non-integer index")
            return
        if guarded:
            return
        span = self.interval(index, scope)
        if span is not None and (span[0] < 0 or span[1] >= buffer.size):
            self.problem(f"{what} of {buffer.name}[0, {buffer.size}) at indices {span[0]}..{span[1]}")

    def interval(
        self, root: Expr, scope: dict[str, Interval], overrides: dict[int, Interval] | None = None
    ) -> Interval:
        """The values ``root`` can take (inclusive), or None. A select on ``x < c`` (or <=, >, >=)
        evaluates each branch with ``x`` narrowed to the values that take it, so the usual
        reflect/clamp index idioms stay in bounds."""
        known: dict[int, Interval] = dict(overrides or {})
        for node in postorder(root):
            if id(node) in known:
                continue
            if isinstance(node, Select):
                known[id(node)] = self.select(node, scope, known)
            else:
                known[id(node)] = _interval(node, known, scope)
        return known[id(root)]

    def select(self, node: Select, scope: dict[str, Interval], known: dict[int, Interval]) -> Interval:
        cond = node.cond
        subject = cond.a if isinstance(cond, Binary) else None
        bound = known.get(id(cond.b)) if isinstance(cond, Binary) else None
        current = known.get(id(subject)) if subject is not None else None
        if not isinstance(cond, Binary) or cond.op not in NARROWING or current is None or bound is None:
            a, b = known[id(node.a)], known[id(node.b)]
            return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
        c = bound[0] if bound[0] == bound[1] else None
        if c is None:
            return None
        branches = []
        for branch, (low, high) in zip((node.a, node.b), NARROWING[cond.op](c)):
            narrowed = (max(current[0], low), min(current[1], high))
            if narrowed[0] > narrowed[1]:
                continue  # this branch is never taken
            branches.append(self.interval(branch, scope, {id(subject): narrowed}))
        if not branches or any(b is None for b in branches):
            return None
        return (min(b[0] for b in branches), max(b[1] for b in branches))  # type: ignore[index]


def _interval(e: Expr, known: dict[int, Interval], scope: dict[str, Interval]) -> Interval:
    if isinstance(e, Const):
        return None if e.dtype.is_float or e.dtype is DType.BOOL else (int(e.value), int(e.value))
    if isinstance(e, (Index, Scalar)):
        return scope.get(e.name)
    if isinstance(e, Cast):
        return None if e.dtype.is_float else known[id(e.a)]
    if isinstance(e, Unary) and e.op == "-":
        a = known[id(e.a)]
        return None if a is None else (-a[1], -a[0])
    if not isinstance(e, Binary):
        return None
    a, b = known[id(e.a)], known[id(e.b)]
    if e.op in COMPARISONS:
        return (0, 1)
    if a is None or b is None:
        return None
    if e.op == "+":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "-":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "*":
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if e.op == "/" and b[0] == b[1] and b[0] > 0:  # C division truncates: monotonic in a
        return (int(a[0] / b[0]), int(a[1] / b[0]))
    if e.op in ("min", "max"):
        pick = min if e.op == "min" else max
        return (pick(a[0], b[0]), pick(a[1], b[1]))
    if e.op == "%" and b[0] == b[1] and b[0] > 0:
        if a[0] >= 0 and a[1] < b[0]:
            return a
        return (0 if a[0] >= 0 else -(b[0] - 1), b[0] - 1)
    return None
