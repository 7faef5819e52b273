"""HLS C++ from a fixed-point design: one function per kernel, a DATAFLOW top per segment.

The source is what Vitis HLS synthesizes and what g++ builds for the C simulation (``csim``):

- every tensor is an ``ap_fixed`` array of its format with AP_RND/AP_SAT (a store rounds and
  saturates); weights and function tables are ``static const`` ROMs initialised with their exact
  values; a kernel's locals (``formats``) are arrays of their exact formats, rounded into the
  tensor in one loop when the kernel ends;
- each float expression node is a typed temporary (``ap_fixed<W, I>``), so its width is the
  design's, not the compiler's; integer index arithmetic is plain C (``long long``);
- the schedule is directives: ``#pragma HLS PIPELINE II=`` on the loop ``schedule.pipelined``
  picks for the reuse factor (II = 1, or the reuse factor on a convolution's pixel loop), arrays read in an unrolled iteration ``ARRAY_PARTITION``-ed;
- a segment's top function takes its inputs and outputs as AXI-Stream ports
  (``hls::stream``), its kernels connected by arrays under ``#pragma HLS DATAFLOW``;
- ``kiln_segment<i>(void **table)`` (compiled only outside synthesis) is the C simulation's entry:
  float tensors in, streamed through the top, float tensors out.

Loads a conditional does not always evaluate read a clamped index (the value is discarded when
the condition is false; a hardware read never leaves its array).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kiln.backends.fpga.fixed import Format, quantize, to_float
from kiln.backends.fpga.formats import Design, KernelDesign, is_float
from kiln.backends.fpga.schedule import banks, pipelined
from kiln.backends.fpga.streams import Channel, drain, fill, segment_tensors
from kiln.backends.registry import PlanFacts
from kiln.ir.types import DType
from kiln.lower.kir import (
    Assign,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    If,
    Index,
    Let,
    Load,
    Scalar,
    Select,
    Stmt,
    Store,
    Unary,
    dtypes_of,
    evaluated_always,
    postorder,
)

INT_TYPES = {
    DType.INT64: "long long",
    DType.INT32: "int",
    DType.INT16: "short",
    DType.INT8: "signed char",
    DType.UINT8: "unsigned char",
    DType.BOOL: "unsigned char",
}
C_OPS = {"&&", "||", "&", "|", "^", "<<", ">>", "<", "<=", ">", ">=", "==", "!=", "+", "-", "*"}
DESIGN_MARK = "// -- the design: ROMs, kernels, top functions --"
STATUS = "status"  # the status word a kernel sets when its input is invalid (an output flag port)
STATIC_ELEMENTS = 16384  # arrays larger than this are static (the C simulation's stack)

PRELUDE = """\
#include <ap_fixed.h>
#include <ap_int.h>
#include <hls_stream.h>

// the mantissa of a fixed-point value, and a value set from one
template <int W, bool S, class T> static inline long long kiln_raw(const T &x) {
  if (S) { ap_int<W> r; r.range(W - 1, 0) = x.range(W - 1, 0); return r.to_int64(); }
  ap_uint<W> r; r.range(W - 1, 0) = x.range(W - 1, 0); return (long long)r.to_uint64();
}
template <int W, class T> static inline void kiln_set(T &x, long long m) {
  ap_int<64> r = m; x.range(W - 1, 0) = r.range(W - 1, 0);
}
// a ROM word (a mantissa, stored as a plain integer: W bits of block RAM or LUT ROM) as its type
template <class T, int W> static inline T kiln_rom(long long m) { T x; kiln_set<W>(x, m); return x; }
// quotient of aligned mantissas, truncated toward zero; by zero the extreme of the dividend's sign
static inline long long kiln_div(long long a, long long b, int shift, long long lowest, long long highest) {
  if (b == 0) return a == 0 ? 0 : (a > 0 ? highest : lowest);
  ap_int<200> n = a, d = b;
  if (shift >= 0) n = n << shift; else d = d << (-shift);
  bool negative = (n < 0) != (d < 0);
  if (n < 0) n = -n;
  if (d < 0) d = -d;
  ap_int<200> q = n / d;
  if (negative) q = -q;
  if (q > highest) return highest;
  if (q < lowest) return lowest;
  return q.to_int64();
}
static inline long long kiln_floor(long long m, int f) { return f > 0 ? (m >> f) : (m << (-f)); }
static inline long long kiln_ceil(long long m, int f) { return f > 0 ? -((-m) >> f) : (m << (-f)); }
static inline long long kiln_round_even(long long m, int f) {
  if (f <= 0) return m << (-f);
  long long q = (m + (1LL << (f - 1))) >> f;
  if ((m & ((1LL << f) - 1)) == (1LL << (f - 1)) && (q & 1)) q -= 1;
  return q;
}
// floor(sqrt(m << shift)), digit by digit (a fixed number of steps: synthesizable); m <= 0 gives 0
static inline long long kiln_sqrt(long long m, int shift) {
  if (m <= 0) return 0;
  ap_uint<128> n = m;
  if (shift >= 0) n = n << shift; else n = n >> (-shift);
  ap_uint<128> root = 0, bit = ap_uint<128>(1) << 126;
  for (int i = 0; i < 64; ++i) {
    if (bit != 0) {
      if (n >= root + bit) { n -= root + bit; root = (root >> 1) + bit; } else { root = root >> 1; }
      bit = bit >> 2;
    }
  }
  return (long long)root.to_uint64();
}
static inline int kiln_index(long long m, long long start, int shift, int size) {
  long long p = (m - start) >> shift;
  return (int)(p < 0 ? 0 : (p >= size ? size - 1 : p));
}
static inline long long kiln_clamp(long long i, long long size) { return i < 0 ? 0 : (i >= size ? size - 1 : i); }
"""


def literal(m: int, fmt: Format) -> str:
    return repr(to_float(m, fmt))


def element_type(buffer: Buffer, design: Design) -> str:
    if is_float(buffer):
        return f"t_{buffer.name}"
    return INT_TYPES.get(buffer.dtype, "long long")


@dataclass
class _Function:
    lines: list[str] = field(default_factory=list)
    temps: int = 0
    depth: int = 1

    def emit(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)


def render(
    design: Design, facts: PlanFacts, segments: Sequence[Sequence], slots: dict[Buffer, int], reuse: int, spec: str
) -> str:
    """The HLS C++ of ``design`` (``segments``: the plan's kernels by segment)."""
    parts = [f"// HLS C++ generated by kiln for {spec}: {len(design.kernels)} kernel(s)", PRELUDE]
    for buffer, fmt in design.formats.items():
        parts.append(f"typedef {fmt.c_type(rounding=True)} t_{buffer.name};  // {facts.names.get(buffer, buffer.name)}")
    parts.append(DESIGN_MARK)
    for buffer, values in facts.constants.items():
        if any(buffer in kd.kernel.reads for kd in design.kernels):
            parts.append(_rom(buffer, values, design))
    by_kernel = {kd.kernel.name: kd for kd in design.kernels}
    for kd in design.kernels:
        parts.append(_kernel(kd, design, facts, reuse, design.streams))
    for number, segment in enumerate(segments):
        names = {k.name for k in segment}
        streams = {b: c for b, c in design.streams.items() if c.consumer in names}
        parts.append(_top(number, [by_kernel[k.name] for k in segment], design, facts, slots, streams))
    return "\n".join(parts) + "\n"


def mantissa_type(fmt: Format) -> str:
    """The plain C integer a ROM of ``fmt`` stores its mantissas in (an initializer of class
    type, ap_fixed's, compiles into a static constructor that g++ takes minutes over)."""
    return (
        next(t for bits, t in ((8, "signed char"), (16, "short"), (32, "int")) if fmt.width <= bits)
        if fmt.width <= 32
        else "long long"
    )


def rom_words(values, fmt: Format) -> str:
    return ",".join(str(quantize(float(v), fmt)) for v in values)


def rom_read(name: str, fmt: Format, index: str) -> str:
    return f"kiln_rom<{fmt.c_type()}, {fmt.width}>({name}[{index}])"


def _rom(buffer: Buffer, values, design: Design) -> str:
    flat = values.reshape(-1)
    if is_float(buffer):
        fmt = design.formats[buffer]
        kind = mantissa_type(fmt)
        return (
            f"static const {kind} {buffer.name}[{buffer.size}] = {{{rom_words(flat, fmt)}}};  // {fmt.text()} mantissas"
        )
    body = ",".join(str(int(v)) for v in flat)
    return f"static const {element_type(buffer, design)} {buffer.name}[{buffer.size}] = {{{body}}};"


def _params(kd: KernelDesign, facts: PlanFacts, design: Design) -> list[Buffer]:
    used = dict.fromkeys([*kd.kernel.reads, *kd.kernel.writes, *_stored(kd.kernel.body)])
    return [b for b in used if b not in facts.constants and b.name != STATUS]


def _stored(body: Sequence[Stmt]) -> list[Buffer]:
    found: list[Buffer] = []
    for stmt in body:
        if isinstance(stmt, Store):
            found.append(stmt.buffer)
        elif isinstance(stmt, (For, If)):
            found.extend(_stored(stmt.body))
    return found


def _reports(kd: KernelDesign) -> bool:
    """Whether the kernel sets the status word (an index out of range: the run fails)."""
    return any(b.name == STATUS for b in _stored(kd.kernel.body))


def _kernel(kd: KernelDesign, design: Design, facts: PlanFacts, reuse: int, streams: dict[Buffer, Channel]) -> str:
    kernel = kd.kernel
    params = _params(kd, facts, design)
    written = set(kernel.writes) | set(_stored(kernel.body))
    sources = {b: c for b, c in streams.items() if c.consumer == kernel.name}
    sinks = {b: c for b, c in streams.items() if c.producer == kernel.name}
    signature = ", ".join(
        [
            f"hls::stream<{element_type(b, design)}> &s_{b.name}"
            if b in sources or b in sinks
            else f"{'const ' if b not in written else ''}{element_type(b, design)} {b.name}[{b.size}]"
            for b in params
        ]
        + (["int status[1]"] if _reports(kd) else [])
    )
    out = _Function()
    out.lines.append(f"// {kernel.kind}: {', '.join(kernel.sources)}")
    out.lines.append(f"static void {kernel.name}({signature}) {{")
    out.emit("#pragma HLS INLINE off")
    for buffer, fmt in kd.local.items():
        storage = "static " if buffer.size > STATIC_ELEMENTS else ""
        out.emit(f"{storage}{fmt.c_type()} l_{buffer.name}[{buffer.size}];")
    staged = [b for b, c in sinks.items() if c.staged]
    for buffer in staged:  # computed whole, streamed out when the kernel ends
        storage = "static " if buffer.size > STATIC_ELEMENTS else ""
        out.emit(f"{storage}{element_type(buffer, design)} {buffer.name}[{buffer.size}];")
    _windows(out, sources, design)
    partitions = banks(kernel, reuse)
    for buffer, count in partitions.items():
        if buffer in sinks and not (buffer in kd.local or buffer in staged):
            continue  # written to its stream
        size = sources[buffer].window.size if buffer in sources else buffer.size
        name = f"w_{buffer.name}" if buffer in sources else f"l_{buffer.name}" if buffer in kd.local else buffer.name
        how = "complete" if count >= size else f"cyclic factor={count}"
        out.emit(f"#pragma HLS ARRAY_PARTITION variable={name} {how} dim=1")
    for buffer in kd.copy_in:
        _copy(out, f"l_{buffer.name}", buffer.name, buffer.size, partitions.get(buffer, 1))
    loops = pipelined(kernel, reuse)
    body = _Body(kd, design, out, loops, {b for b in facts.constants if is_float(b)})
    body.sources, body.sinks = sources, {b: c for b, c in sinks.items() if not c.staged and b not in kd.local}
    for channel in sources.values():
        if not channel.window.groups:
            fill(channel, out.emit, f"need_{channel.buffer.name}")
    body.block(kernel.body)
    for buffer in kd.local:
        if buffer in sinks:
            _stream(out, f"s_{buffer.name}.write(l_{buffer.name}[i]);", buffer.size)
        else:
            _copy(out, buffer.name, f"l_{buffer.name}", buffer.size, partitions.get(buffer, 1))
    for buffer in staged:
        _stream(out, f"s_{buffer.name}.write({buffer.name}[i]);", buffer.size)
    for channel in sources.values():
        drain(channel, out.emit)
    out.lines.append("}")
    return "\n".join(out.lines)


def _windows(out: _Function, sources: dict[Buffer, Channel], design: Design) -> None:
    """A consumer's windows of its input streams: the buffer, its read count, each group's need."""
    for buffer, channel in sources.items():
        window = channel.window
        storage = "static " if window.size > STATIC_ELEMENTS else ""
        out.emit(f"{storage}{element_type(buffer, design)} w_{buffer.name}[{window.size}];  // of {buffer.size}")
        out.emit(f"int r_{buffer.name} = 0;")
        needs = ",".join(str(n) for n in window.needs)
        out.emit(f"static const int need_{buffer.name}[{len(window.needs)}] = {{{needs}}};")


def _copy(out: _Function, dest: str, source: str, size: int, banks: int) -> None:
    """``dest = source``, one element per bank per cycle (both partitioned alike)."""
    if banks <= 1:
        _stream(out, f"{dest}[i] = {source}[i];", size)
        return
    out.emit(f"for (int c = 0; c < {-(-size // banks)}; ++c) {{")
    out.emit("#pragma HLS PIPELINE II=1")
    out.emit(f"  for (int j = 0; j < {banks}; ++j) {{")
    out.emit("  #pragma HLS UNROLL")
    out.emit(f"    int i = c * {banks} + j;")
    out.emit(f"    if (i < {size}) {dest}[i] = {source}[i];")
    out.emit("  }")
    out.emit("}")


class _Body:
    def __init__(self, kd: KernelDesign, design: Design, out: _Function, loops: dict, roms: set[Buffer]) -> None:
        self.kd, self.design, self.out, self.loops, self.roms = kd, design, out, loops, roms
        self.sources: dict[Buffer, Channel] = {}  # input streams read through windows
        self.sinks: dict[Buffer, Channel] = {}  # output streams written in store order

    def block(self, body: Sequence[Stmt]) -> None:
        out = self.out
        for stmt in body:
            if isinstance(stmt, For):
                i = stmt.index.name
                out.emit(f"for (int {i} = {stmt.start}; {i} < {stmt.extent}; ++{i}) {{")
                out.depth += 1
                if id(stmt) in self.loops:
                    out.emit(f"#pragma HLS PIPELINE II={self.loops[id(stmt)].interval}")
                for channel in self.sources.values():
                    if channel.window.groups and channel.window.groups[-1] is stmt:
                        fill(channel, out.emit, f"need_{channel.buffer.name}")
                self.block(stmt.body)
                out.depth -= 1
                out.emit("}")
            elif isinstance(stmt, If):
                cond = self.expression(stmt.cond)
                out.emit(f"if ({cond}) {{")
                out.depth += 1
                self.block(stmt.body)
                out.depth -= 1
                out.emit("}")
            elif isinstance(stmt, (Let, Assign)):
                value = self.expression(stmt.value)
                fmt = self.kd.scalars.get(stmt.scalar.name)
                kind = fmt.c_type() if fmt else INT_TYPES.get(stmt.scalar.dtype, "long long")
                prefix = f"{kind} " if isinstance(stmt, Let) else ""
                out.emit(f"{prefix}{stmt.scalar.name} = {value};")
            elif isinstance(stmt, Store):
                index = self.expression(stmt.index)
                value = self.expression(stmt.value)
                if stmt.buffer in self.sinks:  # in the order the stream carries (streams.Order)
                    out.emit(f"s_{stmt.buffer.name}.write({element_type(stmt.buffer, self.design)}({value}));")
                    continue
                name = f"l_{stmt.buffer.name}" if stmt.buffer in self.kd.local else stmt.buffer.name
                out.emit(f"{name}[{index}] = {value};")

    def expression(self, e: Expr) -> str:
        """Emits a temporary per float node; returns the C text of ``e``."""
        types = dtypes_of(e)
        always = evaluated_always(e)
        text: dict[int, str] = {}
        for node in postorder(e):
            fmt = self.kd.nodes.get(id(node))
            code = self.node(node, text, fmt, id(node) in always)
            if fmt is not None and not isinstance(node, (Load, Scalar, Const)):
                self.out.temps += 1
                name = f"v{self.out.temps}"
                self._define(name, node, fmt, code, text)
                code = name
            elif fmt is None and types[id(node)].is_float:
                raise AssertionError(f"untyped float node {node!r}")
            text[id(node)] = code
        return text[id(e)]

    def _define(self, name: str, node: Expr, fmt: Format, code: str, text: dict[int, str]) -> None:
        if code.startswith("@set "):  # a value built from its mantissa
            self.out.emit(f"{fmt.c_type()} {name};")
            self.out.emit(f"kiln_set<{fmt.width}>({name}, {code[5:]});")
        else:
            self.out.emit(f"{fmt.c_type()} {name} = {code};")

    def node(self, node: Expr, text: dict[int, str], fmt: Format | None, always: bool) -> str:
        if isinstance(node, Const):
            if fmt is not None:
                return f"{fmt.c_type()}({literal(quantize(float(node.value), fmt), fmt)})"
            return f"{int(node.value)}LL" if not isinstance(node.value, bool) else str(int(node.value))
        if isinstance(node, Index):
            return node.name
        if isinstance(node, Scalar):
            return node.name
        if isinstance(node, Load):
            index = text[id(node.index)]
            if not always:
                index = f"kiln_clamp({index}, {node.buffer.size})"
            if node.buffer in self.roms:
                return rom_read(node.buffer.name, self.design.formats[node.buffer], index)
            if node.buffer in self.sources:
                channel = self.sources[node.buffer]
                return f"w_{node.buffer.name}[{channel.order.text(index)} % {channel.window.size}]"
            name = f"l_{node.buffer.name}" if node.buffer in self.kd.local else node.buffer.name
            return f"{name}[{index}]"
        if isinstance(node, Select):
            c, a, b = text[id(node.cond)], text[id(node.a)], text[id(node.b)]
            if fmt is None:
                return f"(({c}) ? ({a}) : ({b}))"
            t = fmt.c_type()
            return f"(({c}) ? {t}({a}) : {t}({b}))"
        if isinstance(node, Cast):
            a = text[id(node.a)]
            if fmt is None:
                return f"(({INT_TYPES.get(node.dtype, 'long long')})({a}))"
            return a if id(node.a) in self.kd.nodes else f"(long long)({a})"
        if isinstance(node, Binary):
            return self.binary(node, text, fmt)
        return self.unary(node, text, fmt)

    def raw(self, node: Expr) -> str:
        fmt = self.kd.nodes[id(node)]
        return f"kiln_raw<{fmt.width}, {'true' if fmt.signed else 'false'}>"

    def binary(self, node: Binary, text: dict[int, str], fmt: Format | None) -> str:
        a, b = text[id(node.a)], text[id(node.b)]
        if fmt is None:
            if node.op in ("/", "%"):
                return f"(({b}) == 0 ? 0LL : ({a}) {node.op} ({b}))"
            if node.op in ("max", "min"):
                return f"(({a}) {'>' if node.op == 'max' else '<'} ({b}) ? ({a}) : ({b}))"
            return f"(({a}) {node.op} ({b}))"
        t = fmt.c_type()
        if node.op in ("+", "-", "*"):
            return f"{a} {node.op} {b}"
        if node.op in ("max", "min"):
            return f"({a} {'>' if node.op == 'max' else '<'} {b}) ? {t}({a}) : {t}({b})"
        assert node.op == "/"
        fa, fb = self.kd.nodes[id(node.a)], self.kd.nodes[id(node.b)]
        shift = fmt.fraction + fb.fraction - fa.fraction
        return (
            f"@set kiln_div({self.raw(node.a)}({a}), {self.raw(node.b)}({b}), {shift}, {fmt.lowest}LL, {fmt.highest}LL)"
        )

    def unary(self, node: Unary, text: dict[int, str], fmt: Format | None) -> str:
        a = text[id(node.a)]
        if fmt is None:
            return f"(!({a}))" if node.op == "!" else f"({node.op if node.op == '-' else ''}({a}))"
        t = fmt.c_type()
        if node.op == "-":
            return f"-{a}"
        if node.op == "abs":
            return f"({a} < 0) ? {t}(-{a}) : {t}({a})"
        source = self.kd.nodes[id(node.a)]
        if node.op in ("floor", "ceil", "round_even"):
            return f"@set kiln_{node.op}({self.raw(node.a)}({a}), {source.fraction})"
        if node.op == "sqrt":
            return f"@set kiln_sqrt({self.raw(node.a)}({a}), {2 * fmt.fraction - source.fraction})"
        table = self.kd.tables[id(node)]
        self.out.temps += 1
        rom = f"table{self.out.temps}"
        values = ",".join(str(v) for v in table.values)
        self.out.emit(f"static const {mantissa_type(table.out)} {rom}[{table.size}] = {{{values}}};  // {node.op}")
        index = f"kiln_index({self.raw(node.a)}({a}), {table.start}LL, {table.shift}, {table.size})"
        return rom_read(rom, table.out, index)


def _top(
    number: int,
    kernels: list[KernelDesign],
    design: Design,
    facts: PlanFacts,
    slots: dict[Buffer, int],
    streams: dict[Buffer, Channel],
) -> str:
    """The segment's top function (streams in and out, DATAFLOW) and its C-simulation entry."""
    inputs, outputs, inner = segment_tensors(number, kernels, facts)
    ports = [f"hls::stream<{element_type(b, design)}> &s_{b.name}" for b in [*inputs, *outputs]]
    reports = any(_reports(kd) for kd in kernels)
    if reports:
        ports.append("int status[1]")
    out = _Function()
    out.lines.append(f"void kiln_top{number}({', '.join(ports)}) {{")
    for b in [*inputs, *outputs]:
        out.emit(f"#pragma HLS INTERFACE axis port=s_{b.name}")
    if reports:
        out.emit("#pragma HLS INTERFACE s_axilite port=status")
    out.emit("#pragma HLS INTERFACE ap_ctrl_hs port=return")
    out.emit("#pragma HLS DATAFLOW")
    for b in [*inputs, *outputs, *inner]:
        if b in streams:
            # a consumer with several input streams may wait on one while another fills: those
            # FIFOs hold a whole tensor (no deadlock under DATAFLOW); a chain's hold two
            many = sum(1 for c in streams.values() if c.consumer == streams[b].consumer) > 1
            out.emit(f"hls::stream<{element_type(b, design)}> s_{b.name};")
            out.emit(f"#pragma HLS STREAM variable=s_{b.name} depth={b.size if many else 2}")
            continue
        storage = "static " if b.size > STATIC_ELEMENTS else ""
        out.emit(f"{storage}{element_type(b, design)} {b.name}[{b.size}];")
    for b in inputs:
        _stream(out, f"{b.name}[i] = s_{b.name}.read();", b.size)
    for kd in kernels:
        arguments = [f"s_{b.name}" if b in streams else b.name for b in _params(kd, facts, design)]
        arguments += ["status"] if _reports(kd) else []
        out.emit(f"{kd.kernel.name}({', '.join(arguments)});")
    for b in outputs:
        _stream(out, f"s_{b.name}.write({b.name}[i]);", b.size)
    out.lines.append("}")
    out.lines.append("#ifndef __SYNTHESIS__")
    out.lines.append(f'extern "C" int kiln_segment{number}(void **table) {{')
    for b in [*inputs, *outputs]:
        out.emit(f"hls::stream<{element_type(b, design)}> s_{b.name};")
    for b in inputs:
        c = "float" if is_float(b) else INT_TYPES.get(b.dtype, "long long")
        convert = f"({element_type(b, design)})(p[i])"
        out.emit(
            f"{{ const {c} *p = (const {c} *)table[{slots[b]}]; for (int i = 0; i < {b.size}; ++i) s_{b.name}.write({convert}); }}"
        )
    status = ["(int *)table[0]"] if reports else []
    out.emit(f"kiln_top{number}({', '.join(['s_' + b.name for b in [*inputs, *outputs]] + status)});")
    for b in outputs:
        c = "float" if is_float(b) else INT_TYPES.get(b.dtype, "long long")
        value = f"(float)s_{b.name}.read().to_double()" if is_float(b) else f"({c})s_{b.name}.read()"
        out.emit(f"{{ {c} *p = ({c} *)table[{slots[b]}]; for (int i = 0; i < {b.size}; ++i) p[i] = {value}; }}")
    out.emit("return 0;")
    out.lines.append("}")
    out.lines.append("#endif")
    return "\n".join(out.lines)


def _stream(out: _Function, statement: str, size: int) -> None:
    out.emit(f"for (int i = 0; i < {size}; ++i) {{")
    out.emit("#pragma HLS PIPELINE II=1")
    out.emit(f"  {statement}")
    out.emit("}")


def header(source: str) -> str:
    """The declarations a testbench includes: the headers, helpers, tensor types and the top
    functions' prototypes (``source`` is ``render``'s)."""
    head = source.split(DESIGN_MARK)[0]
    prototypes = [line[:-2] + ";" for line in source.splitlines() if line.startswith("void kiln_top")]
    return "#pragma once\n" + head + "\n".join(prototypes) + "\n"
