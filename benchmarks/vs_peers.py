"""kiln (cpu) vs onnxruntime and OpenVINO (f32 precision hint) on the zoo's CNNs and transformers
(the seed models, MobileNetV2, EfficientNet-B0, ConvNeXt-T, ViT-Base, DistilBERT, a Llama-style
decoder; the transformers also as the dynamo exporter writes them), batch 1.

    python benchmarks/vs_peers.py                                  # twelve models, batch 1 (~15 min)
    python benchmarks/vs_peers.py --models resnet50 --batches 1 --duration 5
    python benchmarks/vs_peers.py --precision bf16                 # kiln-bf16 vs OpenVINO bf16 (and ORT fp32)
    python benchmarks/vs_peers.py --kiln kiln-avx2                 # the AVX2 path forced (an AVX-512 machine)

With ``--precision bf16`` kiln's row is ``kiln-bf16`` (matrix products and convolutions on AMX-BF16
or AVX512_BF16) and the default peers are OpenVINO at its bf16 inference precision and onnxruntime
(fp32: it has no bf16 CPU kernels); ``--precision int8`` compares ``kiln-int8`` with onnxruntime's
``quantize_static`` and OpenVINO's NNCF (``make peers-int8``), all calibrated on the same ten
inputs, and kiln fp32 (the int8 speed-up); every engine's relative L2 (and top-1 agreement for
classifiers) against kiln's fp32 reference interpreter is printed beside the latencies.

Runs through the benchmark harness (``kiln bench``'s runner: each job in its own worker process,
same threads, warm-up, single-stream latency), so the run is stored in the harness's SQLite
database (``reports/bench.db``; compare runs with ``kiln bench compare``) and its JSON/HTML reports
are written under ``reports/vs_peers``. Prints the median latencies and the ratios kiln/peer
(below 1: kiln is faster). Not a test: no pass/fail. Measurements of one run share the machine's
state; on a shared machine read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models",
        default="resnet50,vgg19,mobilenet_v2,efficientnet-b0-dynamo,convnext-tiny-dynamo,"
        "bert-base,gpt2,bert-base-dynamo,gpt2-dynamo,vit-base-dynamo,distilbert-dynamo,llama-dynamo",
    )
    parser.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32", help="kiln's precision")
    parser.add_argument(
        "--kiln",
        default=None,
        help="kiln's row: kiln, kiln-avx2 (the AVX2 path forced, on any x86 machine that has it), "
        "kiln-bf16, kiln-int8 (default: the one of --precision)",
    )
    parser.add_argument(
        "--peers",
        default=None,
        help="default: onnxruntime,openvino (bf16: openvino-bf16,onnxruntime; int8: onnxruntime-int8,openvino-int8,kiln)",
    )
    parser.add_argument("--batches", default="1")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per job (after warm-up)")
    parser.add_argument("--out", type=Path, default=Path("reports/vs_peers"))
    parser.add_argument("--db", type=Path, default=Path("reports/bench.db"))
    parser.add_argument("--no-roofline", action="store_true", help="skip measuring the machine's peaks")
    args = parser.parse_args()
    ours_name = args.kiln or {"fp32": "kiln", "bf16": "kiln-bf16", "int8": "kiln-int8"}[args.precision]
    if args.peers is None:
        args.peers = {
            "fp32": "onnxruntime,openvino",
            "bf16": "openvino-bf16,onnxruntime",
            "int8": "onnxruntime-int8,openvino-int8,kiln",
        }[args.precision]

    from kiln.bench import report, store
    from kiln.bench.runner import BenchConfig, run_bench

    config = BenchConfig(
        models=args.models.split(","),
        backends=[ours_name, *args.peers.split(",")],
        batches=[int(b) for b in args.batches.split(",")],
        threads=args.threads,
        duration=args.duration,
        min_iterations=10,
    )
    args.out.mkdir(parents=True, exist_ok=True)

    def progress(message: str, record: dict | None) -> None:
        print(message, file=sys.stderr, flush=True)

    run = run_bench(config, args.out, progress)
    report.write_all(run, args.out / run["run_id"])
    args.db.parent.mkdir(parents=True, exist_ok=True)
    store.save_run(args.db, run)

    p50: dict[tuple[str, int, str], float] = {}
    accuracy: dict[tuple[str, int, str], str] = {}
    for record in run["records"]:
        if record.get("status") == "ok" and "latency_ms" in record:
            p50[(record["model"], record["batch"], record["backend"])] = record["latency_ms"]["p50"]
            agreement = record.get("agreement") or {}
            if "rel_l2" in agreement:
                text = f"{agreement['rel_l2']:.1e}"
                if "top1_agreement" in agreement:
                    text += f"/{agreement['top1_agreement']:.0%}"
                accuracy[(record["model"], record["batch"], record["backend"])] = text
    peers = args.peers.split(",")
    width = max(10, *(len(m) for m in config.models))
    engines = [ours_name, *peers]
    header = (
        f"{'model':{width}} {'batch':>5} {ours_name + ' ms':>9} "
        + " ".join(f"{p + ' ms':>14}" for p in peers)
        + " "
        + " ".join(f"{'kiln/' + p:>16}" for p in peers)
        + " "
        + " ".join(f"{'relL2 ' + e:>22}" for e in engines)
    )
    from kiln.backends.cpu import host

    machine = run["machine"]
    isa = machine.get("flags") or []
    print(
        f"# {machine.get('vendor', '?')} {machine.get('cpu', '?')} ({machine.get('family_model', '?')}); "
        f"kiln's cpu target: {host().isa}; flags: {', '.join(isa)}"
    )
    versions = machine.get("packages", {})
    print(
        "# engines: " + ", ".join(f"{n} {versions.get(n, '?')}" for n in ("kiln-compiler", "onnxruntime", "openvino"))
    )
    print(f"# {config.threads} threads, median ms of single-stream latency, kiln/peer below 1: kiln faster")
    print("# relL2: relative L2 of the outputs against kiln's fp32 reference interpreter (/top-1 agreement)")
    print(header)
    for model in config.models:
        for batch in config.batches:
            ours = p50.get((model, batch, ours_name))
            cells = [f"{model:{width}} {batch:5d} {ours if ours is not None else float('nan'):9.1f}"]
            cells += [f"{p50.get((model, batch, p), float('nan')):14.1f}" for p in peers]
            cells += [
                f"{(ours / p50[(model, batch, p)]) if ours and (model, batch, p) in p50 else float('nan'):16.2f}"
                for p in peers
            ]
            cells += [f"{accuracy.get((model, batch, e), '-'):>22}" for e in engines]
            print(" ".join(cells))
    failed = [r for r in run["records"] if r.get("status") not in ("ok", None)]
    for record in failed:
        print(
            f"{record.get('model')} {record.get('backend')} batch {record.get('batch')}: {record.get('status')}: {record.get('error', record.get('reason', ''))}"
        )
    if not args.no_roofline:
        roofline(config, p50, engines)
    print(f"stored as run {run['run_id']} in {args.db}; reports in {args.out / run['run_id']}")
    return 0


def roofline(config, p50, engines) -> None:  # type: ignore[no-untyped-def]
    """Each model's nominal work against the machine's measured peaks: the least latency the
    roofline allows and the fraction of it each engine reaches."""
    import onnx

    from kiln.bench.models import resolve_model
    from kiln.bench.roofline import bound_ms, measure_peaks, model_work

    peaks = measure_peaks(config.threads)
    print(f"# roofline: peak {peaks.gflops:.1f} GFLOP/s, {peaks.gbps:.1f} GB/s ({peaks.how})")
    print("# GFLOP: the ONNX file's products and convolutions; MB: weights + inputs + outputs once;")
    print("# bound: the least latency those allow; each engine: achieved GFLOP/s (bound / its latency)")
    width = max(10, *(len(m) for m in config.models))
    print(
        f"{'model':{width}} {'batch':>5} {'GFLOP':>8} {'MB':>8} {'bound ms':>9} "
        + " ".join(f"{e:>20}" for e in engines)
    )
    for name in config.models:
        for batch in config.batches:
            model = resolve_model(name, batch, None)
            work = model_work(onnx.load(str(model.onnx_path)), model.inputs())
            bound = bound_ms(work, peaks)
            cells = []
            for engine in engines:
                ms = p50.get((name, batch, engine))
                cells.append(f"{work.flops / ms / 1e6:8.1f} ({bound / ms:5.0%})" if ms else f"{'-':>20}")
            note = f"  ({work.unknown} products of unknown shape not counted)" if work.unknown else ""
            print(
                f"{name:{width}} {batch:5d} {work.flops / 1e9:8.2f} {work.traffic_bytes / 1e6:8.1f} {bound:9.2f} "
                + " ".join(f"{c:>20}" for c in cells)
                + note
            )


if __name__ == "__main__":
    sys.exit(main())
