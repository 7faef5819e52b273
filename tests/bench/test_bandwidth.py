"""The generation table's bound: the read-bandwidth probe (one stream and four a thread, the
faster) and ``TokenClock``, which reads it between a decode loop's tokens in a process of its own
and leaves the reads' time out of the loop's stamps."""

from __future__ import annotations

import itertools
import time

import pytest

from kiln.bench import bandwidth
from kiln.bench.generation import row_rates


def test_the_probe_reads_a_positive_bandwidth_and_says_how():
    found, how = bandwidth.read_bandwidth(megabytes=64, rounds=1, threads=2)
    assert found > 0
    assert "1 and 4 streams" in how or "NumPy" in how


def test_token_clock_reads_between_tokens_and_leaves_the_reads_out_of_the_stamps():
    gap = 0.02
    with bandwidth.TokenClock(threads=1, every=3, megabytes=32, pause=0.05) as clock:
        stamps = []
        for _ in range(10):
            time.sleep(gap)
            stamps.append(clock.stamp())
        assert len(clock.readings) == 3 and all(r > 0 for r in clock.readings)  # (after tokens 3, 6, 9)
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        # (each read pauses 50 ms first: a gap holding one would be >= 70 ms were it counted)
        assert max(gaps) < gap + 0.045, gaps
        fields = clock.lap()
        assert fields["bandwidth_readings_gb_s"] and fields["bandwidth_gb_s"] > 0
        assert clock.lap() == {} and clock.readings == []  # (a lap starts the next prompt's readings)
    assert clock.process.poll() is not None  # (the probe's process ended with the clock)


@pytest.mark.parametrize("found_bandwidth, expected", [(50.0, 0.5), (None, 1.0)])
def test_a_prompts_bound_is_its_own_readings_else_the_rows(found_bandwidth, expected):
    row = {"bandwidth_gb_s": 25.0, "weight_bytes": 25e9 / 10}  # (10 steps/s at 25 GB/s)
    found = {"tpot_s": 0.1, **({"bandwidth_gb_s": found_bandwidth} if found_bandwidth else {})}
    rate, share = row_rates(row, found)
    assert rate == pytest.approx(10.0) and share == pytest.approx(expected)


def test_a_steps_bytes_count_the_cache_it_reads():
    row = {"bandwidth_gb_s": 20.0, "weight_bytes": 1.5e9}
    found = {"tpot_s": 0.1, "cache_bytes": 0.5e9}  # (10 steps/s of 2 GB: the bound's 20 GB/s)
    assert row_rates(row, found)[1] == pytest.approx(1.0)


def test_cache_elements_are_layers_by_kv_heads_by_depth():
    pytest.importorskip("transformers", reason="the zoo's decoders are built from transformers configs")
    from kiln.bench.generation import cache_elements

    assert cache_elements("llama-1b") == 16 * 2 * 8 * 64  # (grouped: 8 KV heads of 32)
    assert cache_elements("gpt2-124m") == 12 * 2 * 12 * 64


def test_one_read_far_below_the_others_does_not_move_a_prompts_bound():
    clock = bandwidth.TokenClock.__new__(bandwidth.TokenClock)  # (no probe process: the readings given)
    clock.readings, clock.count = [35.0, 34.0, 17.0, 35.0, 33.0], 0
    found = {"tpot_s": 0.1, **clock.lap()}
    assert found["bandwidth_gb_s"] == 34.0 and found["bandwidth_readings_gb_s"][2] == 17.0
    assert row_rates({"weight_bytes": 3.4e9}, found)[1] == pytest.approx(1.0)
