import os

git_root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
DEFAULT_VENV_DIR = os.path.join(git_root, "venvs")
