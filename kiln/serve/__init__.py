"""``kiln serve``: compiled models behind the Open Inference Protocol (KServe v2) over HTTP, with
dynamic batching on the models' size classes and Prometheus metrics.

``protocol`` reads and writes the protocol's messages (JSON and the binary tensor data
extension); ``repository`` finds and loads models; ``batcher`` joins requests into batches;
``metrics`` counts and times them; ``app`` is the Starlette application; ``server`` runs it
(uvicorn), in the foreground or on a thread.
"""
