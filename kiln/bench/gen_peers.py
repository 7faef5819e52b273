"""The generation peers, each through its own loop on the same random weights as kiln
(``kiln.zoo.decoders``): ONNX Runtime GenAI (its model builder's int4), OpenVINO GenAI
(``LLMPipeline`` over the decode step's ONNX made stateful, its weights compressed by NNCF at int8
or int4 as ``optimum-cli export openvino --weight-format`` does) and llama.cpp (``llama-cpp-python``
over the GGUF that the converter shipped in its source distribution writes, Q8_0 or Q4_0). Each
made once into the zoo cache; each row's bound is over the bytes of the weights file it loads.

A peer's row is ``{"prompts": {length: {ttft_s, tpot_s, tokens, tpot_p50_p90_s}}, "weight_bytes":
..., "settings": ...}``: TTFT from the call to the first token (the prompt's forward and the first
token), per token the mean gap after it, greedy, batch 1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.bench.bandwidth import TokenClock, stamper
from kiln.errors import KilnError


def _folder(name: str, what: str, *recipe: Any) -> Path:
    """The zoo-cache folder a peer's files of ``name`` live in, keyed by the decoder's config and
    what made them."""
    from kiln import zoo
    from kiln.zoo import decoders

    decoder = decoders.get(name)
    key = hashlib.sha256(json.dumps([decoder.config, decoders.RECIPE, *recipe], sort_keys=True, default=str).encode())
    return zoo.cache_dir() / "decoders" / f"{name}-{what}-{key.hexdigest()[:12]}"


def hf_folder(name: str) -> Path:
    """``name``'s random weights as a Hugging Face folder with a word-level tokenizer of its
    vocabulary (converters want one; the benchmark feeds token ids)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from kiln.zoo import decoders as zoo

    folder = _folder(name, "hf", 2)
    if not (folder / "tokenizer.json").exists():
        zoo.build(name).model.save_pretrained(folder)
        vocab = {f"t{i}": i for i in range(zoo.get(name).vocab)}
        # (BPE with no merges and byte fallback: one token a word, the kind of tokenizer llama.cpp's
        # converter reads as a Llama vocabulary without a pre-tokenizer of its list)
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="t0", byte_fallback=True))
        tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", pad_token="t0").save_pretrained(folder)
    return folder


def token_timings(first: float, stamps: list[float], tokens: list[int], clock: Any = None) -> dict[str, Any]:
    """A prompt's fields from its tokens' stamps, with ``clock``'s bandwidth readings since its last lap."""
    import numpy as np

    gaps = np.diff(stamps) if len(stamps) > 1 else np.zeros(1)
    return {"ttft_s": first, "tpot_s": (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1), "tokens": tokens,
            "tpot_p50_p90_s": [float(np.percentile(gaps, 50)), float(np.percentile(gaps, 90))],
            **(clock.lap() if clock is not None else {})}  # fmt: skip


def genai_folder(name: str, threads: int, precision: str = "int4") -> Path:
    """``name`` as ONNX Runtime GenAI's model builder writes it at ``precision`` (int4, fp32) for
    the CPU, its sessions on ``threads`` threads."""
    folder = _folder(name, f"genai-{precision}")
    if not (folder / "genai_config.json").exists():
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_folder(name)), "-o", str(folder), "-p", precision, "-e", "cpu"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not (folder / "genai_config.json").exists():
            raise RuntimeError(f"onnxruntime-genai's builder failed: {done.stderr[-400:]}")
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2))
    return folder


def ort_genai(name: str, prompts: dict[int, Any], new_tokens: int, threads: int, clock: Any = None) -> dict[str, Any]:  # fmt: skip
    """ONNX Runtime GenAI's own loop, greedy, on its builder's int4; a batch of prompts (``ids``
    of several rows) as its generator's batch (its search option ``batch_size``), the first row's
    tokens kept."""
    import numpy as np
    import onnxruntime_genai as og

    folder = genai_folder(name, threads)
    model = og.Model(str(folder))

    def timed(ids: Any, count: int) -> dict[str, Any]:
        params = og.GeneratorParams(model)
        total = ids.shape[1] + count
        params.set_search_options(max_length=total, min_length=total, do_sample=False, batch_size=ids.shape[0])
        generator = og.Generator(model, params)
        stamp = stamper(clock)
        started = time.perf_counter()
        generator.append_tokens(np.ascontiguousarray(ids, dtype=np.int32))
        stamps, tokens = [], []
        while not generator.is_done():
            generator.generate_next_token()
            stamps.append(stamp())
            tokens.append(int(generator.get_next_tokens()[0]))
        return token_timings(stamps[0] - started, stamps, tokens, clock)

    rows = {}
    for length, ids in prompts.items():
        timed(ids, 2)  # warm
        rows[length] = timed(ids, new_tokens)
    data = sum(p.stat().st_size for p in folder.glob("*.onnx*"))
    return {"prompts": rows, "weight_bytes": data, "cache_element_bytes": _past_element_bytes(folder / "model.onnx"),
            "settings": "builder -p int4 -e cpu (MatMulNBits, blocks of 32)"}  # fmt: skip


def _past_element_bytes(path: Path) -> int:
    """Bytes an element of the KV cache the model at ``path`` reads (its first past input's type)."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(path), load_external_data=False).graph
    past = next(i for i in graph.input if "past" in i.name)
    return int(helper.tensor_dtype_to_np_dtype(past.type.tensor_type.elem_type).itemsize)


# OpenVINO: NNCF's weight compression as optimum-intel's --weight-format applies it
OPENVINO_MODES = {"int8": ("INT8_ASYM", None), "int4": ("INT4_ASYM", 128), "fp32": ("", None)}


def openvino_folder(name: str, precision: str) -> Path:
    """The decode step's ONNX as the stateful model OpenVINO GenAI's ``LLMPipeline`` runs
    (``input_ids``, ``attention_mask``, ``beam_idx``; the past/present pairs as its state), its
    weights compressed by NNCF (``precision``: int8, asymmetric per output channel; int4,
    asymmetric in groups of 128, the embedding and head at int8: NNCF's defaults)."""
    import nncf
    import openvino as ov
    from openvino import opset13
    from openvino._offline_transformations import apply_make_stateful_transformation

    from kiln.zoo import decoders

    folder = _folder(name, f"openvino-{precision}", ov.__version__, nncf.__version__)
    if (folder / "openvino_model.xml").exists():
        return folder
    inputs, outputs = decoders.names(name)
    model = ov.Core().read_model(str(decoders.export(name)))
    model.input(inputs[0]).get_tensor().set_names({"input_ids"})
    model.input(inputs[1]).get_tensor().set_names({"attention_mask"})
    beam = opset13.parameter([-1], ov.Type.i32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    for past in inputs[2:]:  # (the pipeline reorders the cache by beam: batch 1, greedy, one beam)
        node = model.input(past).get_node()
        users = list(node.output(0).get_target_inputs())
        gathered = opset13.gather(node, beam, opset13.constant(0))
        for user in users:
            user.replace_source_output(gathered.output(0))
    model.add_parameters([beam])
    apply_make_stateful_transformation(model, dict(zip(inputs[2:], outputs[1:])))
    mode, group = OPENVINO_MODES[precision]
    options: dict[str, Any] = {}  # (fp32: left as it is, for the conversion's tests)
    if group:  # (a small model's channels below the group: NNCF's adjusted groups, at least 32)
        from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

        adjust = AdvancedCompressionParameters(group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)
        options = {"group_size": group, "ratio": 1.0, "advanced_parameters": adjust}
    if mode:
        model = nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, mode), **options)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "pad_token_id": 0}))
    ov.save_model(model, str(folder / "openvino_model.xml"))
    return folder


def openvino_genai(name: str, prompts: dict[int, Any], new_tokens: int, threads: int, precision: str, hint: str = "", clock: Any = None) -> dict[str, Any]:  # fmt: skip
    """OpenVINO GenAI's ``LLMPipeline`` on the CPU, greedy, at its default inference precision
    (the row says which; ``hint``: another, f32 in the conversion's tests), token ids in (no
    tokenizer), each token stamped by a streamer."""
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    from kiln.zoo import decoders

    folder = openvino_folder(name, precision)
    hint = hint or ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()  # (its default here)
    pipe = genai.LLMPipeline(str(folder), "CPU", INFERENCE_NUM_THREADS=threads, INFERENCE_PRECISION_HINT=hint)
    vocab = decoders.get(name).vocab
    stamp = stamper(clock)

    class Stamps(genai.StreamerBase):
        def __init__(self) -> None:
            super().__init__()
            self.stamps: list[float] = []
            self.tokens: list[int] = []

        def write(self, token: Any) -> Any:
            self.stamps.append(stamp())
            self.tokens += [int(t) for t in (token if isinstance(token, list) else [token])]
            return genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    def timed(ids: Any, count: int) -> dict[str, Any]:
        config = pipe.get_generation_config()
        config.max_new_tokens, config.do_sample, config.ignore_eos = count, False, True
        # (a stop token it must have: ignore_eos lets it pass; no min_new_tokens, which would
        # mask it out of the logits and change a greedy pick)
        config.eos_token_id, config.stop_token_ids = vocab - 1, {vocab - 1}
        feed = genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        streamer = Stamps()
        started = time.perf_counter()
        pipe.generate(feed, config, streamer)
        return token_timings(streamer.stamps[0] - started, streamer.stamps, streamer.tokens[:count], clock)

    rows = {}
    for length, ids in prompts.items():
        timed(ids, 2)  # warm
        rows[length] = timed(ids, new_tokens)
    mode, group = OPENVINO_MODES[precision]
    cache = ov.Core().get_property("CPU", "KV_CACHE_PRECISION")  # (its plugin's default: what the pipeline runs)
    return {"prompts": rows, "weight_bytes": (folder / "openvino_model.bin").stat().st_size, "cache_element_bytes": cache.size,
            "settings": f"NNCF {mode}{f' group {group}' if group else ''}, inference precision {hint}"}  # fmt: skip


def converter() -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py`` from the llama-cpp-python source distribution of the
    installed version (its wheel leaves the converter out), unpacked once into the zoo cache."""
    import tarfile
    from importlib import metadata

    from kiln import zoo

    version = metadata.version("llama_cpp_python")
    folder = zoo.cache_dir() / "llama-cpp-converter" / version
    script = folder / "convert_hf_to_gguf.py"
    if script.exists() and (folder / "conversion").is_dir():
        return script
    download = folder.with_name(version + "-sdist")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(download), f"llama-cpp-python=={version}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    archives = sorted(download.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not archives:
        raise KilnError(
            f"llama-cpp-python {version}'s source (its converter) could not be fetched: {done.stderr[-300:]}"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archives[0]) as archive:
        for member in archive.getmembers():  # (the converter, its conversion package and gguf-py)
            parts = Path(member.name).parts
            inside = parts[parts.index("llama.cpp") + 1 :] if "llama.cpp" in parts else ()
            wanted = inside == ("convert_hf_to_gguf.py",) or (inside and inside[0] in ("conversion", "gguf-py"))
            if member.isfile() and wanted and ".." not in inside:
                (folder / Path(*inside)).parent.mkdir(parents=True, exist_ok=True)
                (folder / Path(*inside)).write_bytes(archive.extractfile(member).read())  # type: ignore[union-attr]
    if not script.exists():
        raise KilnError(f"llama-cpp-python {version}'s source has no convert_hf_to_gguf.py")
    return script


def gguf_file(name: str, quant: str) -> Path:
    """``name`` as GGUF at ``quant`` (q8_0; q4_0 through llama.cpp's quantizer from the converter's
    f32 file), written by llama.cpp's own converter from the Hugging Face folder."""
    import llama_cpp

    folder = _folder(name, "gguf", llama_cpp.__version__)
    path = folder / f"model-{quant}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    script = converter()
    kind = quant if quant in ("q8_0", "f32") else "f32"
    written = folder / f"model-{kind}.gguf"
    if not written.exists():
        env = {"PYTHONPATH": str(script.parent / "gguf-py")}
        command = [sys.executable, str(script), str(hf_folder(name)), "--outtype", kind, "--outfile", str(written)]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})
        if done.returncode != 0 or not written.exists():
            raise RuntimeError(f"llama.cpp's converter failed: {done.stderr[-400:]}")
    if kind != quant:
        code = llama_cpp.llama_model_quantize(
            str(written).encode(), str(path).encode(), _quantize_params(llama_cpp, quant)
        )
        if code != 0 or not path.exists():
            raise RuntimeError(f"llama.cpp's quantizer failed ({code}) writing {quant}")
    return path


def _quantize_params(llama_cpp: Any, quant: str) -> Any:
    import ctypes

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant.upper()}")
    params.nthread = 2
    return ctypes.byref(params)


def llama_cpp_rows(name: str, prompts: dict[int, Any], new_tokens: int, threads: int, quant: str, cache: int = 1, clock: Any = None) -> dict[str, Any]:  # fmt: skip
    """llama.cpp through llama-cpp-python's ``Llama``: the prompt evaluated, then one token a
    ``eval`` after greedy ``sample`` (top-k 1), ``threads`` threads for both; its cache at
    ``cache``, a ggml type (1: f16, its default; 0: f32, in the conversion's tests)."""
    import llama_cpp

    path = gguf_file(name, quant)
    context = max(prompts) + new_tokens + 8
    llm = llama_cpp.Llama(str(path), n_ctx=context, n_batch=max(prompts), n_threads=threads,
                          n_threads_batch=threads, verbose=False, type_k=cache, type_v=cache)  # fmt: skip

    def timed(ids: Any, count: int) -> dict[str, Any]:
        llm.reset()
        stamps, tokens = [], []
        stamp = stamper(clock)
        started = time.perf_counter()
        llm.eval(ids[0].tolist())
        for _ in range(count):
            token = int(llm.sample(top_k=1, temp=0.0))
            stamps.append(stamp())
            tokens.append(token)
            llm.eval([token])
        return token_timings(stamps[0] - started, stamps, tokens, clock)

    rows = {}
    for length, ids in prompts.items():
        timed(ids, 2)  # warm
        rows[length] = timed(ids, new_tokens)
    return {"prompts": rows, "weight_bytes": path.stat().st_size, "cache_element_bytes": 2 if cache == 1 else 4,  # (ggml f16, f32)
            "settings": f"GGUF {quant.upper()}, llama-cpp-python {llama_cpp.__version__}"}  # fmt: skip


# engine -> (the package it needs, how to run it)
PEERS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "onnxruntime-genai": ("onnxruntime_genai", ort_genai),
    "openvino-genai-int8": ("openvino_genai", lambda *a, **k: openvino_genai(*a, precision="int8", **k)),
    "openvino-genai-int4": ("openvino_genai", lambda *a, **k: openvino_genai(*a, precision="int4", **k)),
    "llama.cpp-q8_0": ("llama_cpp", lambda *a, **k: llama_cpp_rows(*a, quant="q8_0", **k)),
    "llama.cpp-q4_0": ("llama_cpp", lambda *a, **k: llama_cpp_rows(*a, quant="q4_0", **k)),
}


BATCHED = {"onnxruntime-genai"}  # the peers whose loop here takes a batch of prompts


def run_peer(engine: str, name: str, prompts: dict[int, Any], new_tokens: int, threads: int) -> dict[str, Any]:
    """The peer's row fields, or ``{"error": ...}`` where its package is absent (or, for a batch of
    prompts, its loop here runs one at a time)."""
    package, runner = PEERS[engine]
    if engine not in BATCHED and any(ids.shape[0] > 1 for ids in prompts.values()):
        return {"error": "batch 1 only in this benchmark (its loop's own batching is not wired)"}
    if importlib.util.find_spec(package) is None:
        return {"error": "not installed"}
    if engine.startswith("openvino") and importlib.util.find_spec("nncf") is None:
        return {"error": "not installed (nncf, its weight compression: make peers-genai)"}
    with TokenClock(threads) as clock:  # (the bound read between its tokens)
        return runner(name, prompts, new_tokens, threads, clock=clock)
