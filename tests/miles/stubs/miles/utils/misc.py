"""miles.utils.misc.load_function: miles' loading rule for every *-path flag."""

import importlib


def load_function(path):
    module_path, _, attr = path.rpartition(".")
    module = importlib.import_module(module_path)
    return getattr(module, attr)
