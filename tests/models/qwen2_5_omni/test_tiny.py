import json
from pathlib import Path

import torch

from omnictl.models.qwen2_5_omni.processor import load_processor
from omnictl.models.qwen2_5_omni.tiny import SPEAKERS, main


def test_cli_writes_a_loadable_checkpoint_with_speakers(tmp_path: Path) -> None:
    assert main([str(tmp_path / "ckpt")]) == 0
    out = tmp_path / "ckpt"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_omni"
    assert config["thinker_config"]["text_config"]["hidden_size"] == 32
    assert (out / "model.safetensors").stat().st_size < 5_000_000
    speakers = torch.load(out / "spk_dict.pt", weights_only=True)
    assert sorted(speakers) == sorted(SPEAKERS)
    tokenizer = load_processor(out).tokenizer
    for params in speakers.values():  # each speaker's text start token is one of the tokenizer's
        assert tokenizer.convert_ids_to_tokens(params["bos_token"]).startswith("<|spk_")
