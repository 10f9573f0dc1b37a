"""Files shipped inside the package, and the one way to find them.

``topology.schema.json`` (the topology language's JSON Schema), ``voice-assistant.yaml``
(the topology ``serve`` and ``bench`` run when given none) and ``samples/`` (spoken
questions). These package files are the source of truth, in a wheel and in a checkout
alike; ``schemas/`` and ``topologies/`` at the repository root hold byte-identical copies
for editors and readers (``tests/test_package_data.py`` keeps them so).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SCHEMA = "topology.schema.json"
DEFAULT_TOPOLOGY = "voice-assistant.yaml"
SAMPLES = "samples"


def data_path(name: str) -> Path:
    """The path of ``name`` (a file or folder directly in ``omnictl/data``).

    omnictl is installed unzipped (it runs its stage processes from its files), so the
    package resource is a real file.
    """
    return Path(str(resources.files(__name__) / name))
