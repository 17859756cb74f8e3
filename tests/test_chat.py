"""Loss masks come from chat-template spans: assistant tokens only, any template."""

import pytest

from reasonrl.chat import CHATML_TEMPLATE, assistant_spans, tokenize_chat
from reasonrl.errors import ReasonRLError
from reasonrl.models import smollm2_gguf_path, train_tokenizer

CONVERSATION = [
    {"role": "user", "content": "Tom has 12 pens. He buys 30 more. How many pens?"},
    {
        "role": "assistant",
        "content": "Let me compute.\n```python\nx = 12\nx = x + 30\nprint(x)\n```",
    },
    {"role": "user", "content": "```output\n42\n```"},
    {"role": "assistant", "content": "The answer is \\boxed{42}."},
]


@pytest.fixture(scope="module")
def tiny_tokenizer():
    texts = [m["content"] for m in CONVERSATION] * 20
    return train_tokenizer(texts, vocab_size=320)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _masked_text(tokenizer, chat) -> str:
    return tokenizer.decode([t for t, m in zip(chat.input_ids, chat.loss_mask, strict=True) if m])


@pytest.mark.parametrize("which", ["tiny_tokenizer", "smollm2_tokenizer"])
def test_mask_covers_exactly_the_assistant_turns(which, request):
    tokenizer = request.getfixturevalue(which)
    chat = tokenize_chat(tokenizer, CONVERSATION)
    masked = _masked_text(tokenizer, chat)
    # Both assistant turns with their end-of-turn marker, nothing of the user or interpreter.
    assert masked == (
        CONVERSATION[1]["content"] + "<|im_end|>" + CONVERSATION[3]["content"] + "<|im_end|>"
    )
    pairs = zip(chat.input_ids, chat.loss_mask, strict=True)
    unmasked = tokenizer.decode([t for t, m in pairs if not m])
    assert "```output\n42\n```" in unmasked
    assert "Tom has 12 pens" in unmasked
    assert chat.labels.count(-100) == len(chat.input_ids) - sum(chat.loss_mask)


def test_mask_token_by_token_on_interpreter_turn(tiny_tokenizer):
    chat = tokenize_chat(tiny_tokenizer, CONVERSATION)
    text, spans = assistant_spans(tiny_tokenizer, CONVERSATION)
    enc = tiny_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    for (start, _), flag in zip(enc["offset_mapping"], chat.loss_mask, strict=True):
        inside = any(lo <= start < hi for lo, hi in spans)
        assert flag == int(inside)
    interpreter_start = text.index("```output")
    for (start, _), flag in zip(enc["offset_mapping"], chat.loss_mask, strict=True):
        if interpreter_start <= start < interpreter_start + len("```output\n42\n```"):
            assert flag == 0


def test_template_that_is_not_prefix_consistent_is_refused(tiny_tokenizer):
    tokenizer = train_tokenizer(["abc"] * 5, vocab_size=300)
    # A template that numbers turns from the end changes earlier text as turns are added.
    tokenizer.chat_template = (
        "{% for m in messages %}{{ (messages|length - loop.index)|string + m['content'] }}"
        "{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    with pytest.raises(ReasonRLError, match="prefix-consistent"):
        tokenize_chat(tokenizer, CONVERSATION)


def test_tiny_tokenizer_uses_chatml(tiny_tokenizer):
    assert tiny_tokenizer.chat_template == CHATML_TEMPLATE
    ids = tiny_tokenizer("12345", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5  # digits are split one per token


def test_a_base_model_without_a_template_gets_the_base_model_template(tmp_path, tiny_tokenizer):
    from reasonrl.chat import BASE_MODEL_TEMPLATE, render
    from reasonrl.models import end_of_turn_ids, load_tokenizer

    base = train_tokenizer([m["content"] for m in CONVERSATION] * 20, vocab_size=320)
    base.chat_template = None
    base.eos_token = "<|endoftext|>"  # a base model ends documents, not turns
    base.save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.chat_template == BASE_MODEL_TEMPLATE
    chat = tokenize_chat(tokenizer, CONVERSATION)
    eos = "<|endoftext|>"
    assert _masked_text(tokenizer, chat) == (
        CONVERSATION[1]["content"] + eos + CONVERSATION[3]["content"] + eos
    )
    prompt = render(tokenizer, CONVERSATION[:3], add_generation_prompt=True)
    assert prompt.endswith("User:\n```output\n42\n```\n\nAssistant:\n")
    assert tokenizer.eos_token_id in end_of_turn_ids(tokenizer)


def test_a_tokenizer_with_no_template_and_no_eos_is_refused_in_one_line(tmp_path):
    from reasonrl.models import load_tokenizer

    base = train_tokenizer(["abc"] * 5, vocab_size=300)
    base.chat_template = None
    base.eos_token = None
    base.pad_token = "<|pad|>"
    base.save_pretrained(tmp_path)
    with pytest.raises(ReasonRLError, match="neither a chat template nor an eos token"):
        load_tokenizer(tmp_path)
