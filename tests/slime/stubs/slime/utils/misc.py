"""slime.utils.misc.load_function: the loading rule slime applies to every *-path flag."""

import importlib


def load_function(path):
    module_path, _, attr = path.rpartition(".")
    module = importlib.import_module(module_path)
    return getattr(module, attr)
