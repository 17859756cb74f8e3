"""`pycode`: small function-writing problems in HumanEval format.

Each problem comes from a parametrised family (sum of multiples of k, clamp to [lo, hi], ...);
the constants appear in the function name and docstring, so train and test differ by them.
Expected test values come from running the reference solution in-process (our own code).
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from reasonrl.tasks.sampling import draw_splits

WORDS = (
    "apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "orbit", "maple", "zebra",
    "quiet", "sunny", "bread", "candle", "eagle", "fox", "sky", "umbrella", "ink", "jam",
)  # fmt: skip
SEPARATORS = {" ": "space", "-": "dash", ",": "comma", ";": "semicolon", "_": "underscore"}
NUM_TESTS = 5


@dataclass(frozen=True)
class FunctionSpec:
    family: str
    name: str
    params: str
    returns: str
    doc: str
    body: str
    inputs: tuple[tuple, ...]


def _label(number: int) -> str:
    """A number as part of an identifier."""
    return f"minus{-number}" if number < 0 else str(number)


def _phrase(rng: random.Random, sep: str = " ") -> str:
    words = [
        w.capitalize() if rng.random() < 0.3 else w for w in rng.sample(WORDS, rng.randint(0, 4))
    ]
    return sep.join(words)


def _int_lists(rng: random.Random, low: int, high: int) -> tuple[tuple, ...]:
    return tuple(
        ([rng.randint(low, high) for _ in range(rng.randint(0, 6))],) for _ in range(NUM_TESTS)
    )


def _ints(rng: random.Random, low: int, high: int) -> tuple[tuple, ...]:
    return tuple((rng.randint(low, high),) for _ in range(NUM_TESTS))


def sum_multiples(rng: random.Random) -> FunctionSpec:
    k = rng.randint(2, 30)
    return FunctionSpec(
        "sum_multiples",
        f"sum_multiples_of_{k}",
        "n: int",
        "int",
        f"Return the sum of the non-negative integers below n that are divisible by {k}.",
        f"    return sum(i for i in range(n) if i % {k} == 0)\n",
        _ints(rng, 0, 200),
    )


def count_letters(rng: random.Random) -> FunctionSpec:
    letters = "".join(sorted(rng.sample(string.ascii_lowercase, 3)))
    return FunctionSpec(
        "count_letters",
        f"count_letters_{letters}",
        "s: str",
        "int",
        f"Return how many characters of s are one of the letters '{letters}', ignoring case.",
        f"    return sum(1 for c in s.lower() if c in {letters!r})\n",
        tuple((_phrase(rng),) for _ in range(NUM_TESTS)),
    )


def reverse_parts(rng: random.Random) -> FunctionSpec:
    sep = rng.choice(sorted(SEPARATORS))
    inputs = tuple((_phrase(rng, sep),) for _ in range(NUM_TESTS))
    if rng.random() < 0.5:
        return FunctionSpec(
            "reverse_parts",
            f"reverse_{SEPARATORS[sep]}_separated",
            "s: str",
            "str",
            f"Split s at every {sep!r}, reverse the order of the parts and join them with {sep!r}.",
            f"    return {sep!r}.join(reversed(s.split({sep!r})))\n",
            inputs,
        )
    return FunctionSpec(
        "reverse_parts",
        f"reverse_each_{SEPARATORS[sep]}_separated_part",
        "s: str",
        "str",
        f"Split s at every {sep!r}, reverse the letters of each part and join the parts "
        f"with {sep!r}.",
        f"    return {sep!r}.join(part[::-1] for part in s.split({sep!r}))\n",
        inputs,
    )


def clamp(rng: random.Random) -> FunctionSpec:
    low = rng.randint(-20, 20)
    high = rng.randint(low + 1, low + 60)
    return FunctionSpec(
        "clamp",
        f"clamp_{_label(low)}_{_label(high)}",
        "x: int",
        "int",
        f"Return x limited to the range [{low}, {high}].",
        f"    return max({low}, min({high}, x))\n",
        _ints(rng, low - 30, high + 30),
    )


def series_sum(rng: random.Random) -> FunctionSpec:
    first, step = rng.randint(0, 9), rng.randint(1, 9)
    return FunctionSpec(
        "series_sum",
        f"series_sum_{first}_step_{step}",
        "n: int",
        "int",
        f"Return the sum of the first n terms of the sequence {first}, {first + step}, "
        f"{first + 2 * step}, ...",
        f"    return sum({first} + {step} * i for i in range(n))\n",
        _ints(rng, 0, 30),
    )


def running_sum_mod(rng: random.Random) -> FunctionSpec:
    m = rng.randint(2, 30)
    return FunctionSpec(
        "running_sum_mod",
        f"running_sum_mod_{m}",
        "xs: list[int]",
        "list[int]",
        f"Return the running sums of xs, each taken modulo {m}.",
        "    result, total = [], 0\n"
        "    for x in xs:\n"
        f"        total = (total + x) % {m}\n"
        "        result.append(total)\n"
        "    return result\n",
        _int_lists(rng, -20, 50),
    )


def running_extreme(rng: random.Random) -> FunctionSpec:
    which, start = rng.choice(("max", "min")), rng.randint(-9, 9)
    return FunctionSpec(
        "running_extreme",
        f"running_{which}_from_{_label(start)}",
        "xs: list[int]",
        "list[int]",
        f"Return the running {which}imum of xs, starting from the value {start}.",
        f"    result, best = [], {start}\n"
        "    for x in xs:\n"
        f"        best = {which}(best, x)\n"
        "        result.append(best)\n"
        "    return result\n",
        _int_lists(rng, -20, 20),
    )


COMPARISONS = {">": "above", ">=": "at_least", "<": "below", "<=": "at_most"}


def count_compare(rng: random.Random) -> FunctionSpec:
    threshold = rng.randint(-10, 50)
    op = rng.choice(sorted(COMPARISONS))
    word = COMPARISONS[op]
    return FunctionSpec(
        "count_compare",
        f"count_{word}_{_label(threshold)}",
        "xs: list[int]",
        "int",
        f"Return how many numbers in xs are {word.replace('_', ' ')} {threshold}.",
        f"    return sum(1 for x in xs if x {op} {threshold})\n",
        _int_lists(rng, -20, 70),
    )


def repeat_chars(rng: random.Random) -> FunctionSpec:
    times = rng.randint(2, 6)
    sep = rng.choice(("", *sorted(SEPARATORS)))
    joined = f", the groups joined with {sep!r}" if sep else ""
    suffix = f"_joined_by_{SEPARATORS[sep]}" if sep else ""
    return FunctionSpec(
        "repeat_chars",
        f"repeat_chars_{times}_times{suffix}",
        "s: str",
        "str",
        f"Return s with every character repeated {times} times{joined}.",
        f"    return {sep!r}.join(c * {times} for c in s)\n",
        tuple((rng.choice(WORDS)[: rng.randint(0, 4)],) for _ in range(NUM_TESTS)),
    )


def divisible_by_both(rng: random.Random) -> FunctionSpec:
    a, b = sorted(rng.sample(range(2, 16), 2))
    lcm = math.lcm(a, b)
    # Half the tests hit a common multiple, so both outcomes are checked.
    inputs = tuple(
        (rng.randint(1, 5) * lcm if i % 2 else rng.randint(0, 300),) for i in range(NUM_TESTS)
    )
    return FunctionSpec(
        "divisible_by_both",
        f"divisible_by_{a}_and_{b}",
        "n: int",
        "bool",
        f"Return True if n is divisible by both {a} and {b}, else False.",
        f"    return n % {a} == 0 and n % {b} == 0\n",
        inputs,
    )


def digit_sum_base(rng: random.Random) -> FunctionSpec:
    base = rng.randint(2, 10)
    return FunctionSpec(
        "digit_sum_base",
        f"digit_sum_base_{base}",
        "n: int",
        "int",
        f"Return the sum of the digits of the non-negative integer n written in base {base}.",
        "    total = 0\n"
        "    while n > 0:\n"
        f"        total += n % {base}\n"
        f"        n //= {base}\n"
        "    return total\n",
        _ints(rng, 0, 1000),
    )


def filter_words(rng: random.Random) -> FunctionSpec:
    length = rng.randint(2, 8)
    longer = rng.random() < 0.5
    return FunctionSpec(
        "filter_words",
        f"words_{'longer' if longer else 'shorter'}_than_{length}",
        "s: str",
        "list[str]",
        f"Return the words of s (split at whitespace) with {'more' if longer else 'fewer'} "
        f"than {length} letters, in order.",
        f"    return [w for w in s.split() if len(w) {'>' if longer else '<'} {length}]\n",
        tuple((_phrase(rng),) for _ in range(NUM_TESTS)),
    )


def replace_multiples(rng: random.Random) -> FunctionSpec:
    every, word = rng.randint(2, 9), rng.choice(WORDS)
    return FunctionSpec(
        "replace_multiples",
        f"{word}_every_{every}",
        "n: int",
        "list[str]",
        f"Return the numbers 1 to n as strings, with every multiple of {every} replaced "
        f"by {word!r}.",
        f"    return [{word!r} if i % {every} == 0 else str(i) for i in range(1, n + 1)]\n",
        _ints(rng, 0, 15),
    )


FAMILIES: tuple[Callable[[random.Random], FunctionSpec], ...] = (
    sum_multiples,
    count_letters,
    reverse_parts,
    clamp,
    series_sum,
    running_sum_mod,
    running_extreme,
    count_compare,
    repeat_chars,
    divisible_by_both,
    digit_sum_base,
    filter_words,
    replace_multiples,
)


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _reference(spec: FunctionSpec) -> Callable:
    namespace: dict = {}
    source = f"def {spec.name}({spec.params}) -> {spec.returns}:\n{spec.body}"
    exec(source, namespace)  # noqa: S102 - our own reference solution, never model-written
    return namespace[spec.name]


def humaneval_fields(spec: FunctionSpec) -> dict:
    """prompt (signature + docstring with an example), test, entry_point, canonical_solution."""
    reference = _reference(spec)
    cases = list({repr(args): args for args in spec.inputs}.values())  # de-duplicated, in order
    expected = [reference(*args) for args in cases]
    prompt = (
        f"def {spec.name}({spec.params}) -> {spec.returns}:\n"
        f'    """{spec.doc}\n'
        f"    >>> {_call(spec.name, cases[0])}\n"
        f"    {expected[0]!r}\n"
        '    """\n'
    )
    asserts = "".join(
        f"    assert candidate({', '.join(repr(a) for a in args)}) == {value!r}\n"
        for args, value in zip(cases, expected, strict=True)
    )
    return {
        "prompt": prompt,
        "test": f"def check(candidate):\n{asserts}",
        "entry_point": spec.name,
        "canonical_solution": spec.body,
    }


def problem_row(spec: FunctionSpec, task: str, split: str, index: int) -> dict:
    code = humaneval_fields(spec)
    solution = [{"role": "assistant", "content": f"```python\n{code['prompt']}{spec.body}```"}]
    return {
        "id": f"{task}-{split}-{index:05d}",
        "task": task,
        "split": split,
        "question": code["prompt"],
        "answer": "",
        "solutions": {"tool": solution, "cot": solution},
        "code": code,
        "meta": {"family": spec.family},
    }


def build(task: str, settings: dict, seed: int) -> dict[str, list[dict]]:
    """Rows of every split (train, test, pools; disjoint, de-duplicated by prompt),
    deterministic for the seed."""

    def draw(rng: random.Random) -> tuple[FunctionSpec, str]:
        spec = rng.choice(FAMILIES)(rng)
        return spec, f"{spec.name}:{spec.doc}"

    splits = draw_splits(task, settings, seed, draw)
    return {
        split: [problem_row(spec, task, split, i) for i, spec in enumerate(specs)]
        for split, specs in splits.items()
    }
