"""The Hugging Face engine: batching with left padding, stop strings, seeds, finish reasons."""

import pytest

from reasonrl.generation import SamplingParams
from reasonrl.generation.hf import HFEngine

PROMPTS = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "x = 1\n" * 6, "print(3)"]


@pytest.fixture(scope="module")
def engine(tiny_policy):
    return HFEngine.from_pretrained(str(tiny_policy), batch_size=2)


def test_batched_greedy_equals_one_by_one(engine):
    params = SamplingParams(max_new_tokens=12)
    together = engine.generate(PROMPTS, params)
    alone = [engine.generate([p], params)[0] for p in PROMPTS]
    assert [c.text for c in together] == [c.text for c in alone]
    assert all(c.num_tokens == 12 and c.finish_reason == "length" for c in together)


def test_sampling_is_reproducible_by_seed(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    first = [c.text for c in engine.generate(PROMPTS, params)]
    assert first == [c.text for c in engine.generate(PROMPTS, params)]
    other = SamplingParams(temperature=1.0, max_new_tokens=16, seed=4)
    assert first != [c.text for c in engine.generate(PROMPTS, other)]


def test_stop_string_cuts_the_text(engine):
    free = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=30, seed=0))
    stop = next(c.text[2:4] for c in free if len(c.text) > 4)
    params = SamplingParams(temperature=1.0, max_new_tokens=30, seed=0, stop=(stop,))
    cut = engine.generate(PROMPTS, params)
    for before, after in zip(free, cut, strict=True):
        if stop in before.text:
            assert after.finish_reason == "stop"
            assert stop not in after.text
            assert before.text.startswith(after.text)
