"""The matrix-multiply engine's packing buffers (``kiln_scratch`` in gemm.c), sized from the plan
so the runtime can report what a model's memory really is."""

from __future__ import annotations

from collections.abc import Sequence

from kiln.lower.kir import For, GemmSpec, If, Kernel, PackedOperand, Stmt

# gemm.c's constants: largest default row/column block, and the size up to which an operand several
# tasks would repack is packed whole into a shared buffer
_BLOCK, _SHARED_LIMIT = 1024, 16 << 20


def engine_scratch(kernels: Sequence[Kernel], rows: int, cols: int, kc: int) -> tuple[int, int]:
    """Upper bound of the engine's packing buffers (``kiln_scratch`` in gemm.c), as (bytes kept by
    the calling thread, bytes kept by every thread): the calling thread keeps the largest
    whole-operand buffers (A and B), every thread the largest per-block buffers; both are reused
    from call to call, so the bound is a max over the plan's engine calls, not a sum.
    ``rows``/``cols`` are the micro-kernel's tile, ``kc`` the default reduction block."""
    shared_a = shared_b = block_a = block_b = 0

    def walk(stmts: list[Stmt]) -> None:
        nonlocal shared_a, shared_b, block_a, block_b
        for stmt in stmts:
            if isinstance(stmt, (For, If)):
                walk(stmt.body)
            elif isinstance(stmt, GemmSpec) and stmt.precision == "bf16":
                # gemm_bf16.c, per thread: an M block of bf16 rows (at most 512), one float B
                # panel of 32 columns and its bf16 pairs
                padded_k = -(-stmt.k // 32) * 32
                a_rows = 0 if isinstance(stmt.a, PackedOperand) else min(-(-stmt.m // 32) * 32, 512) * padded_k * 2
                panel = 0 if isinstance(stmt.b, PackedOperand) else stmt.k * 32 * 4 + padded_k * 32 * 2
                block_a = max(block_a, a_rows)
                block_b = max(block_b, panel)
            elif isinstance(stmt, GemmSpec):
                m, n, k, batch = stmt.m, stmt.n, stmt.k, stmt.batch
                mc_choice, nc_choice, kc_choice = stmt.blocking
                depth = min(k, kc_choice or kc)
                mc = -(-min(m, max(_BLOCK, mc_choice)) // rows) * rows
                nc = -(-min(n, max(_BLOCK, nc_choice)) // cols) * cols
                if not isinstance(stmt.a, PackedOperand):
                    whole = batch * -(-m // rows) * rows * k * 4
                    shared_a = max(shared_a, whole if whole <= _SHARED_LIMIT else 0)
                    block_a = max(block_a, mc * depth * 4)
                if not isinstance(stmt.b, PackedOperand):
                    whole = batch * -(-n // cols) * cols * k * 4
                    shared_b = max(shared_b, whole if whole <= _SHARED_LIMIT else 0)
                    block_b = max(block_b, nc * depth * 4)

    for kernel in kernels:
        walk(kernel.body)
    return shared_a + shared_b, block_a + block_b
