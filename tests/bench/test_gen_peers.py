"""The generation peers' rows (``kiln.bench.gen_peers``): what kiln writes for each peer from the
zoo's random weights — OpenVINO GenAI's stateful model made from the decode step's ONNX, llama.cpp's
GGUF through its own converter — generates ``transformers.generate``'s tokens at fp32, and each
peer's row in ``kiln bench -s generate`` runs or says "not installed" (the peers-genai and
peers-llama extras)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from click.testing import CliRunner

from kiln.bench import gen_peers
from kiln.cli import main

pytest.importorskip("transformers", reason="the zoo's decoders are built from transformers configs")


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def transformers_tokens(name: str, ids: np.ndarray, new: int) -> list[int]:
    import torch

    from kiln.zoo import decoders

    tensor = torch.from_numpy(ids)
    with torch.no_grad():
        out = decoders.build(name).model.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=new,
                                                  min_new_tokens=new, do_sample=False, pad_token_id=0)  # fmt: skip
    return out[0, ids.shape[1] :].tolist()


PROMPTS = {5: np.array([[1, 5, 7, 9, 11]], np.int64), 9: np.arange(30, 39, dtype=np.int64)[None]}


@pytest.mark.skipif(not installed("openvino_genai") or not installed("nncf"), reason="OpenVINO GenAI is not installed (make peers-genai)")  # fmt: skip
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_stateful_openvino_model_generates_transformers_tokens_at_f32(name):
    found = gen_peers.openvino_genai(name, PROMPTS, 8, threads=1, precision="fp32", hint="f32")
    for length, ids in PROMPTS.items():
        assert found["prompts"][length]["tokens"] == transformers_tokens(name, ids, 8), (name, length)
    assert "f32" in found["settings"]


@pytest.mark.skipif(not installed("llama_cpp"), reason="llama-cpp-python is not installed (make peers-llama)")
def test_the_converters_f32_gguf_generates_transformers_tokens():
    found = gen_peers.llama_cpp_rows("llama", PROMPTS, 8, threads=1, quant="f32", cache=0)
    for length, ids in PROMPTS.items():
        assert found["prompts"][length]["tokens"] == transformers_tokens("llama", ids, 8), length
    assert found["weight_bytes"] == gen_peers.gguf_file("llama", "f32").stat().st_size


@pytest.mark.parametrize("engine", sorted(gen_peers.PEERS))
def test_each_peers_row_runs_its_own_weights_or_says_it_is_absent(tmp_path, engine):
    """A peer's row: its own loop on its own file of the same weights (its bound over that file's
    bytes, fewer than fp32's), or "not installed" (exit 1) where its package is absent."""
    from kiln.bench.generation import weight_bytes

    out = tmp_path / "bench"
    args = ["bench", "-s", "generate", "-m", "llama", "-b", engine, "--prompts", "5", "--new-tokens", "4", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    (folder,) = out.iterdir()
    (row,) = [json.loads(line) for line in (folder / "generate.jsonl").read_text().splitlines()]
    package = gen_peers.PEERS[engine][0]
    if not installed(package) or (engine.startswith("openvino") and not installed("nncf")):
        assert result.exit_code == 1 and row["error"].startswith("not installed"), result.output
        return
    assert result.exit_code == 0 and not row.get("error"), result.output
    found = row["prompts"]["5"]
    assert len(found["tokens"]) == 4 and found["ttft_s"] > 0 and found["tpot_s"] > 0
    assert 0 < row["weight_bytes"] < weight_bytes("llama")["fp32"] / 2, row["weight_bytes"]
    assert row["settings"] and engine in (folder / "report.md").read_text()


def test_a_peer_at_a_batch_says_batch_one_only(tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "-s", "generate", "-m", "llama", "-b", "openvino-genai-int8", "--batch", "2", "--prompts", "5", "--new-tokens", "2", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    (folder,) = out.iterdir()
    (row,) = [json.loads(line) for line in (folder / "generate.jsonl").read_text().splitlines()]
    assert result.exit_code == 1 and "batch 1 only" in row["error"], result.output


@pytest.mark.skipif(not installed("onnxruntime_genai"), reason="ONNX Runtime GenAI is not installed (make peers-genai)")
def test_onnxruntime_genai_takes_a_batch_of_prompts_as_its_generators_batch():
    """A batch of prompts runs as the generator's own batch: its first row's tokens are the ones
    that prompt gives alone (another prompt beside it changes nothing)."""
    alone = gen_peers.ort_genai("llama", {5: PROMPTS[5]}, 6, threads=1)
    batch = np.concatenate([PROMPTS[5], np.array([[2, 4, 6, 8, 10]], np.int64)])
    together = gen_peers.ort_genai("llama", {5: batch}, 6, threads=1)
    assert together["prompts"][5]["tokens"] == alone["prompts"][5]["tokens"]
    assert len(together["prompts"][5]["tokens"]) == 6
