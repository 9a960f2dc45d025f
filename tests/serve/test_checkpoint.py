"""Serving a trained checkpoint (a save_pretrained folder): its own weights, bf16 upcast, no template."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serve.engine import ServeEngine
from serve.protocol import ServeError
from serve.sampling import SamplingParams


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    """What the trainer writes: changed weights saved in bf16, plus the tokenizer, here without a template."""
    out = tmp_path_factory.mktemp("ckpt") / "step-7"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def test_a_checkpoint_is_served_with_its_own_weights_in_fp32(checkpoint, tiny_model_dir):
    engine = ServeEngine(checkpoint, policy_version="ckpt-7")
    base = ServeEngine(tiny_model_dir)
    assert engine.model.dtype == torch.float32
    assert (engine.identity.served_name, engine.identity.policy_version) == ("step-7", "ckpt-7")
    assert engine.identity.tokenizer == base.identity.tokenizer  # same tokenizer, same identity
    assert engine.identity.chat_template_hash is None and "x-chat-template-hash" not in engine.identity.headers()
    params = SamplingParams(max_tokens=6, temperature=0)
    prompt = engine.text_prompt("def main():")
    served = [s.token.logprob for s in engine.generate(prompt, params)]
    assert served != pytest.approx([s.token.logprob for s in base.generate(prompt, params)], abs=1e-3)
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    ids = prompt + [s.token.token_id for s in engine.generate(prompt, params)]
    with torch.inference_mode():
        raw = torch.log_softmax(reference(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    expected = [float(raw[len(prompt) - 1 + i, t]) for i, t in enumerate(ids[len(prompt):])]
    assert served == pytest.approx(expected, abs=1e-4)


def test_without_a_chat_template_chat_is_refused_with_advice(checkpoint):
    engine = ServeEngine(checkpoint)
    with pytest.raises(ServeError, match="no chat template; use POST /v1/completions") as caught:
        engine.chat_prompt([{"role": "user", "content": "hi"}], None)
    assert caught.value.status == 400


def test_a_folder_without_a_model_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained directory"):
        ServeEngine(tmp_path)
