"""A context whose load is slow and whose value depends on its arguments."""

import os
import time


def load_toy(base, factor):
    time.sleep(float(os.environ.get("TOY_LOAD_SECONDS", "1.0")))
    return {"value": base * factor, "pid": os.getpid(), "loaded_at": time.time()}
