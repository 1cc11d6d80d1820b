"""A tiny context: a dict built from the declared arguments."""

import os


def load_toy(scale):
    return {"scale": scale, "pid": os.getpid()}
