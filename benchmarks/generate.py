"""Text generation, kiln against the engines a user could pick (issue 52's table): the script form of
``kiln bench --scenario generate`` (``kiln.bench.generation``: what it measures and how).

    python benchmarks/generate.py [--models gpt2-124m] [--prompts 128,512] [--new-tokens 128]
        [--engines kiln,kiln-int8-weights,kiln-int4-weights,weights-accuracy,onnxruntime,transformers,llama.cpp,onnxruntime-genai,openvino-genai]
        [--threads 2] [--json out.jsonl]
"""

from __future__ import annotations

import sys

from kiln.bench.generation import main

if __name__ == "__main__":
    sys.exit(main())
