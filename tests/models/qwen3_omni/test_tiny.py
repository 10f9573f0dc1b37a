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


def test_loading_the_checkpoint_prints_no_rope_parameters_warning(tiny_qwen: Path) -> None:
    """Every stage process loads the config: transformers' talker config warned of the mrope
    keys its own rotary embedding reads. The keys stay; the warning goes."""
    import logging

    from transformers import Qwen3OmniMoeConfig

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("transformers.modeling_rope_utils")
    logger.addHandler(handler)
    try:
        config = Qwen3OmniMoeConfig.from_pretrained(tiny_qwen)
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records if "rope_parameters" in r.getMessage()] == []
    talker_rope = config.talker_config.text_config.rope_parameters
    assert talker_rope["mrope_section"] == [4, 2, 2] and talker_rope["interleaved"] is True
