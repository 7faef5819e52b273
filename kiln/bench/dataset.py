"""Accuracy on a labelled image folder: ``DIR/<class name>/<image>``; classes in sorted order are
labels 0..n-1, each image preprocessed as torchvision's evaluation transforms do for the model.

``Preprocess`` is torchvision's ``Resize(resize) -> CenterCrop(crop) -> ToTensor -> Normalize``:

- the shorter side is resized to ``resize`` and the longer to ``int(resize * long / short)``
  (torchvision's ``_compute_resized_output_size``), with PIL's filter (bilinear, or bicubic where
  the model's weights were evaluated so);
- the centre ``crop`` x ``crop`` is cut at ``int(round((side - crop) / 2))`` (an image smaller than
  the crop is padded with zeros, as CenterCrop does);
- pixels / 255, minus the ImageNet mean, over its standard deviation.

Per zoo model (``PREPROCESS``, from the weights' documented transforms in torchvision): ResNet-50,
VGG-19, MobileNetV2 and ViT-B: resize 256, crop 224, bilinear; EfficientNet-B0: 256, 224, bicubic;
ConvNeXt-T: 236, 224, bilinear. Other models: resize = crop * 256 / 224, bilinear.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln import integrity
from kiln.errors import KilnError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".webp"}


@dataclass(frozen=True)
class Preprocess:
    resize: int  # the shorter side's length after resizing
    crop: int  # the centre square's side
    filter: str = "bilinear"  # or "bicubic"


PREPROCESS = {
    "resnet50": Preprocess(256, 224),
    "vgg19": Preprocess(256, 224),
    "mobilenet_v2": Preprocess(256, 224),
    "vit-base-dynamo": Preprocess(256, 224),
    "efficientnet-b0-dynamo": Preprocess(256, 224, "bicubic"),
    "convnext-tiny-dynamo": Preprocess(236, 224),
}


def preprocess_for(model: str | None, size: int) -> Preprocess:
    """The evaluation transform of zoo model ``model`` at input ``size`` (the default for others)."""
    known = PREPROCESS.get(model or "")
    if known is not None and known.crop == size:
        return known
    return Preprocess(round(size * 256 / 224), size)


MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def load_image_folder(
    root: str | Path, size: int | Preprocess, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images as NCHW float32 and their labels; raises KilnError for an unusable folder."""
    transform = size if isinstance(size, Preprocess) else preprocess_for(None, size)

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
            images.append(image_array(path, transform))
            labels.append(label)
            if limit and len(images) >= limit:
                break
    if not images:
        raise KilnError(f"dataset {root}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return np.stack(images).astype(np.float32), np.array(labels), classes


def load_images(root: str | Path, size: int | Preprocess, limit: int | None = None) -> np.ndarray:
    """Every image under ``root`` (directly, or one level of sub-folders), sorted by path, as
    NCHW float32, preprocessed for input ``size`` (calibration data)."""
    transform = size if isinstance(size, Preprocess) else preprocess_for(None, size)

    root = Path(root)
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise KilnError(f"image folder {root}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    images = []
    for path in paths[:limit] if limit else paths:
        images.append(image_array(path, transform))
    return np.stack(images).astype(np.float32)


def image_array(path: Path, transform: Preprocess) -> np.ndarray:
    """One image file (a regular file only: a FIFO named like an image would block the read) as a
    normalized CHW float32 array; an unreadable or oversized one is a KilnError naming it."""
    from PIL import Image

    try:
        with integrity.open_regular(path, "image") as handle, Image.open(handle) as image:
            pixels = np.asarray(resize_and_crop(image.convert("RGB"), transform), dtype=np.float32) / 255.0
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise KilnError(f"{path}: not an image kiln can read ({err})") from None
    return ((pixels - MEAN) / STD).transpose(2, 0, 1)


def resize_and_crop(image: Any, transform: Preprocess) -> Any:
    """torchvision's Resize(shorter side) then CenterCrop on a PIL image (module docstring)."""
    from PIL import Image

    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = transform.resize, int(transform.resize * long / short)
    size = (new_short, new_long) if width <= height else (new_long, new_short)
    method = Image.Resampling.BICUBIC if transform.filter == "bicubic" else Image.Resampling.BILINEAR
    crop = transform.crop
    if size[0] * size[1] > 4 * transform.resize**2 and min(size) >= crop:
        # a long, thin image (1x60000 resized would be 256x15 million pixels): only the centre crop's
        # window is resampled, from the source box it comes from, so the work is the output's size
        left, top = round((size[0] - crop) / 2.0), round((size[1] - crop) / 2.0)
        sx, sy = size[0] / width, size[1] / height
        box = (left / sx, top / sy, (left + crop) / sx, (top + crop) / sy)
        return image.resize((crop, crop), method, box=box)
    image = image.resize(size, method)
    if image.size[0] < crop or image.size[1] < crop:  # CenterCrop pads a smaller image with zeros
        padded = Image.new("RGB", (max(crop, image.size[0]), max(crop, image.size[1])))
        padded.paste(image, ((padded.size[0] - image.size[0]) // 2, (padded.size[1] - image.size[1]) // 2))
        image = padded
    top = round((image.size[1] - crop) / 2.0)
    left = round((image.size[0] - crop) / 2.0)
    return image.crop((left, top, left + crop, top + crop))


DIGITS = "digits"  # --dataset digits: scikit-learn's real 8x8 digits, the zoo's held-out split


def accuracy(run: Any, root: str, model: Any, limit: int | None = None) -> dict[str, Any]:
    """Top-1 accuracy of ``run`` over the folder (or ``digits``), fed ``model.batch`` images at a time."""
    example = model.inputs()
    name, array = next(iter(example.items()))
    if root == DIGITS:
        from kiln.zoo import digits

        if getattr(model, "name", None) not in digits.SHAPES:
            raise KilnError(f"--dataset {DIGITS} is the digits models' data (digits-mlp, digits-cnn)")
        images, labels = digits.test_split(model.name)
        images, labels, classes = images[:limit], labels[:limit], [str(d) for d in range(10)]
    else:
        transform = preprocess_for(getattr(model, "name", None), array.shape[-1])
        images, labels, classes = load_image_folder(root, transform, limit)
    correct = 0
    batch = model.batch
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch]
        real = len(chunk)
        if real < batch:  # the last images: padded with copies of the first to the compiled batch, not counted
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - real, axis=0)])
        logits = np.asarray(run({name: chunk})[0]).reshape(batch, -1)[:real]
        correct += int(np.sum(np.argmax(logits, axis=1) == labels[start : start + real]))
    evaluated = len(images)  # every image, whatever the batch: a batch sweep scores the same set
    return {"top1": correct / evaluated if evaluated else None, "images": evaluated, "classes": len(classes)}
