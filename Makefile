# kiln: one command to set up and run the main job, one to set up and run the tests.
#   make bench   # virtualenv + every dependency, then the main job (reports/ holds the results)
#   make test    # virtualenv + every dependency, then the whole test suite
PYTHON ?= python3.11
VENV ?= .venv
BIN = $(VENV)/bin
STAMP = $(VENV)/.kiln-installed

.PHONY: setup test bench peers-heavy peers-int8 peers-genai peers-llama conformance lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade -c constraints.txt pip
	# torch first and pinned: the local CPU wheel; anything later that wants torch finds it installed.
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip uninstall --quiet --yes kiln 2>/dev/null || true  # the distribution's name before it was kiln-compiler
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[zoo,peers,gpu,xla,fpga,fleet,serve,dev]"
	touch $(STAMP)

setup: $(STAMP)

# On every core (at most 4 workers: the zoo and conformance tests hold models in memory; workers
# steal queued tests). Measured with KILN_CACHE_DIR and TRITON_CACHE_DIR empty (every C library,
# Triton kernel and zoo export built again): a 2-core Zen 1 (AVX2) 16.8-19.7 min (2026-11-24,
# 1,604 passed, 202 skipped); a 2-core Zen 4 (AVX-512: those paths run too) 11.1-11.5 min
# (2026-11-25, 1,772 passed, 46 skipped), from a fresh clone 13.9-16.2 min with the venv's setup
# (2026-11-27: 2,054 passed, 47 skipped; later 2,079 passed, 47 skipped); a 2-core Zen 3 (AVX2) with warm caches 15.9-17.9 min
# (2026-11-27, 1,887 passed, 208 skipped). `pytest -n 0` runs it in one process.
test: setup
	$(BIN)/python -m pytest -q -n auto --maxprocesses=4 --dist worksteal

# The main job: kiln and its peers on the four seed models; reports land in reports/bench/latest/.
bench: setup
	$(BIN)/kiln bench --out reports/bench

# The heavier peers (TVM, IREE) are an extra: `make peers-heavy` then `make bench`.
peers-heavy: setup
	$(BIN)/python -m pip install --quiet -e ".[peers-heavy]"

# OpenVINO's int8 (NNCF) for the openvino-int8 bench row: `make peers-int8`.
peers-int8: setup
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[peers-int8]"

# ONNX Runtime GenAI and OpenVINO GenAI for their rows of `kiln bench -s generate`: `make peers-genai`.
peers-genai: setup
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[peers-genai]"

# llama.cpp's rows of `kiln bench -s generate` (llama-cpp-python compiles llama.cpp: minutes): `make peers-llama`.
peers-llama: setup
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[peers-llama]"

conformance: setup
	mkdir -p reports
	$(BIN)/kiln conformance -o reports/conformance.json

lint: setup
	$(BIN)/ruff check kiln tests

clean:
	rm -rf $(VENV) reports .pytest_cache
