"""Write test topologies to files (the runtime loads topologies from YAML, like users do)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
S = "tests.support.stages"


def write(path: Path, stages: list[dict[str, Any]], name: str = "test",
          processes: dict[str, dict[str, Any]] | None = None, **top: Any) -> Path:
    document: dict[str, Any] = {"name": name, **top, "stages": stages}
    if processes is not None:
        document["processes"] = processes
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def qwen_shaped(tmp_path: Path, log: Path, processes: dict[str, dict[str, Any]] | None = None) -> Path:
    """The shipped 8-stage Qwen3-Omni topology (3 processes, same edges, streams and
    projection) with plain torch functions standing in for the models. ``processes``: the
    `processes` knobs (node labels, replicas)."""
    spec = yaml.safe_load((REPO / "topologies" / "qwen3-omni.yaml").read_text())
    factories = {
        "preprocessing": (f"{S}.preprocessing", {}),
        "image_encoder": (f"{S}.encoder", {"name": "image_encoder"}),
        "audio_encoder": (f"{S}.encoder", {"name": "audio_encoder"}),
        "mm_aggregate": (f"{S}.aggregate", {}),
        "thinker": (f"{S}.thinker", {"steps": 5}),
        "decode": (f"{S}.detokenize", {}),
        "talker_ar": (f"{S}.talker", {}),
        "code2wav": (f"{S}.vocoder", {}),
    }
    for stage in spec["stages"]:
        factory, args = factories[stage["name"]]
        stage["factory"] = factory
        stage["factory_args"] = {**args, "log": str(log)}
        if "merge_fn" in stage:
            stage["merge_fn"] = f"{S}.merge_embeddings"
        if "project" in stage:
            stage["project"] = {"decode": f"{S}.drop_hidden"}
    return write(tmp_path / "qwen-shaped.yaml", spec["stages"], "qwen-shaped", processes)
