"""The message format of a tool trajectory: a model turn ending in a ```python block, the
interpreter's output as the next user turn, and a final model turn with the \\boxed{} answer.

Gold solutions (generated or loaded) and sampled rollouts build their turns here, so SFT data
and rollouts look the same to the model.
"""

from __future__ import annotations


def code_turn(text: str, program: str) -> dict:
    """A model turn: optional reasoning, then the program in a ```python block (the turn ends
    at the closing fence, where a rollout stops the model and runs the code)."""
    program = program if program.endswith("\n") else f"{program}\n"
    lead = f"{text}\n" if text else ""
    return {"role": "assistant", "content": f"{lead}```python\n{program}```"}


def output_turn(output: str) -> dict:
    """The interpreter's output, given back to the model as a user turn."""
    return {"role": "user", "content": f"```output\n{output}\n```"}
