"""Built-in models: built from code with random weights (fixed seed), exported to ONNX opset 17 once
and cached on disk. ``kiln.zoo.onnx_path("resnet50")`` -> path of the cached model.

The cache lives in ``$KILN_CACHE_DIR/zoo`` (default ``~/.cache/kiln/zoo``); a file's name carries a
hash of everything that determines its content, so a change of recipe never reuses a stale file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.integrity import cache_folder_or_private

ZOO_OPSET = 17
EXPORT_RECIPE = 3  # bump when the export procedure changes


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    build: Callable[[dict[str, Any]], Any]  # options -> torch module (eval mode, weights set)
    example_inputs: Callable[[dict[str, Any], int], dict[str, np.ndarray]]  # (options, seed) -> inputs
    defaults: dict[str, Any] = field(default_factory=dict)
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    output_names: tuple[str, ...] = ("output",)
    # False keeps BatchNormalization in CNN exports, so kiln's own fold_batchnorm does the folding
    exporter_folds_constants: bool = True
    # "torchscript" (torch.onnx.export(dynamo=False), opset 17) or "dynamo" (torch.export based, the
    # default of current PyTorch, opset 18): the same model as two exporters spell it
    exporter: str = "torchscript"
    opset: int = ZOO_OPSET


def _image_inputs(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    size = options.get("image_size", 224)
    return {"input": rng.standard_normal((options.get("batch", 1), 3, size, size)).astype(np.float32)}


def _token_inputs(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch, seq = options.get("batch", 1), options.get("seq", 128)
    ids = rng.integers(0, options.get("vocab", 30522), size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def _build_cnn(factory_name: str) -> Callable[[dict[str, Any]], Any]:
    def build(options: dict[str, Any]) -> Any:
        import torch

        from kiln.zoo import cnn

        torch.manual_seed(options.get("seed", 0))
        model = getattr(cnn, factory_name)()
        cnn.calibrate_batchnorm(model, seed=options.get("seed", 0))
        return model.eval()

    return build


def _build_gcn(options: dict[str, Any]) -> Any:
    import torch

    from kiln.zoo.irregular import GCN, synthetic_graph

    torch.manual_seed(options.get("seed", 0))
    return GCN(synthetic_graph(options["nodes"], 8, options.get("seed", 0)), options["features"]).eval()


def _gcn_inputs(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"features": rng.standard_normal((options["nodes"], options["features"])).astype(np.float32)}


def _build_dlrm(options: dict[str, Any]) -> Any:
    import torch

    from kiln.zoo.irregular import DLRM

    torch.manual_seed(options.get("seed", 0))
    return DLRM(rows=options["rows"]).eval()


def _dlrm_inputs(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch = options.get("batch", 1)
    return {
        "dense": rng.standard_normal((batch, 13)).astype(np.float32),
        "sparse": rng.integers(0, options["rows"], size=(batch, 8), dtype=np.int64),
    }


def _small(builder: str) -> Callable[[dict[str, Any]], Any]:
    def build(options: dict[str, Any]) -> Any:
        from kiln.zoo import small

        return getattr(small, builder)(options)

    return build


def _small_inputs(name: str) -> Callable[[dict[str, Any], int], dict[str, np.ndarray]]:
    def make(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
        from kiln.zoo import small

        return small.inputs_of(name)(options, seed)

    return make


def _transformers(builder: str) -> Callable[[dict[str, Any]], Any]:
    """A builder of ``kiln.zoo.transformers_models`` (imported when a model is built: torch and
    transformers are the zoo extra)."""

    def build(options: dict[str, Any]) -> Any:
        from kiln.zoo import transformers_models

        return getattr(transformers_models, builder)(options)

    return build


MODELS: dict[str, ZooModel] = {
    "resnet50": ZooModel(
        "resnet50",
        "ResNet-50 (torchvision architecture), 224x224, 25.6M parameters, 8.2 GFLOP",
        _build_cnn("resnet50"),
        _image_inputs,
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        exporter_folds_constants=False,
    ),
    "vgg19": ZooModel(
        "vgg19",
        "VGG-19 (torchvision architecture), 224x224, 143.7M parameters, 39.3 GFLOP",
        _build_cnn("vgg19"),
        _image_inputs,
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        exporter_folds_constants=False,
    ),
    "bert-base": ZooModel(
        "bert-base",
        "BERT-base encoder (transformers BertModel, random init), seq 128, 109M parameters",
        _transformers("build_bert"),
        _token_inputs,
        defaults={"seq": 128, "vocab": 30522},
        dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "last_hidden_state": {0: "batch"}},
        output_names=("last_hidden_state",),
    ),
    "gpt2": ZooModel(
        "gpt2",
        "GPT-2 small (transformers GPT2Model, random init), seq 128, 124M parameters",
        _transformers("build_gpt2"),
        _token_inputs,
        defaults={"seq": 128, "vocab": 50257},
        dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "last_hidden_state": {0: "batch"}},
        output_names=("last_hidden_state",),
    ),
    "mobilenet_v2": ZooModel(
        "mobilenet_v2",
        "MobileNetV2 (torchvision architecture), 224x224, 3.5M parameters, 0.6 GFLOP",
        _build_cnn("mobilenet_v2"),
        _image_inputs,
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        exporter_folds_constants=False,
    ),
    "gcn": ZooModel(
        "gcn",
        "2-layer GCN on a synthetic 2048-node graph (dense normalized adjacency), 128 features",
        _build_gcn,
        _gcn_inputs,
        defaults={"nodes": 2048, "features": 128},
        output_names=("log_probs",),
    ),
    "dlrm": ZooModel(
        "dlrm",
        "DLRM-style recommender: bottom MLP, 8 embedding tables x 10k rows, dot interactions, top MLP",
        _build_dlrm,
        _dlrm_inputs,
        defaults={"rows": 10000},
        dynamic_axes={"dense": {0: "batch"}, "sparse": {0: "batch"}, "click": {0: "batch"}},
        output_names=("click",),
    ),
}

_BATCH_DYNAMIC = {"x": {0: "batch"}, "output": {0: "batch"}}
MODELS["jet-mlp"] = ZooModel(
    "jet-mlp",
    "jet-tagging MLP 16-64-32-32-5 + softmax (hls4ml's tutorial size), 5k parameters",
    _small("jet_mlp"),
    _small_inputs("jet-mlp"),
    dynamic_axes=_BATCH_DYNAMIC,
)
MODELS["mnist-cnn"] = ZooModel(
    "mnist-cnn",
    "MNIST-size CNN: 2 x (conv 3x3, ReLU, max-pool), dense 10, softmax; 1x28x28, 9k parameters",
    _small("mnist_cnn"),
    _small_inputs("mnist-cnn"),
    dynamic_axes=_BATCH_DYNAMIC,
)
MODELS["transformer-block"] = ZooModel(
    "transformer-block",
    "one pre-norm encoder block: 2-head attention, GELU MLP; 8 tokens x 32",
    _small("transformer_block"),
    _small_inputs("transformer-block"),
    dynamic_axes=_BATCH_DYNAMIC,
)


def _digits(name: str, what: str) -> ZooModel:
    def build(options: dict[str, Any]) -> Any:
        from kiln.zoo import digits

        return digits.builder(name)(options)

    def inputs(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
        from kiln.zoo import digits

        return digits.inputs(name)(options, seed)

    return ZooModel(name, what, build, inputs, dynamic_axes=_BATCH_DYNAMIC)


MODELS["digits-mlp"] = _digits("digits-mlp", "MLP 64-64-10 trained on scikit-learn's real 8x8 digits (in seconds)")
MODELS["digits-cnn"] = _digits("digits-cnn", "2-conv CNN trained on scikit-learn's real 8x8 digits (in seconds)")

for _name in ("bert-base", "gpt2"):  # the transformers as torch.onnx.export(dynamo=True) writes them today
    _base = MODELS[_name]
    MODELS[f"{_name}-dynamo"] = ZooModel(
        f"{_name}-dynamo",
        _base.description + "; dynamo exporter, opset 18, PyTorch's default (sdpa) attention",
        _base.build,
        _base.example_inputs,
        defaults={**_base.defaults, "attention": "sdpa"},
        dynamic_axes=_base.dynamic_axes,
        output_names=_base.output_names,
        exporter="dynamo",
        opset=18,
    )


_TOKENS_DYNAMIC = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "last_hidden_state": {0: "batch"}}
_PIXELS_DYNAMIC = {"pixel_values": {0: "batch"}, "output": {0: "batch"}}


def _pixel_inputs(options: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    return {"pixel_values": _image_inputs(options, seed)["input"]}


# models kiln's passes were not written against, all as the dynamo exporter (opset 18) writes them
MODELS.update(
    {
        "vit-base-dynamo": ZooModel(
            "vit-base-dynamo",
            "ViT-Base/16 (transformers ViTModel, random init), 224x224, 86M parameters; dynamo exporter, opset 18",
            _transformers("build_vit"),
            _pixel_inputs,
            dynamic_axes=_PIXELS_DYNAMIC,
            exporter="dynamo",
            opset=18,
        ),
        "distilbert-dynamo": ZooModel(
            "distilbert-dynamo",
            "DistilBERT (transformers DistilBertModel, random init), seq 128, 66M parameters; dynamo exporter, opset 18",
            _transformers("build_distilbert"),
            _token_inputs,
            defaults={"seq": 128, "vocab": 30522},
            dynamic_axes=_TOKENS_DYNAMIC,
            output_names=("last_hidden_state",),
            exporter="dynamo",
            opset=18,
        ),
        "llama-dynamo": ZooModel(
            "llama-dynamo",
            "Llama-style decoder (transformers LlamaModel, random init): 6 layers, width 512, GQA 8/2 heads, "
            "SiLU-gated MLP, seq 128; dynamo exporter, opset 18",
            _transformers("build_llama"),
            _token_inputs,
            defaults={"seq": 128, "vocab": 32000},
            dynamic_axes=_TOKENS_DYNAMIC,
            output_names=("last_hidden_state",),
            exporter="dynamo",
            opset=18,
        ),
        "convnext-tiny-dynamo": ZooModel(
            "convnext-tiny-dynamo",
            "ConvNeXt-T (transformers ConvNextModel, random init), 224x224, 28M parameters; dynamo exporter, opset 18",
            _transformers("build_convnext"),
            _pixel_inputs,
            dynamic_axes=_PIXELS_DYNAMIC,
            exporter="dynamo",
            opset=18,
        ),
        "efficientnet-b0-dynamo": ZooModel(
            "efficientnet-b0-dynamo",
            "EfficientNet-B0 (transformers EfficientNetModel, random init), 224x224, 4M parameters; "
            "dynamo exporter, opset 18",
            _transformers("build_efficientnet"),
            _pixel_inputs,
            dynamic_axes=_PIXELS_DYNAMIC,
            exporter="dynamo",
            opset=18,
        ),
    }
)

DEFAULT_MODELS = ("resnet50", "vgg19", "bert-base", "gpt2")
FPGA_MODELS = ("jet-mlp", "mnist-cnn", "transformer-block")  # sizes an FPGA holds on chip
CLASSIFIERS = ("resnet50", "vgg19", "mobilenet_v2", "gcn", "jet-mlp", "mnist-cnn", "digits-mlp", "digits-cnn")


def get(name: str) -> ZooModel:
    try:
        return MODELS[name]
    except KeyError:
        raise KilnError(f"unknown zoo model {name!r}; available: {', '.join(MODELS)}") from None


def cache_dir() -> Path:
    """Where exports are kept: ``$KILN_CACHE_DIR/zoo`` (a private temporary folder where kiln
    cannot trust that, see ``integrity.cache_folder``)."""
    return cache_folder_or_private("zoo")


def options_for(name: str, **overrides: Any) -> dict[str, Any]:
    options = {"seed": 0, "batch": 1, **get(name).defaults}
    options.update({k: v for k, v in overrides.items() if v is not None})
    return options


def example_inputs(name: str, seed: int = 0, **overrides: Any) -> dict[str, np.ndarray]:
    """Deterministic random inputs for ``name`` (batch, seq, image_size may be overridden)."""
    model = get(name)
    return model.example_inputs(options_for(name, **overrides), seed)


def onnx_path(
    name: str,
    *,
    opset: int | None = None,
    progress: Callable[[str], None] | None = None,
    weights: str | None = None,
    **overrides: Any,
) -> Path:
    """Path of the cached ONNX export of ``name``, exporting it first if needed; ``weights``: a
    state_dict file loaded into the module first (kiln.zoo.weights; its digest keys the cache)."""
    model = get(name)
    opset = opset or model.opset
    options = options_for(name, **overrides)
    options.pop("batch", None)  # the batch dim is symbolic in the export
    dynamic_axes = dict(model.dynamic_axes)
    if options.get("dynamic_seq"):  # the sequence length symbolic too (token models: dim 1, "seq")
        if not any(name in dynamic_axes for name in ("input_ids",)):
            raise ValueError(f"{name} has no sequence dim (dynamic_seq is for token models)")
        dynamic_axes = {k: {**v, 1: "seq"} for k, v in dynamic_axes.items()}
    else:
        options.pop("dynamic_seq", None)
    if options.get("dynamic_image"):  # height and width symbolic too (image models: dims 2 and 3)
        if "input" not in dynamic_axes or name not in CLASSIFIERS:
            raise ValueError(f"{name} has no image dims (dynamic_image is for the image classifiers)")
        dynamic_axes = {**dynamic_axes, "input": {**dynamic_axes["input"], 2: "height", 3: "width"}}
    else:
        options.pop("dynamic_image", None)
    recipe = {"name": name, "opset": opset, "options": options, "recipe": EXPORT_RECIPE, "exporter": model.exporter}
    if weights is not None:
        from kiln.zoo.weights import digest

        recipe["weights"] = digest(weights)
    key = json.dumps(recipe, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    path = cache_dir() / f"{name}-opset{opset}-{digest}.onnx"
    if path.exists():
        return path
    if progress:
        progress(f"exporting {name} to ONNX (opset {opset}); cached at {path}")
    module = model.build({k: v for k, v in options.items() if k not in ("dynamic_seq", "dynamic_image")})
    if weights is not None:
        from kiln.zoo.weights import load_into

        load_into(module, weights)
        module.eval()
    export_module(
        module,
        model.example_inputs({**options, "batch": 1}, 0),
        path,
        opset,
        dynamic_axes,
        model.output_names,
        model.exporter_folds_constants,
        model.exporter,
    )
    return path


def export_module(
    module: Any,
    inputs: dict[str, np.ndarray],
    path: Path,
    opset: int,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
    output_names: tuple[str, ...] = ("output",),
    fold_constants: bool = True,
    exporter: str = "torchscript",
) -> None:
    """Export a torch module with the classic (TorchScript) exporter or the dynamo one, atomically."""
    import torch

    tensors = tuple(torch.from_numpy(v) for v in inputs.values())
    partial = path.with_suffix(f".partial-{os.getpid()}")
    if exporter == "dynamo":  # torch.export based (needs onnxscript, in the zoo extra)
        with torch.no_grad():
            program = torch.onnx.export(
                module,
                tensors,
                input_names=list(inputs),
                output_names=list(output_names),
                dynamic_axes=dynamic_axes or None,
                opset_version=opset,
                dynamo=True,
            )
        program.save(str(partial), external_data=False)
        os.replace(partial, path)
        return
    with torch.no_grad():
        torch.onnx.export(
            module,
            tensors,
            str(partial),
            input_names=list(inputs),
            output_names=list(output_names),
            dynamic_axes=dynamic_axes or None,
            opset_version=opset,
            dynamo=False,
            do_constant_folding=fold_constants,
        )
    os.replace(partial, path)


def load_state_dict(name: str, state_dict_path: str | os.PathLike) -> Any:
    """Build zoo model ``name`` and load a torch state_dict (e.g. torchvision's) into it strictly."""
    from kiln.zoo.weights import load_into

    module = get(name).build(options_for(name))
    load_into(module, state_dict_path)
    return module.eval()
