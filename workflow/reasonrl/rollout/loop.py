"""The multi-turn tool loop: model turn -> run its ```python block -> ```output``` user turn.

All live trajectories advance together each turn (one batched generate call per turn and
per token budget), and then their new code blocks run together in the sandbox's pool. State
carries over between turns as in a notebook: each new cell runs after the trajectory's
earlier cells, re-run silently (program_with_history), so its program's time grows with the
history. Where re-running the history takes longer than opening an interpreter session
(SESSION_OPEN_SECONDS), and the trajectory has a turn left for another cell, its cells from
then on run in a session of its own (reasonrl.sandbox.Session): the first one re-runs the
history as the program would, and each later one runs once. A session's cell prints what the
re-run program prints, so sessions change no rollout, only its time. A trajectory's session is
closed when it ends, and every session when the rollout ends (on an exception too);
session_cap caps those open at once.

With rollout.waves > 1 the trajectories are split into that many waves that take turns: a
wave's cells run in the sandbox (on a thread of ours: the pool only waits on its
sandboxes) while the next wave generates, so the engine does not stand idle while cells
run, nor the sandbox while the engine generates. One cell batch runs at a time, so the
pool's worker and memory caps hold. A wave's turn samples with its own seed.
"""

from __future__ import annotations

import contextlib
import resource
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from tqdm import tqdm

from reasonrl.chat import CODE_BLOCK, render
from reasonrl.generation import GenerationEngine, SamplingParams
from reasonrl.sandbox import CancelToken, Sandbox, Session, program_with_history
from reasonrl.sandbox.pool import POLL_SECONDS, Program, WorkerPool
from reasonrl.tasks import extract_final, grade_many, is_final_turn, prompt_messages
from reasonrl.tasks.tool_turns import output_turn

# The model's turn ends with its code; it must not write the interpreter's output itself.
STOP = ("```output",)
# Sessions open at once, at most (see session_cap): each holds a zygote, a sandbox uid (of
# 1024) and about ten descriptors of ours. Past it, a trajectory's later cells each re-run its
# earlier ones in a program of their own, as before sessions.
MAX_SESSIONS = 256
_DESCRIPTORS_PER_SESSION = 16  # about ten, with room for the rest of the process
# A session pays once re-running a trajectory's cells takes longer than opening one: a zygote
# (bwrap and an interpreter with its preloaded modules) started for it and closed after it.
# Measured 72 ms (median of 15; 66 to 79 ms) for Sandbox._start_zygote() and close() on the
# 2-core CI machine, against 8 ms for a short cell's re-run program in a warm zygote (see
# bench/session_cells.py, which prints both), rounded up. The measured re-run is a
# program's duration, which for the first program of each pool worker in a batch includes
# starting the worker's zygote (those 70 ms): a trajectory of millisecond cells stays under
# it even then (none of 16 six-cell ones opened a session in the bench), and one that
# passes it on a busy machine costs a zygote start, not an output. Twice the threshold
# (0.2 s) would open sessions for 50 ms cells only at their fifth: 1.27x at six cells in
# the bench, against 1.92x at 0.1 s. With max_turns 2, as in CI's fixtures, no session
# ever opens: a second cell is a trajectory's last.
SESSION_OPEN_SECONDS = 0.1
# A wave's sampling seed is offset from the others' by this much per wave (a prime, past any
# turn's offset and any call's prompt count) so that waves draw independent samples.
WAVE_SEED_STRIDE = 104_729


@dataclass
class RolloutSettings:
    max_turns: int = 6
    max_turn_tokens: int = 512
    max_total_tokens: int = 2048
    waves: int = 1  # groups of trajectories taking turns, one's cells run while another generates

    @classmethod
    def from_config(cls, section: dict) -> RolloutSettings:
        return cls(**section)


@dataclass
class _State:
    problem: dict
    sample: int
    messages: list[dict]
    cells: list[str] = field(default_factory=list)
    tokens: int = 0
    turns: int = 0
    tool_status: list[str] = field(default_factory=list)
    turn_token_ids: list[list[int]] = field(default_factory=list)  # sampled ids, per model turn
    finish_reason: str | None = None
    partial: str = ""  # start of the next model turn, given (a step prefix); the model continues it
    session: Session | None = None  # once re-running its cells costs more than opening one
    # What re-running its cells so far took: the duration of the program that last ran them
    # all (0 for a continued rollout's prefix, whose cells ran elsewhere).
    rerun_seconds: float = 0.0


@dataclass(frozen=True)
class RolloutPrefix:
    """Where a continued rollout starts: the conversation so far and, optionally, the start of
    the next model turn (e.g. the first steps of a chain-of-thought turn)."""

    problem: dict
    messages: list[dict]
    partial: str = ""
    sample: int = 0


def last_code_block(text: str) -> str | None:
    blocks = CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def run_rollouts(
    engine: GenerationEngine,
    problems: list[dict],
    style: str,
    samples_per_problem: int,
    params: SamplingParams,
    limits: RolloutSettings,
    sandbox,
    policy: str = "",
) -> list[dict]:
    """Sample `samples_per_problem` trajectories per problem; return schema-valid rows."""
    states = [
        _State(problem, s, prompt_messages(problem, style))
        for problem in problems
        for s in range(samples_per_problem)
    ]
    return _roll(engine, states, params, limits, sandbox, policy)


def continue_rollouts(
    engine: GenerationEngine,
    prefixes: list[RolloutPrefix],
    params: SamplingParams,
    limits: RolloutSettings,
    sandbox,
    policy: str = "",
) -> list[dict]:
    """Complete each prefix with the tool loop (all prefixes batched together); the turn cap
    counts the prefix's model turns, and the prefix's code cells are re-run for their state."""
    states = []
    for prefix in prefixes:
        messages = [dict(m) for m in prefix.messages]
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        cells = [code for code in map(last_code_block, replies) if code is not None]
        states.append(
            _State(
                prefix.problem,
                prefix.sample,
                messages,
                cells=cells,
                turns=len(replies),
                partial=prefix.partial,
            )
        )
    return _roll(engine, states, params, limits, sandbox, policy)


def _roll(engine, states: list[_State], params, limits, sandbox, policy: str) -> list[dict]:
    # Each turn's batch runs as the pool runs any (in zygotes if it has more programs than
    # workers): the same programs, so the same outputs, as without sessions.
    waves = _waves(states, limits.waves)
    with engine.conversation(calls=len(waves)):
        try:
            with _CellRunner(sandbox) as cells:
                for turn in tqdm(range(limits.max_turns), desc="turns", leave=False):
                    took = [
                        _take_turn(engine, w, wave, states, params, limits, sandbox, turn, cells)
                        for w, wave in enumerate(waves)
                    ]
                    if not any(took):
                        break
                cells.finish_all()
        finally:
            _close_sessions(states)
    for state in states:
        if state.finish_reason is None:
            state.finish_reason = "max_turns"
    decoding = "sampled" if params.temperature > 0 else "greedy"
    finals = [extract_final(state.problem, state.messages) for state in states]
    correct = grade_many([state.problem for state in states], finals, sandbox)
    return [
        _row(state, final, is_correct, policy, decoding)
        for state, final, is_correct in zip(states, finals, correct, strict=True)
    ]


def _waves(states: list[_State], waves: int) -> list[list[_State]]:
    """`waves` contiguous groups of the trajectories (fewer when there are fewer of them)."""
    waves = max(1, min(waves, len(states)))
    return [states[w * len(states) // waves : (w + 1) * len(states) // waves] for w in range(waves)]


def _take_turn(engine, w, wave, states, params, limits, sandbox, turn, cells) -> bool:
    """Wave `w`'s turn: take its cells' outputs from its last turn, then generate its next
    model turns and start their cells. Whether it had a live trajectory."""
    cells.finish(w)
    for state in wave:
        if state.finish_reason is None and state.turns >= limits.max_turns:
            state.finish_reason = "max_turns"
    _close_sessions([s for s in wave if s.finish_reason is not None])
    live = [s for s in wave if s.finish_reason is None]
    if live:
        wave_params = replace(params, seed=params.seed + WAVE_SEED_STRIDE * w)
        to_run = _generate_turn(engine, live, wave_params, limits, turn)
        _close_sessions([s for s in live if s.finish_reason is not None])  # zygotes are free
        cells.start(w, to_run, _cell_programs(to_run, sandbox, states, limits))
    return bool(live)


def _generate_turn(engine, live, params, limits, turn) -> list[tuple[_State, str]]:
    """Generate the live trajectories' next model turn (one call per token budget); the
    trajectories that wrote a cell, with it."""
    by_budget: dict[int, list[_State]] = {}
    for state in live:
        budget = min(limits.max_turn_tokens, limits.max_total_tokens - state.tokens)
        if budget <= 0:
            state.finish_reason = "total_token_cap"
        else:
            by_budget.setdefault(budget, []).append(state)
    to_run: list[tuple[_State, str]] = []
    for budget, group in by_budget.items():
        prompts = [
            render(engine.tokenizer, s.messages, add_generation_prompt=True) + s.partial
            for s in group
        ]
        turn_params = replace(
            params, max_new_tokens=budget, stop=STOP, seed=params.seed + 7919 * turn
        )
        for state, completion in zip(group, engine.generate(prompts, turn_params), strict=True):
            text = state.partial + completion.text
            state.partial = ""
            state.messages.append({"role": "assistant", "content": text})
            state.tokens += completion.num_tokens
            state.turn_token_ids.append(list(completion.token_ids))
            state.turns += 1
            code = last_code_block(text)
            if completion.finish_reason == "length":
                capped = budget < limits.max_turn_tokens
                state.finish_reason = "total_token_cap" if capped else "turn_token_cap"
            elif is_final_turn(state.problem, text):
                state.finish_reason = "answer"
            elif code is None:
                state.finish_reason = "eos"
            else:
                to_run.append((state, code))
    return to_run


class _CellRunner:
    """Runs each wave's cell batch on a thread of its own, one batch at a time (in the order
    started), and hands its outputs to the trajectories when the wave's next turn asks."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.pool = WorkerPool(sandbox)
        # Ours for every batch: cancelled, it stops a batch whether or not it has started.
        self._token = CancelToken()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cells")
        self._running: dict[int, tuple[list[tuple[_State, str]], Future]] = {}

    def __enter__(self) -> _CellRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    def start(self, wave: int, to_run: list[tuple[_State, str]], programs: list[Program]) -> None:
        if to_run:
            batch = self._thread.submit(self.pool.run, programs, cancel=self._token)
            self._running[wave] = (to_run, batch)

    def finish(self, wave: int) -> None:
        """Wait for the wave's cells, then append their outputs to its trajectories."""
        if wave not in self._running:
            return
        to_run, batch = self._running.pop(wave)
        # in short slices, so that the caller's interrupts get through (as WorkerPool.run)
        while not futures.wait([batch], timeout=POLL_SECONDS).done:
            pass
        for (state, code), result in zip(to_run, batch.result(), strict=True):
            if state.session is None:  # it re-ran every cell so far
                state.rerun_seconds = result.duration
            state.cells.append(code)
            state.tool_status.append(result.status)
            state.messages.append(output_turn(result.output))

    def finish_all(self) -> None:
        for wave in sorted(self._running):
            self.finish(wave)

    def cancel(self) -> None:
        """Stop what still runs (on an exception) and return once no sandbox of it is left."""
        self._token.cancel()
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._running.clear()
        self._token.close()


def _cell_programs(
    to_run: list[tuple[_State, str]], sandbox, states: list[_State], limits: RolloutSettings
) -> list[Program]:
    """Each cell's program: the cell after its trajectory's earlier ones re-run, or the
    cell in the trajectory's session, opened here where a session pays (see needs_session)."""
    open_sessions = sum(state.session is not None for state in states)
    cap = session_cap(sandbox)
    programs = []
    for state, code in to_run:
        if state.session is None and open_sessions < cap and needs_session(state, limits):
            state.session = sandbox.session(state.cells)
            open_sessions += 1
        if state.session is not None:
            programs.append(Program(code, session=state.session))
        else:
            programs.append(Program(program_with_history(state.cells, code)))
    return programs


def needs_session(state: _State, limits: RolloutSettings) -> bool:
    """Whether the trajectory's next cell should open a session: its first cell there re-runs
    the history as the program would (plus the opening), so it pays from the cell after on,
    which must be possible (a turn left), and only if re-running costs more than opening."""
    has_later_turn = state.turns < limits.max_turns
    return bool(state.cells) and has_later_turn and state.rerun_seconds > SESSION_OPEN_SECONDS


def session_cap(sandbox: Sandbox) -> int:
    """Sessions open at once, at most: MAX_SESSIONS, fewer where their descriptors would pass
    our soft RLIMIT_NOFILE, or where their memory (memory_mb each, held between cells too) and
    that of the pool's running workers would pass the sandbox's pool_memory_mb."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = MAX_SESSIONS
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft // _DESCRIPTORS_PER_SESSION)
    if sandbox.pool_memory_mb:
        sessions_memory = sandbox.pool_memory_mb // sandbox.limits.memory_mb - sandbox.workers
        cap = min(cap, max(0, sessions_memory))
    return cap


def _close_sessions(states: list[_State]) -> None:
    """Close each one's session, all of them even if one's close() raises (then re-raised)."""
    with contextlib.ExitStack() as closing:
        for state in states:
            if state.session is not None:
                closing.callback(state.session.close)
                state.session = None


def _row(state: _State, final: str | None, correct: bool, policy: str, decoding: str) -> dict:
    return {
        "problem_id": state.problem["id"],
        "task": state.problem["task"],
        "sample": state.sample,
        "messages": state.messages,
        "final_answer": final,
        "correct": correct,
        "finish_reason": state.finish_reason,
        "num_turns": state.turns,
        "num_tokens": state.tokens,
        "tool_status": state.tool_status,
        "turn_token_ids": state.turn_token_ids,
        "decoding": decoding,
        "policy": policy,
    }
