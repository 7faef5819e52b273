"""The kernel IR as text, for people and for Before/Expected tests (``kiln explain --print-after``).

    kernel k2 (pointwise) reads b0: f32[64] writes b1: f32[64] schedule vectorize=i1
      for i1 in 0..64:
        %t0 = b0[i1]
        b1[i1] = select(%t0 < 0.0, 0.0, %t0)

Shared and deep subexpressions are named once (``%tN``, as the C renderer binds them), so the text
stays linear in the expression. Engine calls print their descriptor's fields and epilogue helpers
print as their own functions after the kernel.
"""

from __future__ import annotations

import dataclasses

from kiln.lower.kir import (
    ENGINE_CALLS,
    Assign,
    AttentionOperand,
    AttentionSpec,
    Binary,
    Buffer,
    Cast,
    Const,
    DirectOperand,
    EngineCall,
    Expr,
    For,
    Function,
    GemmSpec,
    If,
    Im2colOperand,
    Index,
    Kernel,
    Let,
    Load,
    MatrixOperand,
    PackedOperand,
    QuantSpec,
    Requantize,
    Scalar,
    Schedule,
    Select,
    Stmt,
    Store,
    TileFinish,
    Unary,
    WinogradInput,
    WinogradOutput,
    epilogue_of,
    postorder,
    shared_nodes,
)

CALL_NAMES = {
    GemmSpec: "gemm",
    WinogradInput: "winograd_input",
    WinogradOutput: "winograd_output",
    AttentionSpec: "attention",
}
OPERAND_NAMES = {
    MatrixOperand: "view",
    PackedOperand: "packed",
    Im2colOperand: "im2col",
    DirectOperand: "direct",
    AttentionOperand: "slices",
    QuantSpec: "quant",
    TileFinish: "finish",
    Requantize: "requantize",
}


def print_kernel(kernel: Kernel) -> str:
    """The kernel as text: header (name, kind, buffers, schedule), body, then its helpers."""
    reads = ", ".join(_buffer(b) for b in kernel.reads)
    writes = ", ".join(_buffer(b) for b in kernel.writes)
    schedule = _schedule(kernel.schedule)
    lines = [f"kernel {kernel.name} ({kernel.kind}) reads {reads or '-'} writes {writes or '-'}{schedule}"]
    printer = _Printer()
    lines.extend(printer.statements(kernel.body, "  "))
    for helper in printer.helpers:
        lines.append(print_function(helper))
    return "\n".join(lines)


def print_function(function: Function) -> str:
    params = ", ".join(p.name for p in function.params)
    lines = [f"helper {function.name}({params}){_schedule(function.schedule)}"]
    lines.extend(_Printer().statements(function.body, "  "))
    return "\n".join(lines)


def print_expr(e: Expr) -> str:
    """One expression on one line (shared subexpressions repeated: for short expressions)."""
    text: dict[int, str] = {}
    for node in postorder(e):
        text[id(node)] = _node(node, text)
    return text[id(e)]


def _buffer(b: Buffer) -> str:
    return f"{b.name}: {b.dtype.short}[{b.size}]"


def _schedule(s: Schedule) -> str:
    parts = [f"parallel={s.parallel}"] if s.parallel else []
    if s.vectorize:
        parts.append(f"vectorize={s.vectorize}")
    parts.extend(f"unroll {name}={count}" for name, count in s.unroll.items())
    if s.simd:
        parts.append(f"simd={','.join(s.simd)}")
    parts.extend(f"bind {name}={axis}" for name, axis in s.bind.items())
    parts.extend(f"pipeline {name}={interval}" for name, interval in s.pipeline.items())
    return f" schedule {' '.join(parts)}" if parts else ""


def _const(c: Const) -> str:
    if isinstance(c.value, bool):
        return "true" if c.value else "false"
    if c.dtype.is_float:
        return repr(float(c.value))
    return str(int(c.value))


def _node(e: Expr, text: dict[int, str]) -> str:
    if isinstance(e, Const):
        return _const(e)
    if isinstance(e, (Index, Scalar)):
        return e.name
    if isinstance(e, Load):
        return f"{e.buffer.name}[{text[id(e.index)]}]"
    if isinstance(e, Binary):
        a, b = text[id(e.a)], text[id(e.b)]
        return f"{e.op}({a}, {b})" if e.op.isalpha() else f"({a} {e.op} {b})"
    if isinstance(e, Unary):
        return f"{e.op}{text[id(e.a)]}" if e.op in ("-", "!") else f"{e.op}({text[id(e.a)]})"
    if isinstance(e, Select):
        return f"select({text[id(e.cond)]}, {text[id(e.a)]}, {text[id(e.b)]})"
    if isinstance(e, Cast):
        return f"{e.dtype.short}({text[id(e.a)]})"
    raise TypeError(f"not a kernel-IR expression: {e!r}")


class _Printer:
    def __init__(self) -> None:
        self.temporaries = 0
        self.helpers: list[Function] = []

    def value(self, e: Expr, indent: str, lines: list[str]) -> str:
        bound = shared_nodes(e)
        text: dict[int, str] = {}
        for node in postorder(e):
            text[id(node)] = _node(node, text)
            if id(node) in bound:
                name = f"%t{self.temporaries}"
                self.temporaries += 1
                lines.append(f"{indent}{name} = {text[id(node)]}")
                text[id(node)] = name
        return text[id(e)]

    def statements(self, body: list[Stmt], indent: str) -> list[str]:
        lines: list[str] = []
        for stmt in body:
            if isinstance(stmt, For):
                start = stmt.start if isinstance(stmt.start, int) else print_expr(stmt.start)
                extent = stmt.extent if isinstance(stmt.extent, int) else print_expr(stmt.extent)
                lines.append(f"{indent}for {stmt.index.name} in {start}..{extent}:")
                lines.extend(self.statements(stmt.body, indent + "  "))
            elif isinstance(stmt, If):
                lines.append(f"{indent}if {print_expr(stmt.cond)}:")
                lines.extend(self.statements(stmt.body, indent + "  "))
            elif isinstance(stmt, (Let, Assign)):
                value = self.value(stmt.value, indent, lines)
                keyword = "let " if isinstance(stmt, Let) else ""
                typed = f": {stmt.scalar.dtype.short}" if isinstance(stmt, Let) else ""
                lines.append(f"{indent}{keyword}{stmt.scalar.name}{typed} = {value}")
            elif isinstance(stmt, Store):
                value = self.value(stmt.value, indent, lines)
                lines.append(f"{indent}{stmt.buffer.name}[{print_expr(stmt.index)}] = {value}")
            elif isinstance(stmt, ENGINE_CALLS):
                lines.append(indent + self.call(stmt))
            else:
                raise TypeError(f"not a kernel-IR statement: {stmt!r}")
        return lines

    def call(self, stmt: EngineCall) -> str:
        """``gemm(batch=1, m=5, ..., a=view(b1, 0, 4, 1), ...) epilogue kiln_k1_epilogue``."""

        def argument(value: object) -> str:
            if isinstance(value, Buffer):
                return value.name
            if dataclasses.is_dataclass(value):  # an operand: its kind, buffer and layout
                parts = [argument(getattr(value, f.name)) for f in dataclasses.fields(value)]
                return f"{OPERAND_NAMES[type(value)]}({', '.join(parts)})"
            if value is None:
                return "none"
            return str(value)

        epilogue = epilogue_of(stmt)
        if epilogue is not None:
            self.helpers.append(epilogue)
        fields = ", ".join(
            f"{f.name}={argument(getattr(stmt, f.name))}" for f in dataclasses.fields(stmt) if f.name != "epilogue"
        )
        return f"{CALL_NAMES[type(stmt)]}({fields})" + (f" epilogue {epilogue.name}" if epilogue is not None else "")
