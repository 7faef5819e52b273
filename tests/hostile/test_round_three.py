"""The third hostile probe (issue 47): each class it found, tested as a class.

1. A model's names never become code in any generated language (C, HLS C++, its testbench and Tcl,
   Triton/Python): every name is emitted only through ``kiln.source_text``.
2. and 3. kiln never writes through a link it did not make, nor into a FIFO or a device, at any path
   of any command (projects, traces, reports, study folders, databases, artifacts).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import KilnError
from kiln.output_files import OutputFolder, OutputPathError, ensure_folder, write_output_file
from kiln.source_text import c_comment, safe_text
from tests.helpers import make_model, run_fpga_testbench

FLOAT = TensorProto.FLOAT

# a name in each generated language's syntax: comment ends, line continuations (a backslash, the
# trigraph ??/), a newline starting a real line, string and format syntax, Tcl and shell substitutions
HOSTILE_NAMES = [
    'x\nstatic int k = std::system("touch PWNED");\n//',
    "ends in a backslash \\",
    "ends in a trigraph ??/",
    "*/ int evil; /*",
    '"; import os; os.system("touch PWNED") #',
    "\n__import__('os').system('touch PWNED')",
    "[exec touch PWNED]; $env(HOME) }{ \\",
    "%s%n%x $(touch PWNED) `touch PWNED`",
    "\r\n#define float int\n",
    "名前🔥",
]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # a PWNED marker would land here


def named_mlp(names: list[str]):
    """x -> MatMul -> Add -> Relu -> MatMul -> y with every value and node named from ``names``."""
    rng = np.random.default_rng(0)
    a, b, c, d, w1, b1, w2 = (names[i % len(names)] + f"#{i}" for i in range(7))
    nodes = [
        helper.make_node("MatMul", [a, w1], [b], name=names[0]),
        helper.make_node("Add", [b, b1], [c], name=names[1 % len(names)]),
        helper.make_node("Relu", [c], [d], name=names[2 % len(names)]),
        helper.make_node("MatMul", [d, w2], ["y"], name=names[3 % len(names)]),
    ]
    inits = {
        w1: rng.standard_normal((8, 6)).astype(np.float32),
        b1: rng.standard_normal(6).astype(np.float32),
        w2: rng.standard_normal((6, 4)).astype(np.float32),
    }
    model = make_model(nodes, [(a, FLOAT, [1, 8])], [("y", FLOAT, [1, 4])], inits)
    feeds = {a: rng.standard_normal((1, 8)).astype(np.float32)}
    return model, feeds


def raw_names_in(text: str, names: list[str]) -> list[str]:
    """Each hostile name (or its part before a newline, with syntax) found verbatim in ``text``."""
    found = []
    for name in names:
        for piece in [name, *name.splitlines()]:
            if len(piece) > 3 and safe_text(piece, limit=10_000) != piece and piece in text:
                found.append(piece)
    return found


def sources_of(compiled) -> list[str]:
    return [plan.source for plan in compiled.plans if getattr(plan, "source", "")]


@pytest.mark.parametrize("target", ["cpu", "gpu:interpret"])
def test_names_in_every_language_syntax_never_reach_the_cpu_or_gpu_source(target, tmp_path):
    if target.startswith("gpu"):
        pytest.importorskip("triton", reason="the gpu target renders Triton kernels (pip install triton)")
    model, feeds = named_mlp(HOSTILE_NAMES)
    compiled = kiln.compile(model, target=target)
    want = kiln.compile(model, target="reference").run(feeds)
    got = compiled.run(feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)
    sources = sources_of(compiled)
    assert sources, "the compiled model kept no generated source to check"
    for source in sources:
        assert raw_names_in(source, HOSTILE_NAMES) == []
    assert not (tmp_path / "PWNED").exists()


def fpga_ready() -> str | None:
    from kiln.backends.fpga import ap_types

    if shutil.which("g++") is None or not ap_types():
        return "the fpga target's C simulation needs g++ and the ap_types headers (pip install hls4ml)"
    return None


@pytest.mark.skipif(fpga_ready() is not None, reason=str(fpga_ready()))
def test_names_never_become_hls_code_in_the_design_the_testbench_or_the_tcl(tmp_path):
    from kiln.driver.fixed_point import write_fpga_project

    model, feeds = named_mlp(HOSTILE_NAMES)
    # the C simulation compiles and runs the design: a name that became code would run here
    compiled = kiln.compile(model, target="fpga:vitis,clock=2e2", calibration=[feeds])
    assert not (tmp_path / "PWNED").exists()
    got = compiled.run(feeds)
    want = kiln.compile(model, target="reference").run(feeds)
    np.testing.assert_allclose(got["y"], want["y"], atol=0.05)
    assert compiled.target == "fpga:vitis"  # the spec is kiln's own text, rebuilt from parsed values
    written = write_fpga_project(compiled, tmp_path / "prj", feeds)
    for path in written:  # every source (estimates.json holds names as JSON strings: data, escaped by json)
        if path.suffix in (".cpp", ".h", ".tcl", ".txt"):
            assert raw_names_in(path.read_text(), HOSTILE_NAMES) == [], path
    text = (tmp_path / "prj/firmware/kiln_model.cpp").read_text()
    for line in text.splitlines():
        if "//" in line:  # a comment ends its line: no continuation into the next
            assert not line.rstrip().endswith(("\\", "??/")), line
    # the project's own testbench, built without kiln
    run = run_fpga_testbench(tmp_path / "prj", tmp_path / "testbench")
    assert run.returncode == 0 and "PASSED" in run.stdout
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "prj/PWNED").exists()


def test_a_target_string_with_syntax_never_reaches_a_source():
    from kiln.backends.fpga.target import parse_variant

    target = parse_variant("vitis,clock=\n200\n,reuse= 2,bits=16")
    assert target.spec == "fpga:vitis,reuse=2" and "\n" not in target.spec


@pytest.mark.parametrize("text", [*HOSTILE_NAMES, "a" * 500, "*/", "??/", "\\"])
def test_the_escaping_functions_keep_only_their_safe_alphabet(text):
    for escaped in (c_comment(text), safe_text(text)):
        assert "\n" not in escaped and "\r" not in escaped and "\\" not in escaped
        assert "*/" not in escaped and "/*" not in escaped and "??" not in escaped and "?" not in escaped
        assert not set(escaped) & set("\"'`$;[]{}#%()<>")
        assert len(escaped) < 120


def test_renderers_take_model_text_only_through_source_text():
    """grep, as a test: a generated line that carries names (facts.names, kernel.sources, a target's
    spec) is written only through kiln.source_text's functions."""
    root = Path(kiln.__file__).parent / "backends"
    offenders = []
    for path in root.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.lstrip().startswith(("#", '"""')) and ('f"' in line or "f'" in line):
                for risky in ("facts.names", ".sources)", ".sources,", "target.spec", "{spec}"):
                    if risky in line and not any(f in line for f in ("c_comment(", "c_string(", "tcl_comment(")):
                        offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert offenders == []


# -- 2 and 3: links and files that are not files at every output path --------------------------------


def test_an_output_folder_never_follows_a_link_at_any_level(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out/firmware").symlink_to(elsewhere)
    with OutputFolder(tmp_path / "out") as out:
        with pytest.raises(OutputPathError, match="firmware.*symbolic link"):
            out.folder("firmware")
        (tmp_path / "out/x.txt").symlink_to(elsewhere / "target.txt")
        with pytest.raises(OutputPathError, match="symbolic link"):
            out.write("x.txt", "data")
        os.mkfifo(tmp_path / "out/fifo")
        with pytest.raises(OutputPathError, match="FIFO"):
            out.write("fifo", "data")
        assert out.write("fine.txt", "data").read_text() == "data"
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "linked").symlink_to(elsewhere)
    with pytest.raises(OutputPathError, match="symbolic link"):
        OutputFolder(tmp_path / "linked")
    with pytest.raises(OutputPathError, match="symbolic link"):
        ensure_folder(tmp_path / "linked")
    with pytest.raises(OutputPathError, match="symbolic link"):
        write_output_file(tmp_path / "out/x.txt", "data")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(fpga_ready() is not None, reason=str(fpga_ready()))
@pytest.mark.parametrize("planted", ["firmware", "tb", "build_prj.tcl", "tb/kiln_tb.cpp", "firmware/kiln_model.h"])
def test_the_fpga_project_refuses_a_link_planted_anywhere_in_it(tmp_path, planted):
    from kiln.driver.fixed_point import write_fpga_project

    model, feeds = named_mlp(["a", "b", "c", "d"])
    compiled = kiln.compile(model, target="fpga:vitis", calibration=[feeds])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    project = tmp_path / "prj"
    (project / Path(planted).parent).mkdir(parents=True, exist_ok=True)
    (project / planted).symlink_to(elsewhere if "." not in planted else elsewhere / "victim")
    with pytest.raises(OutputPathError, match="symbolic link"):
        write_fpga_project(compiled, project, feeds)
    assert list(elsewhere.iterdir()) == []


def kiln_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=os.environ
    )


@pytest.fixture
def small_model(tmp_path) -> Path:
    model, _ = named_mlp(["a", "b", "c", "d"])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_explain_trace_never_writes_through_a_link_nor_waits_on_a_fifo(tmp_path, small_model, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    trace = tmp_path / "trace.json"
    if kind == "link":
        trace.symlink_to(victim)
    else:
        os.mkfifo(trace)
    result = kiln_cli("explain", str(small_model), "--profile", "--runs", "1", "--trace", str(trace), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "trace.json" in result.stderr and ("symbolic link" in result.stderr or "FIFO" in result.stderr)
    assert victim.read_text() == "keep"


@pytest.mark.parametrize("command", ["compile", "run", "conformance"])
def test_every_o_file_refuses_a_link_or_fifo_before_any_work(tmp_path, small_model, command):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for kind in ("link", "fifo"):
        output = tmp_path / f"out-{kind}"
        if kind == "link":
            output.symlink_to(victim)
        else:
            os.mkfifo(output)
        args = {"compile": ["compile", str(small_model)], "run": ["run", str(small_model)]}.get(
            command, ["conformance", "--filter", "test_relu$"]
        )
        result = kiln_cli(*args, "-o", str(output), cwd=tmp_path)
        assert result.returncode == 2, (kind, result.stderr)
        assert str(output) in result.stderr
    assert victim.read_text() == "keep"


def test_the_results_database_is_never_a_link_and_a_locked_one_is_named(tmp_path):
    from kiln.bench import store

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "linked.db").symlink_to(victim)
    run = {"run_id": "r", "created": "now", "machine": {}, "config": {}, "records": []}
    with pytest.raises(OutputPathError, match="symbolic link"):
        store.start_run(tmp_path / "linked.db", run)
    (tmp_path / "j.db-journal").symlink_to(victim)
    with pytest.raises(OutputPathError, match="journal|symbolic link"):
        store.start_run(tmp_path / "j.db", run)
    assert victim.read_text() == "keep"
    db = tmp_path / "results.db"
    store.start_run(db, run)
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(store.DatabaseLocked, match="locked by another process"):
            connection = store.open_db(db, wait=0.2)
            connection.close()
            with store._database(db) as again:
                again.execute("INSERT INTO runs VALUES ('x', '', '', '')")
    finally:
        holder.rollback()
        holder.close()
    assert isinstance(store.DatabaseLocked("x"), KilnError)


# -- 4: forged run-time-shape data in an artifact --------------------------------------------------


@pytest.fixture(scope="module")
def run_time_dims_artifact(tmp_path_factory):
    """A saved model whose kernels take the image's size at run time (with a dims program), and its members."""
    import json
    import zipfile

    from tests.runtime.test_run_time_dims import RANGES, strided_cnn

    folder = tmp_path_factory.mktemp("dims")
    os.environ.setdefault("KILN_CACHE_DIR", str(folder / "cache"))
    compiled = kiln.compile(strided_cnn(), dims=RANGES)
    compiled.save(folder / "m.kiln")
    with zipfile.ZipFile(folder / "m.kiln") as archive:
        members = {n: archive.read(n) for n in archive.namelist() if n != "manifest.json"}
    meta = json.loads(members["meta.json"])
    assert meta["run_time_dims"].get("program"), "the fixture's model must carry a dims program"
    return members, meta


def forge(meta: dict, how: str) -> dict:
    import copy

    meta = copy.deepcopy(meta)
    found = meta["run_time_dims"]
    program = found["program"]
    if how == "larger capacity":
        program["capacity"] = [c * 4 if c > 1 else c for c in program["capacity"]]
        program["equal"] = []
    elif how == "huge integers":
        program["steps"] = [[i, (1 << 31) - 1, (1 << 31) - 1, f] for i, _, _, f in program["steps"]]
        program["capacity"] = [(1 << 31) - 1 if c > 1 else c for c in program["capacity"]]
        program["equal"] = []
    elif how == "duplicate samples":
        found["samples"] = [found["samples"][0], *([found["samples"][1]] * (len(found["samples"]) - 1))]
    elif how == "other samples":
        found["samples"] = [found["samples"][0], *[[v - 1 for v in row] for row in found["samples"][1:]]]
    elif how == "dims that disagree with the graph":
        program["steps"] = [[i, c0 + 4, c, f] for i, c0, c, f in program["steps"]]
        program["equal"] = []  # (the groups would give the forgery away at run time)
    elif how == "dims beyond the arena":
        program["capacity"] = [c * 4 if c > 1 else c for c in program["capacity"]]
        program["steps"] = [[i, c0 + 8, c, f] for i, c0, c, f in program["steps"]]
        program["equal"] = []
    elif how == "no program steps":
        program["steps"] = []
    return meta


@pytest.mark.parametrize(
    "how",
    [
        "larger capacity",
        "huge integers",
        "duplicate samples",
        "other samples",
        "dims that disagree with the graph",
        "dims beyond the arena",
        "no program steps",
    ],
)
def test_forged_run_time_shape_data_is_refused_before_any_kernel_runs(run_time_dims_artifact, tmp_path, how):
    import json

    from kiln.driver.artifact import ArtifactError
    from tests.helpers import write_signed_artifact
    from tests.runtime.test_run_time_dims import image

    members, meta = run_time_dims_artifact
    path = tmp_path / "forged.kiln"
    write_signed_artifact({**members, "meta.json": json.dumps(forge(meta, how)).encode()}, path)
    try:
        model = kiln.load(path, rebuild=True)
    except ArtifactError as err:
        assert "run-time dims" in str(err)
        return
    # loaded: the forgery changed nothing the graph does not say (never a wrong shape or a write past the arena)
    from tests.runtime.test_run_time_dims import strided_cnn

    reference = kiln.compile(strided_cnn(), target="reference")
    for size in [(1, 40, 40), (1, 7, 33), (1, 6, 6), (1, 23, 11), (2, 7, 33), (9, 6, 6)]:
        feeds = image(*size)
        want, got = reference.run(feeds), model.run(feeds)
        for key in want:
            assert got[key].shape == want[key].shape
            np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-4)


def test_an_unforged_run_time_dims_artifact_loads_with_rebuild(run_time_dims_artifact, tmp_path):
    import json

    from tests.helpers import write_signed_artifact
    from tests.runtime.test_run_time_dims import image, strided_cnn

    members, meta = run_time_dims_artifact
    path = tmp_path / "same.kiln"
    write_signed_artifact({**members, "meta.json": json.dumps(meta).encode()}, path)
    model = kiln.load(path, rebuild=True)
    assert model.dims_model is not None and model.dims_model.spatial.program is not None
    reference = kiln.compile(strided_cnn(), target="reference")
    feeds = image(2, 17, 29)
    np.testing.assert_allclose(model.run(feeds)["y"], reference.run(feeds)["y"], rtol=1e-4, atol=1e-4)


# -- 5: two models that share a file name ----------------------------------------------------------


def test_two_models_with_one_file_name_get_their_own_rows_and_references(tmp_path):
    from kiln.bench.models import resolve_model
    from kiln.bench.runner import BenchConfig, run_bench

    paths = []
    for folder, names in (("a", ["a", "b", "c", "d"]), ("b", ["e", "f", "g", "h"])):
        model, _ = named_mlp(names)
        model.graph.initializer[0].raw_data = bytes(reversed(model.graph.initializer[0].raw_data))  # other weights
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "m.onnx")
        paths[-1].write_bytes(model.SerializeToString())
    first, second = (resolve_model(str(p), 1, None) for p in paths)
    assert first.label != second.label and first.label.startswith("m-") and first.digest != second.digest
    config = BenchConfig(models=[str(p) for p in paths], backends=["kiln"], duration=0.05, min_iterations=2, warmup=1)
    run = run_bench(config, tmp_path / "work")
    rows = {r["model"]: r for r in run["records"]}
    assert set(rows) == {first.label, second.label}
    for row in rows.values():  # each against its own model's reference
        assert row["status"] == "ok", row.get("error")
        assert row["agreement"]["rel_l2"] < 1e-4, row["agreement"]


def test_a_study_knows_a_model_file_by_its_contents(tmp_path):
    from kiln.bench.study import StudyConfig, study_id

    path = tmp_path / "m.onnx"
    model, _ = named_mlp(["a", "b", "c", "d"])
    path.write_bytes(model.SerializeToString())
    config = StudyConfig(models=[str(path)], backends=["kiln"])
    before = study_id(config, {})
    model.graph.initializer[0].raw_data = bytes(reversed(model.graph.initializer[0].raw_data))
    path.write_bytes(model.SerializeToString())
    os.utime(path, ns=(1, 1))  # (another size or time: the digest is taken again)
    assert study_id(config, {}) != before


# -- 6 and 7: a user's mistakes get named errors, never a bare exception or a hang ------------------


@pytest.mark.parametrize("kind", ["integer keys", "sparse", "meta", "complex"])
def test_weights_a_model_cannot_take_are_named(tmp_path, kind):
    torch = pytest.importorskip("torch", reason="--weights files are PyTorch state_dicts")
    from kiln.zoo.weights import WeightsError, load_into

    module = torch.nn.Linear(4, 3)
    state = dict(module.state_dict())
    if kind == "integer keys":
        state = {0: state["weight"], 1: state["bias"]}
    elif kind == "sparse":
        state["weight"] = state["weight"].to_sparse()
    elif kind == "meta":
        state["weight"] = torch.empty(3, 4, device="meta")
    else:
        state["weight"] = torch.complex(state["weight"], torch.ones(3, 4))
    path = tmp_path / "w.pt"
    torch.save(state, path)
    with pytest.raises(WeightsError):
        load_into(module, path)


def test_a_long_thin_image_is_resized_by_its_output_not_its_length(tmp_path):
    from PIL import Image

    from kiln.bench.dataset import Preprocess, image_array

    path = tmp_path / "thin.png"
    Image.new("RGB", (60000, 1), (200, 100, 50)).save(path)
    pixels = image_array(path, Preprocess(256, 224))  # resized whole, this asked for 11.8 GB
    assert pixels.shape == (3, 224, 224) and np.isfinite(pixels).all()
    # an ordinary image takes the ordinary path: the same as resizing then cropping
    Image.new("RGB", (300, 200), (10, 20, 30)).save(tmp_path / "plain.png")
    assert image_array(tmp_path / "plain.png", Preprocess(256, 224)).shape == (3, 224, 224)


def test_a_range_of_zero_batch_compiles_and_runs():
    from tests.runtime.test_run_time_dims import strided_cnn

    compiled = kiln.compile(strided_cnn(), dims={"batch": (0, 0), "h": (6, 40), "w": (6, 40)})
    out = compiled.run({"x": np.zeros((0, 3, 9, 9), np.float32)})
    assert out["y"].shape == (0, 5)


def test_ranges_whose_capacity_no_machine_here_holds_are_refused_when_declared():
    from kiln.errors import ArgumentError
    from tests.runtime.test_run_time_dims import strided_cnn

    with pytest.raises(ArgumentError, match="bytes"):
        kiln.compile(strided_cnn(), dims={"batch": (1, 1), "h": (8, 100000), "w": (8, 100000)})


def test_a_memory_limit_past_what_rlimit_holds_is_a_usage_error(tmp_path):
    result = kiln_cli(
        "bench", "-m", "resnet50", "--memory-limit", "10000000000000", "--out", str(tmp_path), cwd=tmp_path
    )
    assert result.returncode == 2 and "memory-limit" in result.stderr


def test_torch_cond_runs_eagerly_with_a_warning():
    torch = pytest.importorskip("torch", reason="the torch.compile backend")

    class Branchy(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))

    module = Branchy()
    compiled = torch.compile(module, backend="kiln")
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="runs eagerly"):
        for x in (torch.ones(3), -torch.ones(3)):
            assert torch.equal(compiled(x), module(x))


def test_a_local_fleet_cluster_listens_on_loopback_only(monkeypatch, tmp_path):
    ray = pytest.importorskip("ray", reason="the fleet runs on Ray (the 'fleet' extra)")
    from kiln.bench import fleet

    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no token file

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    fleet.connect("local")
    assert seen["_node_ip_address"] == "127.0.0.1" and seen["include_dashboard"] is False

    def refuse(**kwargs):
        raise ConnectionError("Authentication token is missing or incorrect")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(fleet.FleetError, match="RAY_AUTH_TOKEN"):
        fleet.connect("127.0.0.1:6399")
    assert "RAY_AUTH_MODE" not in os.environ  # no token: the mode is left as it was
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 32)
    with pytest.raises(fleet.FleetError, match="the token this process gave was refused"):
        fleet.connect("127.0.0.1:6399")
    assert os.environ["RAY_AUTH_MODE"] == "token"  # a token the user has is sent (Ray sends none otherwise)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_fleet_joins_a_cluster_made_by_ray_start_with_its_token(tmp_path):
    """As users make one: `ray get-auth-token --generate`, then `ray start --head` with
    RAY_AUTH_MODE=token. `kiln bench nodes` from a shell with the token file (RAY_AUTH_MODE unset)
    joins; one with no token is told how to give it, a named error, not Ray's bare "Failed to
    connect"."""
    pytest.importorskip("ray", reason="the fleet runs on Ray (the 'fleet' extra)")
    import json
    import signal
    import socket
    import tempfile
    import time

    bin_dir = Path(sys.executable).parent
    home, stranger = tmp_path / "home", tmp_path / "stranger"
    home.mkdir()
    stranger.mkdir()
    user = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"HOME": str(home)}
    made = subprocess.run(
        [str(bin_dir / "ray"), "get-auth-token", "--generate"], env=user, capture_output=True, timeout=60
    )
    assert made.returncode == 0 and (home / ".ray" / "auth_token").is_file(), made.stderr[-2000:]
    port = _free_port()
    sessions = tempfile.mkdtemp(prefix="kiln-ray-", dir="/tmp")  # short: Ray's socket paths are under it
    head = subprocess.Popen(  # its own session: the whole cluster is stopped with it, never `ray stop`
        [str(bin_dir / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
         "--node-ip-address=127.0.0.1", "--include-dashboard=false", f"--temp-dir={sessions}"],
        env=user | {"RAY_AUTH_MODE": "token"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        kiln_cli = [str(bin_dir / "kiln"), "bench", "nodes", "--cluster", f"127.0.0.1:{port}", "--json"]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and head.poll() is None:  # the head takes seconds to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        joined = subprocess.run(kiln_cli, env=user, capture_output=True, text=True, timeout=120)
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert len(json.loads(joined.stdout)) == 1
        refused = subprocess.run(
            kiln_cli, env=user | {"HOME": str(stranger)}, capture_output=True, text=True, timeout=180
        )
        assert refused.returncode == 1 and "RAY_AUTH_TOKEN" in refused.stderr, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the head and every process it started (its session)
        head.wait()
        shutil.rmtree(sessions, ignore_errors=True)


def test_torch_compile_dynamic_on_growing_sizes_never_sees_an_internal_refusal(monkeypatch):
    """torch.compile(dynamic=True) called at growing sizes: where kiln's kernels cannot take the
    sizes at run time (here forced: no kernel's sizes terms of the dims, no lowering a polynomial of
    a length) each size compiles instead; the caller never sees kiln's internal NotAffine, nothing
    falls back to eager, and every call equals eager PyTorch."""
    pytest.importorskip("torch", reason="torch (the 'zoo' extra) runs torch.compile")
    from kiln.driver import extents, spatial
    from tests.frontend.test_torch_dynamic import dynamic_planes, run

    refused, merged, calls = [], spatial._merged, []

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        refused.append(args)
        raise extents.NotAffine("forced")

    def refuse_after_the_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        return merged(*args, **kwargs) if len(calls) == 1 else refuse(*args)

    module, compiled = dynamic_planes()
    monkeypatch.setattr(spatial, "_merged", refuse_after_the_first)  # one batch class lowers apart, the next not
    run(compiled, module, [(2, 8), (2, 9), (3, 12), (1, 5)])
    assert len(refused) > 1  # the refusal happened, and stayed inside kiln
    monkeypatch.setattr(extents, "_fit", refuse)
    monkeypatch.setattr(spatial, "_merged", refuse)  # every declaration refuses
    module, compiled = dynamic_planes()
    run(compiled, module, [(2, 8), (2, 9), (3, 12), (2, 70), (1, 5)])  # 70: past the first range
