"""``kiln bench --scenario generate``: the decoders' generation table from the bench command (each
(model, engine) in its own process), its rows in JSON lines and a report, peers that are absent
said so, and a user's mistakes named errors (exit 2)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kiln.bench.metrics import reset_peak
from kiln.cli import main

pytest.importorskip("transformers", reason="the zoo's decoders are built from transformers configs")


def test_generate_scenario_measures_kiln_with_one_compile(tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "-s", "generate", "-m", "gpt2", "-b", "kiln", "--prompts", "4,9", "--new-tokens", "4", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    rows = [json.loads(line) for line in (folder / "generate.jsonl").read_text().splitlines()]
    (kiln_row,) = rows
    assert kiln_row["engine"] == "kiln" and not kiln_row.get("error"), kiln_row
    for length in ("4", "9"):
        found = kiln_row["prompts"][length]
        assert len(found["tokens"]) == 4 and found["ttft_s"] > 0 and found["tpot_s"] > 0
        assert found["compiles"] == 0, "one compile serves every prompt length and token"
        assert 0 <= found["loop_s"] < found["tpot_s"], found  # (the loop's own share of a token's time)
    assert kiln_row["bandwidth_gb_s"] > 0 and kiln_row["weight_bytes"] > 0
    report = (folder / "report.md").read_text()
    assert "| gpt2 | kiln | 4 |" in report and "| gpt2 | kiln | 9 |" in report
    if reset_peak():  # (a peak that can be reset: the compile's apart from the run's, as a peer's conversion)
        assert kiln_row["peak_compile_mb"] > 0 and kiln_row["peak_rss_mb"] > 0
        assert f"(compile {kiln_row['peak_compile_mb']:,.0f})" in report


@pytest.mark.parametrize(
    "args, says",
    [
        (["-b", "kiln,nothing"], "not generation engines"),
        (["-m", "resnet50"], "not decoders"),
        (["--prompts", "4,x"], "prompt lengths"),
        (["-s", "offline"], "runs alone"),
        (["--batch", "0"], "batches of at least 1"),
    ],
)
def test_generate_scenario_mistakes_are_named_errors(tmp_path, args, says):
    result = CliRunner().invoke(main, ["bench", "-s", "generate", *args, "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and says in result.output, result.output


def test_the_weight_only_rows_bound_their_own_bytes_and_report_accuracy_by_decode_steps(tmp_path):
    """kiln-int4-weights's bound is over 4-bit codes and their scales; the accuracy row compares
    int8-weights and int4-weights with fp32 on a fixed stream fed one token a step (what decode runs)."""
    from kiln.bench.generation import weight_bytes

    out = tmp_path / "bench"
    args = ["bench", "-s", "generate", "-m", "llama", "-b", "kiln-int4-weights,weights-accuracy", "--prompts", "6", "--new-tokens", "3", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    int4, accuracy = [json.loads(line) for line in (folder / "generate.jsonl").read_text().splitlines()]
    assert int4["precision"] == "int4-weights" and len(int4["prompts"]["6"]["tokens"]) == 3
    assert int4["weight_bytes"] == weight_bytes("llama")["int4"]
    assert accuracy["tokens"] == 6 and accuracy["perplexity_fp32"] > 1
    for precision, most in (("int8-weights", 3e-2), ("int4-weights", 0.3)):
        found = accuracy[precision]
        assert 0 < found["logits_rel_l2"] < most and 0 <= found["same_next_token"] <= 1 and found["perplexity"] > 1
    assert accuracy["int8-weights"]["logits_rel_l2"] < accuracy["int4-weights"]["logits_rel_l2"]  # 8 bits nearer
    # (the -a8 forms take the stream as one prompt; absent where the CPU has no int8 dot product)
    from kiln.backends.cpu import features

    if features.int8_path()[0] >= features.INT8_PATHS["avx-vnni"]:
        for precision, most in (("int8-weights-a8", 3e-2), ("int4-weights-a8", 0.3)):
            assert 0 < accuracy[precision]["logits_rel_l2"] < most, accuracy[precision]
    else:
        assert "int8-weights-a8" not in accuracy
    assert "int4-weights: logits rel. L2" in (folder / "report.md").read_text()


def test_a_batch_of_prompts_is_a_table_of_its_own(tmp_path):
    """--batch 1 --batch 2: each batch's rows; at 2, the tokens/s count both rows of a step and the
    bound is per step (the weights are read once a step, whatever the batch)."""
    out = tmp_path / "bench"
    args = ["bench", "-s", "generate", "-m", "gpt2", "-b", "kiln", "--prompts", "4,9", "--new-tokens", "4", "--batch", "1", "--batch", "2", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    one, two = [json.loads(line) for line in (folder / "generate.jsonl").read_text().splitlines()]
    assert (one["batch"], two["batch"]) == (1, 2) and two["dims"]["batch"] == "1..2"
    # (the batch a size class of its own, compiled with the rest: a step a token, not chunks of 1)
    assert two["routes"]["batch"] == "chunked" and two["size_classes"] == {"batch": [1, 2]}, two
    assert one["size_classes"] == {}, one
    assert (
        len(two["prompts"]["4"]["tokens"]) == 4
        and two["prompts"]["4"]["compiles"] == two["prompts"]["9"]["compiles"] == 0
    )
    assert "| gpt2 | kiln | 4 x2 |" in (folder / "report.md").read_text()
