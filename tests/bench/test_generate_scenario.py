"""``kiln bench --scenario generate``: the decoders' generation table from the bench command (each
(model, engine) in its own process), its rows in JSON lines and a report, peers that are absent
said so, and a user's mistakes named errors (exit 2)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from kiln.cli import main

pytest.importorskip("transformers", reason="the zoo's decoders are built from transformers configs")


def test_generate_scenario_measures_kiln_and_says_which_peers_are_absent(tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "-s", "generate", "-m", "gpt2", "-b", "kiln,llama.cpp", "--prompts", "4,9", "--new-tokens", "4", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    rows = [json.loads(line) for line in (folder / "generate.jsonl").read_text().splitlines()]
    kiln_row, peer = rows
    assert kiln_row["engine"] == "kiln" and not kiln_row.get("error"), kiln_row
    for length in ("4", "9"):
        found = kiln_row["prompts"][length]
        assert len(found["tokens"]) == 4 and found["ttft_s"] > 0 and found["tpot_s"] > 0
        assert found["compiles"] == 0, "one compile serves every prompt length and token"
    assert kiln_row["bandwidth_gb_s"] > 0 and kiln_row["weight_bytes"] > 0
    installed = importlib.util.find_spec("llama_cpp") is not None
    assert peer["engine"] == "llama.cpp" and peer["error"] == ("installed, not wired into this benchmark yet" if installed else "not installed")  # fmt: skip
    report = (folder / "report.md").read_text()
    assert "| gpt2 | kiln | 4 |" in report and "| gpt2 | kiln | 9 |" in report and "llama.cpp" in report


@pytest.mark.parametrize(
    "args, says",
    [
        (["-b", "kiln,nothing"], "not generation engines"),
        (["-m", "resnet50"], "not decoders"),
        (["--prompts", "4,x"], "prompt lengths"),
        (["-s", "offline"], "runs alone"),
    ],
)
def test_generate_scenario_mistakes_are_named_errors(tmp_path, args, says):
    result = CliRunner().invoke(main, ["bench", "-s", "generate", *args, "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and says in result.output, result.output


def test_the_onnxruntime_genai_row_runs_its_builders_int4_or_says_it_is_absent(tmp_path):
    """ONNX Runtime GenAI's row: its model builder's int4 of the same weights, its own greedy loop,
    where the package is installed (make peers-genai); a row saying "not installed" where not."""
    out = tmp_path / "bench"
    args = ["bench", "-s", "generate", "-m", "llama", "-b", "onnxruntime-genai", "--prompts", "5", "--new-tokens", "4", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    (folder,) = out.iterdir()
    (row,) = [json.loads(line) for line in (folder / "generate.jsonl").read_text().splitlines()]
    if importlib.util.find_spec("onnxruntime_genai") is None:
        assert result.exit_code == 1 and row["error"] == "not installed", result.output
        return
    assert result.exit_code == 0 and not row.get("error"), result.output
    found = row["prompts"]["5"]
    assert len(found["tokens"]) == 4 and found["ttft_s"] > 0 and found["tpot_s"] > 0
    from kiln.bench.generation import weight_bytes

    found = weight_bytes("llama")
    assert row["weight_bytes"] == found["int4"] < found["fp32"] / 3  # its bound: int4 bytes
