"""Image folders are preprocessed as torchvision's evaluation transforms: the shorter side resized,
the centre cropped, ImageNet-normalized; per zoo model its weights' documented sizes."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from kiln.bench.backends.base import module_exists
from kiln.bench.dataset import (
    MEAN,
    STD,
    Preprocess,
    image_array,
    load_image_folder,
    preprocess_for,
    resize_and_crop,
)


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("width,height", [(300, 200), (200, 300), (224, 224), (500, 257)])
def test_the_shorter_side_is_resized_and_the_centre_cut(width, height):
    transform = Preprocess(256, 224)
    out = resize_and_crop(picture(width, height), transform)
    assert out.size == (224, 224)
    # the same steps by hand: aspect ratio kept (int of the long side), centre at round(half)
    short, long = min(width, height), max(width, height)
    resized = (256, int(256 * long / short)) if width <= height else (int(256 * long / short), 256)
    full = picture(width, height).resize(resized, Image.Resampling.BILINEAR)
    left, top = round((resized[0] - 224) / 2), round((resized[1] - 224) / 2)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(full)[top : top + 224, left : left + 224])


def test_an_image_smaller_than_the_crop_is_padded_with_zeros():
    out = np.asarray(resize_and_crop(picture(40, 30), Preprocess(20, 32)))
    assert out.shape == (32, 32, 3) and (out[0] == 0).all() and (out[-1] == 0).all()


def test_each_zoo_model_gets_its_weights_transform():
    assert preprocess_for("resnet50", 224) == Preprocess(256, 224)
    assert preprocess_for("convnext-tiny-dynamo", 224) == Preprocess(236, 224)
    assert preprocess_for("efficientnet-b0-dynamo", 224).filter == "bicubic"
    assert preprocess_for("my-model", 160) == Preprocess(183, 160)  # crop * 256 / 224


def test_a_labelled_folder_is_normalized_nchw(tmp_path):
    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        picture(320, 240, seed=len(label)).save(tmp_path / label / "a.png")
    images, labels, classes = load_image_folder(tmp_path, preprocess_for("resnet50", 224))
    assert images.shape == (2, 3, 224, 224) and list(labels) == [0, 1] and classes == ["cat", "dog"]
    raw = np.asarray(resize_and_crop(Image.open(tmp_path / "cat" / "a.png").convert("RGB"), Preprocess(256, 224)))
    np.testing.assert_allclose(images[0], ((raw / 255.0 - MEAN) / STD).transpose(2, 0, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(
    not module_exists("torchvision"),
    reason="torchvision is not installed (its PyPI wheels do not import beside the CPU torch here)",
)
def test_it_matches_torchvision_on_the_same_files(tmp_path):
    from torchvision import transforms

    path = tmp_path / "x.png"
    picture(333, 250).save(path)
    reference = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(MEAN.tolist(), STD.tolist()),
        ]
    )
    want = reference(Image.open(path).convert("RGB")).numpy()
    np.testing.assert_allclose(image_array(path, Preprocess(256, 224)), want, atol=1e-5)
