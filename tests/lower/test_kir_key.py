"""Structure keys (kiln.lower.kir_key): a kernel repeated with other buffers and other generated
names is written once, and any difference in what it computes gives another key."""

from kiln.backends.cpu.c_unit import Templates
from kiln.ir.types import DType
from kiln.lower.kir import Binary, Buffer, Const, For, Index, Kernel, Load, Schedule, Store, add, i64, mul
from kiln.lower.kir_key import StructureKeys

F32 = DType.FLOAT32


def _scale(tag: str, factor: float = 2.0, size: int = 64, op: str = "*") -> Kernel:
    """out[i] = x[i] op factor + x[i], a chain sharing the load (the expression is a DAG)."""
    x, out = Buffer(f"x{tag}", F32, size), Buffer(f"o{tag}", F32, size)
    i = Index(f"i_{tag}")
    loaded = Load(x, i)
    value = Binary("+", Binary(op, loaded, Const(factor, F32)), loaded)
    body = [For(i, size, [Store(out, add(mul(i, i64(1)), i64(0)), value)])]
    return Kernel(f"k{tag}", "pointwise", body, [x], [out], [tag], Schedule(parallel=i.name, vectorize=i.name))


def _key(keys: StructureKeys, kernel: Kernel) -> int | None:
    return keys.key(kernel, [*kernel.reads, *kernel.writes])


def test_a_kernel_repeated_with_other_buffers_and_names_has_one_key():
    keys = StructureKeys()
    first, again = _key(keys, _scale("a")), _key(keys, _scale("b"))
    assert first is not None and first == again


def test_what_a_kernel_computes_changes_its_key():
    keys = StructureKeys()
    base = _key(keys, _scale("a"))
    others = [_key(keys, _scale("b", factor=3.0)), _key(keys, _scale("c", size=65)), _key(keys, _scale("d", op="-"))]
    assert None not in others and base not in others and len(set(others)) == 3
    # -0.0 and 0.0 are different constants (C prints them differently; x * -0.0 is not x * 0.0)
    assert _key(keys, _scale("e", factor=-0.0)) != _key(keys, _scale("f", factor=0.0))


def test_templates_write_a_repeated_kernel_once_and_a_different_one_again():
    templates = Templates()
    names = [templates.function_for(k)[0] for k in (_scale("a"), _scale("b"), _scale("c", factor=5.0))]
    assert names[0] == names[1] != names[2]
    assert len(templates.parts) == 2
    assert "5.0f" in templates.parts[1] and "5.0f" not in templates.parts[0]
