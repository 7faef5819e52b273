"""User-supplied weights for zoo models (``--weights resnet50=FILE``) and the published top-1
figures the study compares them with.

A weights file is a PyTorch state_dict (``torch.save(model.state_dict(), FILE)``, or a checkpoint
holding one under ``state_dict`` or ``model``), read with ``torch.load(weights_only=True)``: a
file that would need code to load is refused, never run. The zoo's ResNet-50, VGG-19 and
MobileNetV2 name their parameters as torchvision does, so torchvision's checkpoints load as they
are.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from kiln.errors import KilnError

# ImageNet-1k validation top-1 (%) of torchvision's weights, from its model documentation
# (pytorch.org/vision/stable/models.html, "Acc@1"); the architecture's zoo name -> {weights: top-1}
PUBLISHED_TOP1: dict[str, dict[str, float]] = {
    "resnet50": {"IMAGENET1K_V1": 76.130, "IMAGENET1K_V2": 80.858},
    "vgg19": {"IMAGENET1K_V1": 72.376},
    "mobilenet_v2": {"IMAGENET1K_V1": 71.878, "IMAGENET1K_V2": 72.154},
    "vit-base-dynamo": {"IMAGENET1K_V1": 81.072},
    "efficientnet-b0-dynamo": {"IMAGENET1K_V1": 77.692},
    "convnext-tiny-dynamo": {"IMAGENET1K_V1": 82.520},
}


class WeightsError(KilnError):
    """A weights file that cannot be read or does not fit the model (exit 2 on the CLI)."""


def parse_weights(values: list[str], known: Any) -> dict[str, str]:
    """``MODEL=FILE`` pairs (one per model) into {model: absolute path}, each a regular file."""
    found: dict[str, str] = {}
    for value in values:
        model, sep, path = value.partition("=")
        if not sep or not model or not path:
            raise WeightsError(f"--weights {value!r}: give MODEL=FILE (e.g. resnet50=resnet50.pth)")
        if model not in known:
            raise WeightsError(f"--weights {value!r}: {model!r} is not a zoo model")
        found[model] = str(regular_file(path))
    return found


def regular_file(path: str | Path) -> Path:
    resolved = Path(path).resolve()
    try:
        mode = os.stat(resolved).st_mode
    except OSError as err:
        raise WeightsError(f"weights file {path}: {err.strerror}") from None
    if not stat.S_ISREG(mode):
        raise WeightsError(f"weights file {path}: not a regular file")
    return resolved


def digest(path: str | Path) -> str:
    """The file's SHA-256 (its identity in the export cache and in the study): hashed once per
    process while the file keeps its size and modification time (every model lookup asks)."""
    resolved = regular_file(path)
    info = os.stat(resolved)
    return _sha256(str(resolved), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, modified: int) -> str:
    from kiln.integrity import open_regular

    sha = hashlib.sha256()
    with open_regular(path, "weights file") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def load_into(module: Any, path: str | Path) -> None:
    """Load the state_dict in ``path`` into ``module``: every parameter and buffer, same shapes."""
    import pickle

    import torch

    from kiln.integrity import IrregularFile, open_regular

    regular_file(path)  # a missing file or a FIFO named before anything opens it
    try:
        with open_regular(path, "weights file") as handle:  # checked on the descriptor it reads
            loaded = torch.load(handle, map_location="cpu", weights_only=True)
    except IrregularFile as err:
        raise WeightsError(str(err)) from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsError(f"weights file {path}: not a state_dict PyTorch loads safely ({first})") from None
    state = _state_dict(loaded)
    if state is None:
        raise WeightsError(f"weights file {path}: holds no state_dict (a dict of tensors)")
    odd = [repr(k) for k in state if not isinstance(k, str)]
    if odd:
        raise WeightsError(f"weights file {path}: a state_dict's keys are parameter names, not {', '.join(odd[:3])}")
    expected = module.state_dict()
    state = {k.removeprefix("module."): v for k, v in state.items()}  # saved from DataParallel
    unusual = []
    for key, tensor in state.items():  # dense tensors with data, of a kind the model's own takes without loss
        want = expected.get(key)
        if tensor.layout != torch.strided:
            unusual.append(f"{key} is a {str(tensor.layout).removeprefix('torch.')} tensor")
        elif tensor.is_meta:
            unusual.append(f"{key} is a meta tensor (no data)")
        elif want is not None and (tensor.is_complex() and not want.is_complex()):
            unusual.append(f"{key} is {str(tensor.dtype).removeprefix('torch.')} (its imaginary part would be lost)")
        elif want is not None and tensor.is_floating_point() != want.is_floating_point() and tensor.dtype != torch.bool:
            unusual.append(
                f"{key} is {str(tensor.dtype).removeprefix('torch.')}, the model's {str(want.dtype).removeprefix('torch.')}"
            )
    if unusual:
        raise WeightsError(f"weights file {path}: {'; '.join(unusual[:3])}{' ...' if len(unusual) > 3 else ''}")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k} {tuple(state[k].shape)} (the model's: {tuple(v.shape)})"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing ({', '.join(missing[:4])}{'...' if len(missing) > 4 else ''})")
        if unexpected:
            parts.append(
                f"{len(unexpected)} unexpected ({', '.join(unexpected[:4])}{'...' if len(unexpected) > 4 else ''})"
            )
        if shapes:
            parts.append(f"{len(shapes)} of another shape ({'; '.join(shapes[:3])})")
        raise WeightsError(f"weights file {path} does not fit the model: {', '.join(parts)}")
    try:
        module.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError) as err:  # what the checks above did not foresee, named
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsError(f"weights file {path} does not load into the model ({first[:200]})") from None


def _state_dict(loaded: Any) -> dict[str, Any] | None:
    import torch

    for candidate in (loaded, *(loaded.get(k) for k in ("state_dict", "model") if isinstance(loaded, dict))):
        if isinstance(candidate, dict) and candidate and all(isinstance(v, torch.Tensor) for v in candidate.values()):
            return candidate
    return None
