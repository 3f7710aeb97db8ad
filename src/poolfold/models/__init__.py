"""Models shipped with poolfold."""

from importlib import resources

SEGNET = "segnet.onnx"


def path(name: str = SEGNET):
    """Path of a bundled model file."""
    return resources.files(__name__) / name
