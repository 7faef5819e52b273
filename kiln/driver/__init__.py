"""The driver: the compile pipeline (``pipeline``), specialization of symbolic dims and the compiled
model (``native``), the plan cache, artifacts, the tuning database and crash reproducers."""
