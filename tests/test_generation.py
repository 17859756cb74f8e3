"""The Hugging Face engine: batching with left padding, stop strings, seeds, finish reasons."""

import pytest
import torch

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


def test_completions_carry_the_token_ids_they_sampled(engine):
    """Greedy ids are each the argmax after the prompt and the ids before them: the sampled
    tokens themselves, whatever their text re-encodes to (left padding notwithstanding)."""
    params = SamplingParams(max_new_tokens=10)
    for prompt, completion in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        sampled = list(completion.token_ids)
        assert len(sampled) == completion.num_tokens
        assert engine.tokenizer.decode(sampled, skip_special_tokens=True) == completion.text
        prompt_ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = engine.model(torch.tensor([prompt_ids + sampled])).logits[0]
        assert logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist() == sampled


def _next_turn(prompts: list[str], completions) -> list[str]:
    """Second-turn prompts: each prompt, its completion, a tool output and a new turn."""
    return [
        f"{p}{c.text}<|im_end|>\n<|im_start|>user\n```output\n{i}\n```<|im_end|>\n"
        "<|im_start|>assistant\n"
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_conversation_reuses_earlier_turns_and_gives_the_same_text(tiny_policy, temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=10, seed=5)
    fresh = HFEngine.from_pretrained(str(tiny_policy), batch_size=2)
    first = fresh.generate(PROMPTS, params)
    expected = [c.text for c in fresh.generate(_next_turn(PROMPTS, first), params)]
    assert fresh.reused_tokens == 0
    engine = HFEngine.from_pretrained(str(tiny_policy), batch_size=2)
    with engine.conversation():
        turn = engine.generate(PROMPTS, params)
        assert engine.reused_tokens == 0
        second = engine.generate(_next_turn(PROMPTS, turn), params)
    assert [c.text for c in turn] == [c.text for c in first]
    assert [c.text for c in second] == expected
    # every prompt but its last token, less what the completion's text re-tokenizes to
    prompt_tokens = [len(engine.tokenizer(p, add_special_tokens=False).input_ids) for p in PROMPTS]
    assert engine.reused_tokens >= sum(prompt_tokens) - len(PROMPTS)


def test_a_conversation_of_two_waves_reuses_each_waves_earlier_turn(tiny_policy):
    # The tool loop's waves take turns: wave 1's call comes between wave 0's two turns.
    params = SamplingParams(max_new_tokens=8)
    waves = [PROMPTS[:2], PROMPTS[2:]]
    fresh = HFEngine.from_pretrained(str(tiny_policy), batch_size=2)
    expected = [
        [c.text for c in fresh.generate(_next_turn(w, fresh.generate(w, params)), params)]
        for w in waves
    ]
    engine = HFEngine.from_pretrained(str(tiny_policy), batch_size=2)
    with engine.conversation(calls=2):
        firsts = [engine.generate(w, params) for w in waves]
        reused = []
        for wave, first in zip(waves, firsts, strict=True):
            before = engine.reused_tokens
            second = engine.generate(_next_turn(wave, first), params)
            reused.append(engine.reused_tokens - before)
            assert [c.text for c in second] == expected[waves.index(wave)]
    prompt_tokens = [len(engine.tokenizer(p, add_special_tokens=False).input_ids) for p in PROMPTS]
    # every prompt of the wave but its last token, as with one wave
    assert reused[0] >= sum(prompt_tokens[:2]) - 2 and reused[1] >= sum(prompt_tokens[2:]) - 1
    # one call kept: wave 1's first call has pushed wave 0's rows out
    single = HFEngine.from_pretrained(str(tiny_policy), batch_size=2)
    with single.conversation():
        firsts = [single.generate(w, params) for w in waves]
        single.generate(_next_turn(waves[0], firsts[0]), params)
    assert single.reused_tokens == 0


def test_new_weights_or_no_budget_reuse_nothing(tiny_policy):
    params = SamplingParams(max_new_tokens=6)
    engine = HFEngine.from_pretrained(str(tiny_policy), batch_size=2)
    with engine.conversation():
        turn = engine.generate(PROMPTS, params)
        engine.load_weights(engine.model.state_dict())
        engine.generate(_next_turn(PROMPTS, turn), params)
    assert engine.reused_tokens == 0
    unbudgeted = HFEngine.from_pretrained(str(tiny_policy), batch_size=2, prefix_cache_mb=0)
    with unbudgeted.conversation():
        unbudgeted.generate(_next_turn(PROMPTS, unbudgeted.generate(PROMPTS, params)), params)
    assert unbudgeted.reused_tokens == 0


def test_the_longest_kept_prefix_is_chosen_and_one_token_is_left_to_encode(tiny_policy):
    from reasonrl.generation.prefix_cache import PrefixStore

    engine = HFEngine.from_pretrained(str(tiny_policy), batch_size=4)
    store = PrefixStore(2**30)
    rows = [[5, 6, 7], [5, 6, 8, 9, 10]]
    ids = torch.tensor([[0, 0, *rows[0]], rows[1]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = engine.model(input_ids=ids, attention_mask=mask, use_cache=True)
    store.keep(
        torch.cat([ids, ids[:, -1:]], 1), torch.cat([mask, mask[:, -1:]], 1), out.past_key_values
    )
    assert [row.ids for row in store.rows] == rows
    assert store.longest_prefix([5, 6, 8, 9, 11]) == (1, 4)
    assert store.longest_prefix([5, 6, 7]) == (0, 2)
    assert store.longest_prefix([4, 6]) == (0, 0)


def test_on_a_gpu_cudnn_attention_is_switched_off(monkeypatch):
    from reasonrl.models import execution_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert execution_device().type == "cuda"
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def test_sampling_params_come_from_a_config_section_with_its_own_token_cap_when_it_has_one():
    from reasonrl.config import validate_config

    config = validate_config({"ppo": {"temperature": 0.9, "top_p": 0.95}})
    assert SamplingParams.from_section(config["ppo"], seed=7) == SamplingParams(
        temperature=0.9, top_p=0.95, seed=7
    )
    rephrase = config["preference"]["prompts"]["rephrase_sampling"]
    assert SamplingParams.from_section(rephrase, seed=1).max_new_tokens == 256
    with pytest.raises(KeyError):
        SamplingParams.from_section({"temperature": 1.0}, seed=0)  # a section without top_p


def test_no_module_builds_sampled_params_by_hand():
    """Sampled generation takes its temperature and top_p from its config section
    (SamplingParams.from_section); only greedy decoding (the defaults) is built in place."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "workflow/reasonrl"
    by_hand = re.compile(r"(?<![.\w])SamplingParams\((?!seed=[^,()]*(\([^()]*\))?[^,()]*\))[^)]")
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert not found, found


def test_the_generation_section_is_typed_once_with_the_schemas_defaults():
    """EngineSettings is the generation section: its defaults are the schema's, and a
    section's values reach every field (the vllm options too)."""
    from reasonrl.config import validate_config
    from reasonrl.generation import EngineSettings, VLLMOptions

    assert EngineSettings.from_section(validate_config({})["generation"]) == EngineSettings()
    section = validate_config(
        {"generation": {"engine": "vllm", "batch_size": 7, "vllm": {"max_model_len": 64}}}
    )["generation"]
    settings = EngineSettings.from_section(section)
    assert (settings.engine, settings.batch_size) == ("vllm", 7)
    assert settings.vllm == VLLMOptions(max_model_len=64)
