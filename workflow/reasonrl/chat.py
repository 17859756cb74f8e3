"""Chat format: rendering through the tokenizer's chat template, and loss masks from its spans.

Masks are derived from where each assistant turn lands in the rendered text (prefix renders of
the conversation), never from hard-coded token ids, so any prefix-consistent template works.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reasonrl.errors import ReasonRLError

# A ```python block of a model turn: what the tool loop runs and what copy accuracy reads.
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# For a base model whose tokenizer has no chat template: plain "Role:" headers, and the
# tokenizer's own eos token closes each model turn (so generation stops there and the SFT
# loss teaches it). Prefix-consistent, as assistant_spans needs.
BASE_MODEL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | capitalize + ':\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:\n' }}{% endif %}"
)


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The conversation as text, through the tokenizer's own chat template."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """Render `messages` and return the text with the character span of every assistant turn.

    A span starts after the template's assistant header and ends after the end-of-turn marker
    (so the model learns to stop), excluding trailing whitespace between turns.
    """
    text = render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render(tokenizer, messages[:i], add_generation_prompt=True)
        through = render(tokenizer, messages[: i + 1])
        if not (through.startswith(prefix) and text.startswith(through)):
            raise ReasonRLError(
                "the tokenizer's chat template is not prefix-consistent; assistant spans "
                "cannot be located for loss masks"
            )
        spans.append((len(prefix), len(through.rstrip())))
    return text, spans


@dataclass(frozen=True)
class TokenizedChat:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on tokens of the model's own turns
    # The token to predict at each position where it is not the input's own (a PRM predicts
    # a step's label where its input holds the step tag); None: the input ids.
    targets: list[int] | None = None

    @property
    def labels(self) -> list[int]:
        wanted = self.input_ids if self.targets is None else self.targets
        return [t if m else -100 for t, m in zip(wanted, self.loss_mask, strict=True)]

    def truncated(self, length: int) -> TokenizedChat:
        """The first `length` tokens."""
        targets = None if self.targets is None else self.targets[:length]
        return TokenizedChat(self.input_ids[:length], self.loss_mask[:length], targets)


def tokenize_chat(tokenizer, messages: list[dict], max_length: int | None = None) -> TokenizedChat:
    """Token ids of the rendered conversation and a mask that is 1 only on assistant tokens."""
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    mask = [
        int(any(lo <= start < hi for lo, hi in spans)) for start, _ in encoded["offset_mapping"]
    ]
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return TokenizedChat(ids, mask)
