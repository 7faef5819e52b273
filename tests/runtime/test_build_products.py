"""A target's build may make any number of files: the plan cache and artifacts keep them all."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
import kiln.driver.variants as variants
from kiln.backends import register, unregister
from kiln.backends.cpu import CpuBackend
from kiln.driver import plan_cache
from kiln.driver.artifact import build_products
from tests.helpers import make_model

FLOAT = TensorProto.FLOAT


class TwoFileCpu(CpuBackend):
    """The cpu target with a second build product: a notes file written beside the library."""

    name = "twofile"

    def describe(self, variant: str):  # type: ignore[no-untyped-def]
        import dataclasses

        return dataclasses.replace(super().describe(variant), backend=self.name, spec=self.name)

    def variants(self) -> list[str]:
        return [self.name]

    def build(self, source, target, options):  # type: ignore[no-untyped-def]
        (library,) = super().build(source, target, options)
        notes = Path(library).with_suffix(".notes")
        notes.write_text("kernels: " + str(source.count("kiln_segment_")))
        return (library, notes)

    def load(self, plan, target, parallelism):  # type: ignore[no-untyped-def]
        assert len(plan.products) == 2 and plan.products[1].read_text().startswith("kernels: ")
        return super().load(plan, target, parallelism)


@pytest.fixture
def twofile(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(variants, "WORTH_CACHING_S", 0.0)
    register(TwoFileCpu())
    yield "twofile"
    plan_cache.wait()
    unregister("twofile")


def relu_model():
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, ["n", 4])], [("y", FLOAT, None)])


def test_every_build_product_survives_the_plan_cache_and_an_artifact(twofile, tmp_path):
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    compiled = kiln.compile(relu_model(), target=twofile, dims={"n": 3})
    np.testing.assert_array_equal(compiled(x), np.maximum(x, 0))
    plan_cache.wait()
    again = kiln.compile(relu_model(), target=twofile, dims={"n": 3})  # from the plan cache
    (plan,) = again.plans
    assert [p.suffix for p in plan.products] == [".so", ".notes"] and all(p.is_file() for p in plan.products)
    saved = again.save(tmp_path / "m.kiln")
    with zipfile.ZipFile(saved) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("build/"))
        products = build_products({n: archive.read(n) for n in names})
    assert len(names) == 2 and [file for file, _ in next(iter(products.values()))] == ["0.so", "1.notes"]
    loaded = kiln.load(saved)  # its load asserts both files came back
    np.testing.assert_array_equal(loaded(x), np.maximum(x, 0))


def test_member_names_that_do_not_fit_are_not_build_products():
    found = build_products(
        {
            "build/abc/0.so": b"a",
            "build/abc/1.notes": b"b",
            "build/../0.so": b"c",
            "build/abc/x.so": b"d",
            "build/abc/0.s/o": b"e",
            "lib/def.so": b"f",
            "graph.txt": b"g",
        }
    )
    assert found == {"abc": [("0.so", b"a"), ("1.notes", b"b")], "def": [("0.so", b"f")]}
