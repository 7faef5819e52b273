"""C code generation: kernels -> C11 functions, their parallel loops outlined onto kiln's pool
(each kernel's schedule says which). The translation unit around them (preludes, shared kernel
functions, ``kiln_segment_N`` and the ``kiln_run`` entry) is ``c_unit.py``'s."""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kiln.backends.cpu.c_engines import engine_call
from kiln.ir.types import DType
from kiln.lower.kir import (
    ENGINE_CALLS,
    LENGTH,
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
    Schedule,
    Select,
    Stmt,
    Store,
    Unary,
    buffers_in,
    dtypes_of,
    epilogue_of,
    is_run_time_scalar,
    map_expr,
    postorder,
    run_time_dim,
    shared_nodes,
)
from kiln.lower.target import PARALLEL_MIN
from kiln.source_text import c_comment

C_TYPES = {
    DType.FLOAT32: "float",
    DType.FLOAT64: "double",
    DType.FLOAT16: "_Float16",
    DType.BFLOAT16: "uint16_t",  # raw bits; arithmetic goes through float (see the prelude)
    DType.INT8: "int8_t",
    DType.UINT8: "uint8_t",
    DType.INT16: "int16_t",
    DType.UINT16: "uint16_t",
    DType.INT32: "int32_t",
    DType.UINT32: "uint32_t",
    DType.INT64: "int64_t",
    DType.UINT64: "uint64_t",
    DType.BOOL: "uint8_t",
}

# the C every translation unit starts with (types, the total integer division, bf16 conversions),
# and what debug and profiling builds add
PRELUDE = (Path(__file__).parent / "prelude.c").read_text()
DEBUG_PRELUDE = (Path(__file__).parent / "debug.c").read_text()
PROFILE_PRELUDE = (Path(__file__).parent / "profile.c").read_text()


def c_type(dtype: DType) -> str:
    return C_TYPES[dtype]


# set by emit_c for one rendering (CompileOptions.debug): every buffer index is range-checked
CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("kiln_checked", default=False)


# the kernel IR's operators as C: libm through <tgmath.h> (so float operands call the float
# functions) unless named here; float32 exp/tanh/erf are kiln's branch-free, vectorizable versions
# (within a few ulp of libm: the fast-math choice is this renderer's, not the kernel IR's)
C_FUNCTIONS = {"abs": "fabs", "round_even": "nearbyint", "bf16_to_f32": "kiln_bf16_to_f32"}
C_FLOAT32_FUNCTIONS = {"exp": "kiln_expf", "tanh": "kiln_tanhf", "erf": "kiln_erff"}


def _node_text(e: Expr, text: dict[int, str], types: dict[int, DType]) -> str:
    """C for one node whose operands' C is in ``text`` and types in ``types`` (by identity)."""
    if isinstance(e, Const):
        return _const(e)
    if isinstance(e, (Index, Scalar)):
        return e.name
    if isinstance(e, Load):
        if CHECKED.get():
            return f'{e.buffer.name}[kiln_checked({text[id(e.index)]}, {e.buffer.size}LL, "{e.buffer.name}", __LINE__)]'
        return f"{e.buffer.name}[{text[id(e.index)]}]"
    if isinstance(e, Binary):
        a, b = text[id(e.a)], text[id(e.b)]
        if e.op in ("pow", "fmod"):
            return f"{e.op}({a}, {b})"
        if e.op in ("/", "%") and types[id(e)] in INTEGERS and not _safe_divisor(e.b):
            signed = "s" if types[id(e)] in SIGNED else "u"
            name = f"kiln_{signed}{'div' if e.op == '/' else 'rem'}"
            return f"(({c_type(types[id(e)])}){name}({a}, {b}))"
        if (
            e.op in ("&&", "||")
            and types[id(e.a)] is DType.BOOL
            and types[id(e.b)] is DType.BOOL
            and _evaluates_nothing_new(e.b, e.a, types)
        ):
            # both sides are evaluated anyway: C's bitwise form has no branch, so the loop vectorizes
            # (a short-circuit `||` in an elementwise select keeps GCC from if-converting it)
            return f"({a} {e.op[0]} {b})"
        return f"({a} {e.op} {b})"
    if isinstance(e, Unary):
        if e.op in ("-", "!"):
            return f"({e.op}{text[id(e.a)]})"
        fast = C_FLOAT32_FUNCTIONS.get(e.op) if types[id(e.a)] is DType.FLOAT32 else None
        return f"{fast or C_FUNCTIONS.get(e.op, e.op)}({text[id(e.a)]})"
    if isinstance(e, Select):
        return f"({text[id(e.cond)]} ? {text[id(e.a)]} : {text[id(e.b)]})"
    if isinstance(e, Cast):
        if e.dtype is DType.BFLOAT16:
            return f"kiln_f32_to_bf16((float)({text[id(e.a)]}))"
        return f"(({c_type(e.dtype)})({text[id(e.a)]}))"
    raise TypeError(f"no C for {e!r}")


INTEGERS = frozenset(
    (DType.INT8, DType.UINT8, DType.INT16, DType.UINT16, DType.INT32, DType.UINT32, DType.INT64, DType.UINT64)
)
SIGNED = frozenset((DType.INT8, DType.INT16, DType.INT32, DType.INT64))


def _safe_divisor(e: Expr) -> bool:
    """A constant divisor C's / and % compute the kernel IR's quotient with (not 0, not -1)."""
    return isinstance(e, Const) and not isinstance(e.value, bool) and int(e.value) not in (0, -1)


def _evaluates_nothing_new(right: Expr, left: Expr, types: dict[int, DType]) -> bool:
    """Whether evaluating ``right`` unconditionally is safe once ``left`` is: every load it makes,
    ``left`` makes too (a load ``left`` guards stays guarded) and no integer division can trap."""
    left_loads = {n for n in postorder(left) if isinstance(n, Load)}  # by value: loads are pure
    for node in postorder(right):
        if isinstance(node, Load) and node not in left_loads:
            return False
        if (
            isinstance(node, Binary)
            and node.op in ("/", "%")
            and types[id(node)]
            not in (
                DType.FLOAT32,
                DType.FLOAT64,
            )
        ):
            return False
    return True


def _not_nan_const(e: Expr) -> bool:
    return isinstance(e, Const) and not (isinstance(e.value, float) and math.isnan(e.value))


def _max_select(a: Expr, b: Expr) -> Expr:
    """max as "b unless a is above b or unordered with it, and b is not NaN" (`!(a <= b) && b == b`):
    GCC 12 vectorizes chains of this form (a Clip's max then min), not of `a > b || a != a`, which
    left Relu6 epilogues scalar; against a constant that is not NaN, one comparison."""
    if _not_nan_const(b):
        return Select(Binary("<=", a, b), b, a)
    return Select(Binary("&&", Unary("!", Binary("<=", a, b)), Binary("==", b, b)), a, b)


def _min_select(a: Expr, b: Expr) -> Expr:
    if _not_nan_const(b):
        return Select(Binary(">=", a, b), b, a)
    return Select(Binary("&&", Unary("!", Binary(">=", a, b)), Binary("==", b, b)), a, b)


# kernel-IR operators C has no operator for, written as the C compiler's vectorizer wants them
C_EXPANSIONS: dict[str, Callable[[Expr, Expr], Expr]] = {"max": _max_select, "min": _min_select}


def _expanded(e: Expr) -> tuple[Expr, list[Expr]]:
    """``e`` with the operators of C_EXPANSIONS written out (``e`` itself when it has none), and
    its nodes in postorder (one walk for everything the renderer asks of it: statements of
    thousands of nodes are what a cold compile spends its Python time on)."""
    order = postorder(e)
    if not any(isinstance(n, Binary) and n.op in C_EXPANSIONS for n in order):
        return e, order
    e = map_expr(e, lambda n: C_EXPANSIONS[n.op](n.a, n.b) if isinstance(n, Binary) and n.op in C_EXPANSIONS else n)
    return e, postorder(e)


def expr(e: Expr) -> str:
    """C for a small expression (loop bounds, conditions, indices), written out whole."""
    e, order = _expanded(e)
    text: dict[int, str] = {}
    types = dtypes_of(e, order)
    for node in order:
        text[id(node)] = _node_text(node, text, types)
    return text[id(e)]


_temporaries = threading.local()  # a counter per rendering thread (size classes render at once),


def _restart_temporaries() -> None:  # restarted per generated function (its names stay canonical)
    _temporaries.count = itertools.count()


def _temporary() -> str:
    if not hasattr(_temporaries, "count"):
        _restart_temporaries()
    return f"kiln_x{next(_temporaries.count)}"


def bound_value(e: Expr, indent: str) -> tuple[list[str], str]:
    """C for a statement's value: declarations of temporaries (``kir.shared_nodes``: shared and
    deep subexpressions computed once, so code stays linear in the expression), then its text."""
    e, order = _expanded(e)
    bound = shared_nodes(e, order)
    text: dict[int, str] = {}
    types = dtypes_of(e, order)
    lines: list[str] = []
    for node in order:
        text[id(node)] = _node_text(node, text, types)
        if id(node) in bound:
            name = _temporary()
            lines.append(f"{indent}__auto_type {name} = {text[id(node)]};")
            text[id(node)] = name
    return lines, text[id(e)]


def _const(e: Const) -> str:
    value = e.value
    if e.dtype in (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16):
        value = float(value)
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "(-INFINITY)"
        text = repr(value)
        return text if e.dtype is DType.FLOAT64 else f"{text}f"
    if e.dtype is DType.BOOL:
        return "1" if value else "0"
    return f"(({c_type(e.dtype)}){int(value)}LL)" if e.dtype is DType.INT64 else f"(({c_type(e.dtype)}){int(value)})"


@dataclass
class _Outline:
    """Where a kernel's parallel loop goes: a function of its own (``<kernel>_p<k>``) that kiln's
    pool calls with a range of iterations and a ``kiln_loop_ctx`` (buffers, enclosing indices)."""

    name: str
    used: list[Buffer]
    table: dict[Buffer, int]
    parts: list[str] = field(default_factory=list)
    length: list[str] = field(default_factory=list)  # ``kiln_len``'s declaration (a run-time length)


def _scalars_from_outside(loop: For) -> bool:
    """Whether ``loop``'s body reads or assigns a scalar it does not define itself (an outlined
    loop receives only the buffers and the enclosing loop indices)."""
    defined: set[str] = set()
    used: set[str] = set()

    def visit(e: object) -> None:  # (the run-time length is declared in every function)
        used.update(n.name for n in postorder(e) if isinstance(n, Scalar) and not is_run_time_scalar(n.name))  # type: ignore[arg-type]

    def walk(stmts: Sequence[Stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, For):
                for bound in (stmt.start, stmt.extent):
                    if not isinstance(bound, int):
                        visit(bound)
                walk(stmt.body)
            elif isinstance(stmt, If):
                visit(stmt.cond)
                walk(stmt.body)
            elif isinstance(stmt, Let):
                defined.add(stmt.scalar.name)
                visit(stmt.value)
            elif isinstance(stmt, Assign):
                used.add(stmt.scalar.name)
                visit(stmt.value)
            elif isinstance(stmt, Store):
                visit(stmt.index)
                visit(stmt.value)
            # (an engine call: its operands are buffers and constants, nothing from outside)

    walk(loop.body)
    return bool(used - defined)


def _parallel_loop(stmt: For, schedule: Schedule, outline: _Outline, path: list[str], indent: str) -> list[str]:
    """The loop as a call into kiln's pool, its body outlined."""
    name = stmt.index.name
    function = f"{outline.name}_p{len(outline.parts)}"
    lines = [
        f"static void {function}(void *kiln_ctx, int64_t kiln_lo, int64_t kiln_hi, int kiln_participant) {{",
        "  void **buffers = ((kiln_loop_ctx *)kiln_ctx)->buffers;",
    ]
    lines.extend(f"  const int64_t {n} = ((kiln_loop_ctx *)kiln_ctx)->index[{i}];" for i, n in enumerate(path))
    lines.extend(_buffer_declarations(outline.used, outline.table, "  "))
    lines.extend(outline.length)
    if name == schedule.vectorize or name in schedule.simd:
        lines.append("#pragma omp simd")
    lines.append(f"  for (int64_t {name} = kiln_lo; {name} < kiln_hi; ++{name}) {{")
    lines.extend(statements(stmt.body, schedule, "    "))
    lines.extend(["  }", "}"])
    outline.parts.append("\n".join(lines))
    start = stmt.start if isinstance(stmt.start, int) else expr(stmt.start)
    stop = stmt.extent if isinstance(stmt.extent, int) else expr(stmt.extent)
    indices = ", ".join(path) or "0"
    return [
        f"{indent}{{",
        f"{indent}  kiln_loop_ctx kiln_c = {{buffers, {{{indices}}}}};",
        f"{indent}  kiln_parallel_for({start}, {stop}, 0, {pool_participants(stmt)}, {function}, &kiln_c);",
        f"{indent}}}",
    ]


def pool_participants(loop: For) -> str:
    """The pool's participants for a parallel loop: all (0), or, where the nest's extents are
    run-time values (sizes taken at run time: the schedule chose parallel at the capacity), one
    when this call's work is below ``PARALLEL_MIN`` elements: a decode step's 12-row copy of a
    short cache, say, runs inline rather than paying the pool's wake-up for microseconds of work."""
    extents, nested = [], loop
    while isinstance(nested, For) and isinstance(nested.start, int):
        extents.append(nested.extent)
        nested = nested.body[0] if len(nested.body) == 1 else None  # type: ignore[assignment]
    if all(isinstance(e, int) for e in extents):
        return "0"  # (known sizes: the schedule's own choice stands)
    inner = [e for e in extents[1:] if not isinstance(e, int)]
    # an inner extent must be known where the loop is called: numbers and the run-time sizes only
    # (one that follows an index or a scalar of the nest has no one product to test)
    if any(isinstance(n, Index) or (isinstance(n, Scalar) and not is_run_time_scalar(n.name))
           for e in inner for n in postorder(e)):  # fmt: skip
        return "0"
    work = " * ".join(f"({e if isinstance(e, int) else expr(e)})" for e in extents)
    return f"({work}) < {PARALLEL_MIN} ? 1 : 0"


def statements(
    body: Sequence[Stmt],
    schedule: Schedule,
    indent: str,
    outline: _Outline | None = None,
    path: list[str] | None = None,
) -> list[str]:
    """C for ``body``. With ``outline``, the schedule's parallel loop runs on kiln's pool when only
    loops enclose it (``path``: their indices; None below an if) and its body needs no scalar
    from outside; otherwise it runs on the calling thread."""
    lines: list[str] = []
    for stmt in body:
        if isinstance(stmt, For):
            name = stmt.index.name
            if (
                name == schedule.parallel
                and outline is not None
                and path is not None
                and len(path) <= 8
                and not _scalars_from_outside(stmt)
            ):
                lines.extend(_parallel_loop(stmt, schedule, outline, path, indent))
                continue
            if name == schedule.vectorize or name in schedule.simd:
                lines.append(f"{indent}#pragma omp simd")
            elif name in schedule.unroll:
                lines.append(f"{indent}#pragma GCC unroll {schedule.unroll[name]}")
            elif (total := _sum_reduction(stmt)) is not None:
                # a running sum (LayerNorm's mean and variance, softmax's total): SIMD partial sums,
                # added at the end (another order of the same additions; they are in double or
                # of one row, and a sequential sum is no more exact)
                lines.append(f"{indent}#pragma omp simd reduction(+:{total})")
            start = stmt.start if isinstance(stmt.start, int) else expr(stmt.start)
            stop = stmt.extent if isinstance(stmt.extent, int) else expr(stmt.extent)
            lines.append(f"{indent}for (int64_t {name} = {start}; {name} < {stop}; ++{name}) {{")
            inner = [*path, name] if path is not None else None
            lines.extend(statements(stmt.body, schedule, indent + "  ", outline, inner))
            lines.append(f"{indent}}}")
        elif isinstance(stmt, If):
            lines.append(f"{indent}if ({expr(stmt.cond)}) {{")
            lines.extend(statements(stmt.body, schedule, indent + "  ", outline, None))
            lines.append(f"{indent}}}")
        elif isinstance(stmt, Let):
            temporaries, value = bound_value(stmt.value, indent)
            lines.extend(temporaries)
            lines.append(f"{indent}{c_type(stmt.scalar.dtype)} {stmt.scalar.name} = {value};")
        elif isinstance(stmt, Assign):
            temporaries, value = bound_value(stmt.value, indent)
            lines.extend(temporaries)
            lines.append(f"{indent}{stmt.scalar.name} = {value};")
        elif isinstance(stmt, Store):
            temporaries, value = bound_value(stmt.value, indent)
            lines.extend(temporaries)
            lines.append(f"{indent}{expr(Load(stmt.buffer, stmt.index))} = {value};")
        elif isinstance(stmt, ENGINE_CALLS):
            lines.extend(engine_call(stmt, indent))
        else:
            raise TypeError(f"no C for {stmt!r}")
    return lines


def _buffer_declarations(
    buffers: Sequence[Buffer], table: dict[Buffer, int], indent: str, engine_block: Buffer | None = None
) -> list[str]:
    """Each buffer's pointer from the table (``engine_block``: from the descriptor's ``c`` instead)."""
    lines = []
    for b in buffers:
        source = "g->c" if b is engine_block else f"buffers[{table[b]}]"
        lines.append(f"{indent}{c_type(b.dtype)} *{b.name} = ({c_type(b.dtype)} *){source};")
    return lines


def length_declaration(
    length: tuple[Buffer, int] | None, indent: str = "  ", dims: tuple[Buffer, tuple[int, ...]] | None = None
) -> list[str]:
    """``kiln_len``, the length a function's sizes are expressions of (``kiln.driver.extents``):
    the valid-length input's value, at least the floor the kernels were lowered for; and the
    run-time dims ``kiln_d<i>`` it reads (``kiln.driver.spatial``), from the dims vector."""
    lines = []
    if length is not None:
        valid, floor = length
        lines += [
            f"{indent}const int64_t {LENGTH.name} = {valid.name}[0] > {floor} ? (int64_t){valid.name}[0] : {floor};",
            f"{indent}(void){LENGTH.name};",
        ]
    if dims is not None:
        vector, indices = dims
        for i in indices:
            name = run_time_dim(i).name
            lines += [f"{indent}const int64_t {name} = (int64_t){vector.name}[{i}];", f"{indent}(void){name};"]
    return lines


def _sum_reduction(loop: For) -> str | None:
    """The scalar a loop only accumulates into (``s = s + e``, e not reading s), else None."""
    if len(loop.body) != 1 or not isinstance(loop.body[0], Assign):
        return None
    update = loop.body[0]
    value = update.value
    if not (isinstance(value, Binary) and value.op == "+" and value.a == update.scalar):
        return None
    found: dict[str, None] = {}
    generated_names(value.b, found)
    return None if update.scalar.name in found else update.scalar.name


def emit_helper(function: Function, table: dict[Buffer, int]) -> str:
    """A gemm epilogue: ``(descriptor, batch, row range, column range)``; its buffers come from the
    descriptor's copy of the segment's table."""
    params = ", ".join(f"int64_t {p.name}" for p in function.params)
    _restart_temporaries()
    lines = [f"static void {function.name}(const kiln_gemm *g, {params}) {{", "  void **buffers = g->buffers;"]
    lines.extend(_buffer_declarations(list(dict.fromkeys(function.buffers)), table, "  ", function.engine_block))
    lines.extend(length_declaration(function.length, dims=function.dims))
    # a helper's inner loops (the micro-tile row's "c", the general path's "j") touch one element
    # per iteration: SIMD even when the epilogue reads scalars from buffers GCC cannot prove
    # unaliased (GELU's constants); the attention driver runs its scores block through "j"
    lines.extend(statements(function.body, function.schedule, "  "))
    lines.append("}")
    return "\n".join(lines)


def helper_functions(body: Sequence[Stmt]) -> list[Function]:
    found: list[Function] = []
    for stmt in body:
        if isinstance(stmt, ENGINE_CALLS) and epilogue_of(stmt) is not None:
            found.append(epilogue_of(stmt))  # type: ignore[arg-type]
        elif isinstance(stmt, (For, If)):
            found.extend(helper_functions(stmt.body))
    return found


def calls(body: Sequence[Stmt], kinds: tuple[type, ...]) -> bool:
    """Whether ``body`` makes an engine call of one of ``kinds``."""
    return any(isinstance(s, kinds) or (isinstance(s, (For, If)) and calls(s.body, kinds)) for s in body)


def emit_kernel(kernel: Kernel, used: list[Buffer], table: dict[Buffer, int], name: str) -> str:
    """One kernel as its own function ``name(void **buffers)`` declaring ``used``, its helpers
    before it."""
    lines = [emit_helper(f, table) for f in helper_functions(kernel.body)]
    _restart_temporaries()
    # never inlined into the segment: a kernel is a loop nest (a call costs nothing beside it), and
    # GCC inlining thousands of them into one function takes superlinear time
    outline = _Outline(name, used, table, length=length_declaration(kernel.length, dims=kernel.dims))
    body = statements(kernel.body, kernel.schedule, "  ", outline, [])
    lines.extend(outline.parts)  # the outlined parallel loops, before the function calling them
    lines.append(f"static __attribute__((noinline)) void {name}(void **buffers) {{")
    lines.append(f"  /* {c_comment(kernel.kind)} */")
    lines.extend(_buffer_declarations(used, table, "  "))
    lines.extend(outline.length)
    lines.extend(body)
    lines.append("}")
    return "\n".join(lines)


def kernel_buffers(kernel: Kernel) -> list[Buffer]:
    """Every buffer a kernel's function needs (its helpers' too: ``buffers_in`` walks them)."""
    return list(dict.fromkeys([*kernel.reads, *kernel.writes, *buffers_in(kernel.body)]))


def generated_names(root: object, found: dict[str, None]) -> None:
    """Every name kiln generated in a kernel (buffers, loop indices, scalars, helpers), in order of
    first appearance; each shared subexpression is visited once, without recursion."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, (Index, Scalar, Buffer, Function)):
            found[node.name] = None
        if isinstance(node, (list, tuple)):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif dataclasses.is_dataclass(node) and not isinstance(node, (type, Buffer)):
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.extend(reversed([getattr(node, f.name) for f in dataclasses.fields(node)]))
