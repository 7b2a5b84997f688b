"""Loaded by every Python process of tests/clusters/test_login_node.py (PYTHONPATH): at exit, it writes the
process's command line and the heavy packages it imported to LOGIN_PROBE_DIR/<pid>.json."""

import atexit
import json
import os
import sys

HEAVY = ("torch", "transformers", "trl", "accelerate", "deepspeed", "vllm")


def _record() -> None:
    imported = [name for name in HEAVY if name in sys.modules]
    with open(os.path.join(os.environ["LOGIN_PROBE_DIR"], f"{os.getpid()}.json"), "w") as file:
        json.dump({"argv": sys.argv, "imported": imported}, file)


atexit.register(_record)
