"""A decoder's decode step with its KV cache as inputs and outputs (issue 52's starting point): how kiln
compiles it today, and whether it takes the past length at run time.

A tiny random-weight GPT-2 (Hugging Face ``GPT2LMHeadModel``, 2 layers, 64 wide) wrapped so one call is
one generation step: token ids [1, 1], the attention mask [1, total], each layer's past keys and values
[1, heads, past, head_dim] -> logits and the present keys and values [1, heads, total, head_dim], total
= past + 1. Exported by ``torch.onnx.export`` (TorchScript) with ``past`` and ``total`` dynamic, compiled
with the declared ranges, then run at several past lengths against onnxruntime on the same file.

    python benchmarks/decode_step.py [--max-past 128] [--lengths 1,7,33,128]

Prints, per past length: the relative L2 against onnxruntime and the route that served it, then the
plans compiled after ``kiln.compile`` returned (a generation loop needs 0: the past length a run-time
extent) and why kiln refused the run-time length (``run_time_refused``). Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def export(path: Path, layers: int = 2, heads: int = 4, width: int = 64) -> tuple[list[str], int, int]:
    """The decode step as an ONNX file: (output names, layers, head_dim)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_embd=width, n_layer=layers, n_head=heads, n_positions=512)
    model = GPT2LMHeadModel(config).eval()
    depth = width // heads

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids, mask, *past):  # type: ignore[no-untyped-def]
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    past = 5
    example = [torch.randn(1, heads, past, depth) for _ in range(2 * layers)]
    inputs = ["ids", "mask"] + [f"past_{i}" for i in range(2 * layers)]
    outputs = ["logits"] + [f"present_{i}" for i in range(2 * layers)]
    axes = {"mask": {1: "total"}, **{n: {2: "past"} for n in inputs[2:]}, **{n: {2: "total"} for n in outputs[1:]}}
    ids, mask = torch.randint(0, 256, (1, 1)), torch.ones(1, past + 1, dtype=torch.int64)
    torch.onnx.export(
        Step(), (ids, mask, *example), str(path), input_names=inputs, output_names=outputs,
        dynamic_axes=axes, opset_version=17, dynamo=False,
    )  # fmt: skip
    return outputs, layers, depth


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-past", type=int, default=128)
    parser.add_argument("--lengths", default="1,7,33,128")
    args = parser.parse_args()
    import numpy as np
    import onnxruntime

    import kiln
    from kiln.driver.variants import plans_compiled

    with tempfile.TemporaryDirectory(prefix="kiln-decode-") as scratch:
        path = Path(scratch) / "gpt2_step.onnx"
        outputs, layers, depth = export(path)
        model = kiln.compile(str(path), dims={"past": (1, args.max_past), "total": (2, args.max_past + 1)})
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        before = plans_compiled()
        for past in (int(n) for n in args.lengths.split(",")):
            feeds = {"ids": rng.integers(0, 256, (1, 1)), "mask": np.ones((1, past + 1), np.int64)}
            for i in range(2 * layers):
                feeds[f"past_{i}"] = rng.standard_normal((1, 4, past, depth)).astype(np.float32)
            got, want = model.run(feeds), session.run(None, feeds)
            error = max(np.linalg.norm(np.asarray(got[n]) - w) / np.linalg.norm(w) for n, w in zip(outputs, want))
            route = getattr(getattr(model, "route", None), "name", "?")
            print(f"past {past:>4}: relative L2 {error:.1e}, route {route}")
        print(f"plans compiled after kiln.compile: {plans_compiled() - before}")
        print(f"run-time length refused: {getattr(model, 'run_time_refused', {})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
