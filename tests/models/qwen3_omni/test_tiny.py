import json
from pathlib import Path

from omnictl.models.qwen3_omni.processor import load_processor
from omnictl.models.qwen3_omni.tiny import main


def test_cli_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    assert main([str(tmp_path / "ckpt")]) == 0
    out = tmp_path / "ckpt"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_omni_moe"
    text = config["thinker_config"]["text_config"]
    assert text["hidden_size"] == 32 and text["num_hidden_layers"] == 2
    # transformers 5.x does not default it, and the talker cannot be built without it.
    assert config["talker_config"]["text_config"]["shared_expert_intermediate_size"] > 0
    assert (out / "model.safetensors").stat().st_size < 5_000_000


def test_processor_tokenizes_the_chat_template_with_single_special_tokens(tiny_qwen: Path) -> None:
    processor = load_processor(tiny_qwen)
    config = json.loads((tiny_qwen / "config.json").read_text())
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], add_generation_prompt=True, tokenize=False
    )
    ids = processor.tokenizer.encode(prompt)
    assert ids[:2] == [config["im_start_token_id"], config["user_token_id"]]
    assert ids[-3:-1] == [config["im_start_token_id"], config["assistant_token_id"]]


def test_mrope_sections_cover_half_the_head_dim(tiny_qwen: Path) -> None:
    config = json.loads((tiny_qwen / "config.json").read_text())
    text = config["thinker_config"]["text_config"]
    assert sum(text["rope_parameters"]["mrope_section"]) == text["head_dim"] // 2
