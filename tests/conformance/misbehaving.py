"""A case runner for the isolation tests: dies or hangs on cases named for it."""

import os
import time

from kiln.conformance.runner import run_case as real_run_case


def run_case(case, target):
    if case.name == "test_abs":
        os._exit(3)  # the worker process dies mid-case
    if case.name == "test_acos":
        time.sleep(600)  # the worker hangs
    return real_run_case(case, target)
