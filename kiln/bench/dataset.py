"""Accuracy on a labelled image folder: ``DIR/<class name>/<image>``; classes in sorted order are
labels 0..n-1, images resized to the model's input and normalized with ImageNet statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kiln import integrity
from kiln.errors import KilnError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".webp"}
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def load_image_folder(
    root: str | Path, size: int, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images as NCHW float32 and their labels; raises KilnError for an unusable folder."""

    root = Path(root)
    if not root.is_dir():
        raise KilnError(f"dataset {root}: not a directory")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise KilnError(f"dataset {root}: expected one sub-folder per class, found none")
    images, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((root / name).iterdir()):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            images.append(_image(path, size))
            labels.append(label)
            if limit and len(images) >= limit:
                break
    if not images:
        raise KilnError(f"dataset {root}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return np.stack(images).astype(np.float32), np.array(labels), classes


def load_images(root: str | Path, size: int, limit: int | None = None) -> np.ndarray:
    """Every image under ``root`` (directly, or one level of sub-folders), sorted by path, as
    NCHW float32 resized to ``size`` and ImageNet-normalized (calibration data)."""

    root = Path(root)
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise KilnError(f"image folder {root}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    images = []
    for path in paths[:limit] if limit else paths:
        images.append(_image(path, size))
    return np.stack(images).astype(np.float32)


def _image(path: Path, size: int) -> np.ndarray:
    """One image file (a regular file only: a FIFO named like an image would block the read) as a
    normalized CHW float32 array; an unreadable or oversized one is a KilnError naming it."""
    from PIL import Image

    try:
        with integrity.open_regular(path, "image") as handle, Image.open(handle) as image:
            pixels = np.asarray(image.convert("RGB").resize((size, size)), dtype=np.float32) / 255.0
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise KilnError(f"{path}: not an image kiln can read ({err})") from None
    return ((pixels - MEAN) / STD).transpose(2, 0, 1)


def accuracy(run: Any, root: str, model: Any, limit: int | None = None) -> dict[str, Any]:
    """Top-1 accuracy of ``run`` over the folder, fed ``model.batch`` images at a time."""
    example = model.inputs()
    name, array = next(iter(example.items()))
    images, labels, classes = load_image_folder(root, array.shape[-1], limit)
    correct = 0
    batch = model.batch
    for start in range(0, len(images) - batch + 1, batch):
        logits = np.asarray(run({name: images[start : start + batch]})[0])
        correct += int(np.sum(np.argmax(logits.reshape(batch, -1), axis=1) == labels[start : start + batch]))
    evaluated = (len(images) // batch) * batch
    return {"top1": correct / evaluated if evaluated else None, "images": evaluated, "classes": len(classes)}
