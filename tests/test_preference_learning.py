"""Learning tests of issues 17 and 18 at CI size: the easy-to-frontier curriculum of
docs/experiment-design.md ("A CI-sized frontier") with the stage functions the rules run.

SFT learns the easy band (config/test.yaml's arith: 1-2 operations, operands <= 20) plus a
small share (9 %) of the frontier band (3 operations), with config.yaml's policy size. The
methods then work on the frontier band's own prompt pools (one per consumer, disjoint from
SFT's problems, from each other and from the test splits), and each is compared with its
start on the frontier band's 400 held-out test problems: paired bootstrap CI and exact
McNemar p, Holm-adjusted over the comparisons of this file, with the easy band's cost
declared as a non-inferiority comparison beside the gain. PPO rewarded by the verifier
(issue 18's sanity check of the PPO machinery) is one more method on the same start. The
default's reward models and search (best-of-16 reranked by the PRM and the ORM against the
vote, HGS-PRM against greedy decoding) and PF-PPO (BR) against PPO-S, both rewarded by the
default's BT-RM (config/tables.yaml's pfppo_vs_ppo_s at this size), join the same Holm
family; at this scale they are nulls, each a strict xfail with its numbers, so a method that
starts to pay off fails it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import yaml
from side_by_side import SideBySide

from reasonrl.config import validate_config
from reasonrl.io import read_jsonl
from reasonrl.models import build_tiny_policy
from reasonrl.stages.data import make_data, make_pool
from reasonrl.stages.evaluate import evaluate
from reasonrl.stages.models import corpus_texts
from reasonrl.stages.preference import augment_prompts as run_augment
from reasonrl.stages.preference import label_preferences as run_labelling
from reasonrl.stages.preference import preference_train as run_training
from reasonrl.stages.preference import reference_logps as run_reference
from reasonrl.stages.preference import sample_round as run_sampling
from reasonrl.stages.report import search_scores
from reasonrl.stages.reward_models import (
    annotate_prm,
    best_of_n,
    hgs_search,
    sample_rm_data,
    train_reward_model,
)
from reasonrl.stages.sft import sft as run_sft
from reasonrl.stats.calibration import sampled_outcomes
from reasonrl.stats.comparisons import SEARCH_METRIC, compare, greedy_correct, holm, same_problems

# A module fixture's set-up counts against the first test that asks for it. One after another
# in this process, the two 900-step SFT runs took 861 s in a clean-clone CI run (pytest-timeout's
# 900 s default stopped them there on 2026-11-26) and the methods and reward models behind
# `comparisons` 953-1151 s; side by side (LearningRuns) 731 s and 809 s on an idle machine
# (2026-11-28), with the same numbers (every greedy pass@1 equal). Every test below the first
# waits on `comparisons`, i.e. on every method run, so the second test's set-up is the whole
# method phase; beside the rest of the suite it took 1539 s in the CI of 2026-11-29 and passed
# 2400 s in the CI of stop 50 (the rest had grown by the unprivileged lane: the lane's set-up
# timed out 4443 s in, every method's result cached as that error). The timeout guards against
# a hang, not a slow machine: 4800 s lets the lane finish within CI's 90 minutes.
LEARNING_TIMEOUT = 4800
pytestmark = [pytest.mark.learning, pytest.mark.timeout(LEARNING_TIMEOUT)]

REPO = Path(__file__).resolve().parents[1]
EASY, FRONTIER = "arith", "arith3"
COPY_SEEDS = (0, 1)  # item 0: the SFT start learns to copy numbers for each of these
METHOD_SEED = 0  # the start both methods train from
# Online DPO (asynchronous RLHF paper): fresh samples every step, best vs worst of K by the
# verifier, the SFT policy as the fixed reference, async mode, on its own prompt pool.
ONLINE = {"steps": 32, "prompts_per_step": 16, "samples_per_prompt": 4, "lr": 1.0e-5}
# The non-inferiority margin of the claims that a method costs little: each method's cost on
# the easy band, and async_vs_sync (async reward >= sync's, less the margin).
NONINFERIORITY_MARGIN = 0.03
# Where the methods' start lands depends on the CPU's float kernels (reasonrl.manifest): the
# record's 0.730 came from machines before 2026-12-04; CI's machine and this one (AMD EPYC,
# AVX2) train the same seed-0 start to 0.772, from which three of the file's gains are nulls
# (docs/experiment-design.md, "The start moves with the CPU").
START_ON_AVX2 = (
    "on torch's and MKL's AVX2 kernels (AMD EPYC, CI of 2026-12-04) the seed-0 start is 0.772 "
    "on the frontier, not the record's 0.730; "
)


def learning_config(seed: int) -> dict:
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    test = yaml.safe_load((REPO / "config/test.yaml").read_text())
    overrides = {
        "seed": seed,
        # test.yaml's policy does not learn to copy numbers in any CI budget (experiment design,
        # item 0); config.yaml's does in 600 steps.
        "policy": {"tiny": base["policy"]["tiny"]},
        "sft": {
            "tasks": [EASY, FRONTIER],
            "variants": ["tool"],
            "max_steps": 900,
            "batch_size": 16,
            "lr": 0.001,
        },
        "evaluation": {"n_samples": 0},
        # a 3-operation program's turn is longer than test.yaml's 96-token cap allows
        "rollout": {"max_turns": 2, "max_turn_tokens": 128, "max_total_tokens": 256},
        "generation": {"batch_size": 64},
        # the default's PPO and reward models as its DAG runs them (test.yaml names no PPO
        # variant and trains its reward models on arith)
        "ppo": base["ppo"],
        "reward_models": base["reward_models"],
        # test.yaml's name arith's best-of-N; this file declares its own (`comparisons`)
        "comparisons": {"declared": []},
        "preference": {
            "task": FRONTIER,
            "prompts": {
                "rephrase": "none",
                "backward_fraction": 0.0,
                "per_round": 400,
                "selection_size": 1,
            },
            "sampling": {"temperature": 0.7, "latest": 8, "previous": 0},
            "train": {"lr": 1.0e-5},
        },
    }
    config = _merge(_merge(base, test), overrides)
    frontier = {"kind": "arith", "min_ops": 3, "max_ops": 3, "max_operand": 20}
    config["tasks"] = {
        EASY: {**test["tasks"]["arith"], "test_size": 200},
        FRONTIER: {
            **frontier,
            "train_size": 100,
            "test_size": 400,
            # ppo and reward_models are drawn after the other pools, so adding them changed none
            # of those drawn before
            "pools": {"preference": 460, "online_dpo": 300, "ppo": 300, "reward_models": 100},
        },
    }
    return validate_config(config)


def _merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def greedy_eval(config: dict, root: Path, policy: str, task: str) -> dict:
    problems = root / "data" / task / "test.jsonl"
    out = root / f"eval-{policy}-{task}"
    metrics = evaluate(config, str(root / policy), "tool", task, str(problems), policy, str(out))
    return {**metrics, "scores": greedy_correct(str(out / "trajectories.jsonl"))}


def train_start(seed: int, root: Path, bands: tuple[str, ...]) -> dict:
    """The SFT tool policy of `seed` in `root`, with its greedy evaluations on `bands`."""
    config = learning_config(seed)
    for task in (EASY, FRONTIER):
        make_data(config, task, str(root / "data" / task))
    train = [str(root / "data" / task / "train.jsonl") for task in (EASY, FRONTIER)]
    tiny = config["policy"]["tiny"]
    build_tiny_policy(corpus_texts(train), tiny, seed, root / "base")
    run_sft(config, "tool", str(root / "base"), train, str(root / "sft"))
    evals = {task: greedy_eval(config, root, "sft", task) for task in bands}
    return {"root": root, "config": config, "eval": evals}


# The bands each SFT start is evaluated on: the methods' start is compared on both, the other
# start only shows it learned to copy numbers (the easy band).
START_BANDS = {**{seed: (EASY,) for seed in COPY_SEEDS}, METHOD_SEED: (EASY, FRONTIER)}


class LearningRuns:
    """The file's runs side by side (tests/side_by_side.py): both SFT starts at once, then
    each method's run from the seed-0 start as workers come free (_submit_methods says in
    which order). Each run is the stage functions the DAG's rules call, in its own folders."""

    def __init__(self, pool: SideBySide, tmp_path_factory) -> None:
        self._pool = pool
        self._starts = {
            seed: pool.submit(
                train_start, seed, tmp_path_factory.mktemp(f"start{seed}"), START_BANDS[seed]
            )
            for seed in COPY_SEEDS
        }
        self._methods: dict[str, Future] = {}

    def start(self, seed: int) -> dict:
        start = self._starts[seed].result()
        if seed == METHOD_SEED and not self._methods:
            self._submit_methods(start)
        return start

    def method(self, name: str) -> dict:
        self.start(METHOD_SEED)
        return self._methods[name].result()

    def _submit_methods(self, start: dict) -> None:
        # Pools read by several runs are made once, before any of them starts: both online
        # runs read the online pool, the three PPO runs the ppo pool.
        config, root = start["config"], start["root"]
        make_pool(config, FRONTIER, "online_dpo", str(root / "pool-online"))
        make_pool(config, FRONTIER, "ppo", str(root / "pool-ppo"))
        submit = self._pool.submit
        # The short BT-RM run first: the two PF-PPO runs (rewarded by its BT-RM), among the
        # longest, and the other reward models (their search ranks with it too) wait for it,
        # then queue behind the runs without a dependency, the longest first; so no run is
        # left alone on the machine for long at the end.
        bt = submit(bt_rm_run, start)
        self._methods = {
            "rm-bt": bt,
            "ppo": submit(ppo_training, start),
            "preference": submit(preference_rounds, start),
            # async_vs_sync compares the frontier only
            "online-async": submit(online_training, start, "async", (EASY, FRONTIER)),
            "online-sync": submit(online_training, start, "sync", (FRONTIER,)),
        }
        after_bt = [(rm_ppo_training, start, name) for name in RM_PPO_VARIANTS]
        after_bt.append((reward_model_runs, start))
        names = [*(f"ppo-{name}" for name in RM_PPO_VARIANTS), "reward_models"]
        self._methods |= dict(zip(names, self._after(bt, after_bt), strict=True))

    def _after(self, first: Future, jobs: list[tuple]) -> list[Future]:
        """The futures of `jobs` (each a function and its arguments), submitted to the pool in
        their order once `first` has succeeded (or `first`'s exception). A thread waits for
        `first`: the pool takes jobs from this process's threads, not from its own callbacks'
        thread."""
        chained: list[Future] = [Future() for _ in jobs]

        def submit_when_ready() -> None:
            try:
                first.result()
                started = [self._pool.submit(*job) for job in jobs]
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits
                for future in chained:
                    future.set_exception(error)
                return
            for future, job in zip(chained, started, strict=True):
                _chain(job, future)

        threading.Thread(target=submit_when_ready, daemon=True).start()
        return chained


def _chain(source: Future, target: Future) -> None:
    """`target` takes `source`'s result or exception when `source` is done."""

    def copy(done: Future) -> None:
        if done.cancelled():  # the pool closed before it started
            target.cancel()
            return
        error = done.exception()
        if error is None:
            target.set_result(done.result())
        else:
            target.set_exception(error)

    source.add_done_callback(copy)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[LearningRuns]:
    # Three workers on two cores: the method runs (2026-11-29, three at a time beside other
    # tests: the BT-RM's samples and training 270 s, the other reward models and their
    # search 450 s, online DPO 310-370 s, PF-PPO and PPO-S 425 s, M-DPO with M-KTO 610 s, PPO
    # 700 s) leave less of the end to one worker alone than two workers would.
    pool = SideBySide(workers=3)
    try:
        yield LearningRuns(pool, tmp_path_factory)
    finally:
        pool.close()


def test_sft_learns_to_copy_numbers_for_two_seeds(runs):
    # Measured at 900 steps (2026-11-26): copy accuracy 1.000 / 0.998, greedy pass@1 1.000 /
    # 0.985 for seeds 0 / 1. At 600 steps seed 1 copied 0.836 (mid-transition), which is why
    # SFT runs 900 (docs/experiment-design.md, "A CI-sized frontier").
    for seed in COPY_SEEDS:
        easy = runs.start(seed)["eval"][EASY]
        assert easy["copy_accuracy"] >= 0.95, f"seed {seed}: {easy['copy_accuracy']:.3f}"
        assert easy["greedy_pass@1"] >= 0.9, f"seed {seed}: {easy['greedy_pass@1']:.3f}"


def preference_rounds(start: dict) -> dict:
    """One M-DPO round from the start, then one M-KTO round on its labels."""
    mdpo = mdpo_round(start)
    return {"mdpo": mdpo, "mkto": mkto_round(start)}


def mdpo_round(start: dict) -> dict:
    root, config = start["root"], start["config"]
    make_pool(config, FRONTIER, "preference", str(root / "pool-preference"))
    tests = {task: str(root / "data" / task / "test.jsonl") for task in (EASY, FRONTIER)}
    pool = str(root / "pool-preference/problems.jsonl")
    run_augment(config, FRONTIER, pool, tests, 1, str(root / "prompts"))
    samplers = [("sft-tool", str(root / "sft"), 8)]
    run_sampling(config, str(root / "prompts/round1.jsonl"), samplers, 1, str(root / "samples"))
    labels = run_labelling(config, str(root / "samples/samples.jsonl"), 1, str(root / "labels"))
    run_reference(config, "mdpo", str(root / "sft"), str(root / "labels"), str(root / "ref.jsonl"))
    run_training(
        config, "mdpo", str(root / "sft"), str(root / "labels"), str(root / "ref.jsonl"),
        str(root / "mdpo"),
    )  # fmt: skip
    return {
        "pairs": labels["pairs"],
        "headroom": headroom(root / "samples/samples.jsonl"),
        "eval": {task: greedy_eval(config, root, "mdpo", task) for task in (EASY, FRONTIER)},
    }


def mkto_round(start: dict) -> dict:
    """One M-KTO round on the M-DPO round's labels (KTO's unpaired rows: each pair's winner,
    desirable, and loser, undesirable), with the M-DPO round's settings: the same lr, epochs
    and batch size, no tuning of its own."""
    root = start["root"]
    preference = start["config"]["preference"]
    variants = [*preference["variants"], {"name": "mkto", "loss": "mkto", "rounds": 1}]
    config = validate_config(
        {**start["config"], "preference": {**preference, "variants": variants}}
    )
    labels, sft = str(root / "labels"), str(root / "sft")
    run_reference(config, "mkto", sft, labels, str(root / "ref-mkto.jsonl"))
    metrics = run_training(
        config, "mkto", sft, labels, str(root / "ref-mkto.jsonl"), str(root / "mkto")
    )
    return {
        "rows": metrics["rows"],
        "history": metrics["history"],
        "eval": {task: greedy_eval(config, root, "mkto", task) for task in (EASY, FRONTIER)},
    }


def headroom(samples_path: Path) -> dict:
    """pass@k and the share of prompts with both a right and a wrong sample."""
    outcomes = sampled_outcomes(read_jsonl(samples_path, schema="trajectory"))
    solved = [any(o) for o in outcomes]
    mixed = [any(o) and not all(o) for o in outcomes]
    return {"pass@k": sum(solved) / len(solved), "mixed": sum(mixed) / len(mixed)}


def online_training(start: dict, mode: str, bands: tuple[str, ...]) -> dict:
    """One online DPO run of ONLINE from the start, in `mode` (sync or async), and its
    greedy evaluations on `bands`."""
    from reasonrl.stages.online_dpo import online_dpo as run_online

    root = start["root"]
    pool = root / "pool-online"  # made by LearningRuns, before both runs start
    variant = {"name": mode, "mode": mode, "loss": "dpo", "off_policy": 1}
    online = {**ONLINE, "task": FRONTIER, "temperature": 0.7, "variants": [variant]}
    config = validate_config({**start["config"], "online_dpo": online})
    name = f"online-{mode}"
    metrics = run_online(
        config, mode, str(root / "sft"), str(pool / "problems.jsonl"), "tool", 2, str(root / name)
    )
    return {
        "history": metrics["history"],
        "wall_seconds": metrics["wall_seconds"],
        "eval": {task: greedy_eval(config, root, name, task) for task in bands},
    }


def ppo_training(start: dict) -> dict:
    """PPO rewarded by the verifier (issue 18's sanity check of the PPO machinery), the
    default's ppo section: PPO-M, 12 iterations of 16 prompts x 4 samples at T 0.7, lr 1e-5,
    on the frontier's own ppo pool; the best iteration by greedy pass@1 on the pool's last
    100 prompts, which PPO does not train on."""
    from reasonrl.stages.ppo import ppo as run_ppo

    root, config = start["root"], start["config"]
    [variant] = config["ppo"]["variants"]
    pool = str(root / "pool-ppo/problems.jsonl")
    metrics = run_ppo(config, variant["name"], str(root / "sft"), None, pool, str(root / "ppo"))
    return {"metrics": metrics, "eval": {FRONTIER: greedy_eval(config, root, "ppo", FRONTIER)}}


# PF-PPO against PPO-S (config/tables.yaml's pfppo_vs_ppo_s) at this file's size: its
# variants' filters, each rewarded by the default's BT-RM (bt_rm_run's).
RM_PPO_VARIANTS = {"s": "ppo-s", "br": "br"}


def rm_ppo_training(start: dict, name: str) -> dict:
    """PPO of RM_PPO_VARIANTS' `name` rewarded by the BT-RM of `bt_rm_run`, with the
    verifier-rewarded run's settings otherwise (the default's ppo section: the same pool,
    iterations, samples, lr and selection of the best iteration), and its greedy evaluation
    on the frontier."""
    from reasonrl.stages.ppo import ppo as run_ppo

    root = start["root"]
    variants = [{"name": name, "filter": RM_PPO_VARIANTS[name]}]
    ppo = {**start["config"]["ppo"], "reward": "rm", "variants": variants}
    config = validate_config({**start["config"], "ppo": ppo})
    pool, out = str(root / "pool-ppo/problems.jsonl"), f"ppo-{name}"
    metrics = run_ppo(config, name, str(root / "sft"), str(root / "rm-bt"), pool, str(root / out))
    return {"metrics": metrics, "eval": {FRONTIER: greedy_eval(config, root, out, FRONTIER)}}


# Issue 18's search comparisons as config.yaml declares them: arm a, arm b (search arms).
SEARCH_COMPARISONS = {
    "prm_vs_maj": ("bon:prm-min@16", "bon:maj@16"),
    "orm_vs_maj": ("bon:orm@16", "bon:maj@16"),
    "hgs_vs_greedy": ("hgs", "bon:greedy"),
}


# The default's reward models (config.yaml's reward_models section: 100 prompts x 5 samples at
# T 0.7, Math-Shepherd labels from 4 completions per step of one solution per prompt, 40 steps
# each) from the seed-0 start on the frontier's own reward_models pool, in two runs: the
# samples and the BT-RM first, which the PF-PPO runs wait for; then the PRM and ORM, and the
# search with all three as the default DAG runs it.
RM_KINDS = ("bt", "orm", "prm")


def _rm_paths(root: Path) -> dict[str, str]:
    return {
        "pool": str(root / "pool-rm/problems.jsonl"),
        "sft": str(root / "sft"),
        "samples": str(root / "rm-samples/samples.jsonl"),
        **{kind: str(root / f"rm-{kind}") for kind in RM_KINDS},
    }


def bt_rm_run(start: dict) -> dict:
    """The reward models' samples of the frontier's reward_models pool, and the BT-RM on them."""
    root, config = start["root"], start["config"]
    make_pool(config, FRONTIER, "reward_models", str(root / "pool-rm"))
    paths = _rm_paths(root)
    sampled = sample_rm_data(config, paths["sft"], paths["pool"], str(root / "rm-samples"))
    trained = train_reward_model(
        config, "bt", paths["sft"], paths["pool"], paths["samples"], paths["bt"]
    )
    return {"sampled": sampled, "trained": trained}


def reward_model_runs(start: dict) -> dict:
    """After `bt_rm_run`: Math-Shepherd labels, the PRM and the ORM; best-of-16 on the first
    100 frontier test problems and HGS-PRM on the first 30, as the default DAG runs them."""
    root, config = start["root"], start["config"]
    paths = _rm_paths(root)
    pool, sft, samples = paths["pool"], paths["sft"], paths["samples"]
    shepherd = annotate_prm(config, sft, pool, samples, str(root / "rm-shepherd"))
    data = {"orm": samples, "prm": str(root / "rm-shepherd/prm.jsonl")}
    trained = {
        kind: train_reward_model(config, kind, sft, pool, data[kind], paths[kind]) for kind in data
    }
    models = {kind: paths[kind] for kind in RM_KINDS}
    test = str(root / "data" / FRONTIER / "test.jsonl")
    table = best_of_n(config, sft, test, models, str(root / "bon"))
    hgs_search(config, sft, models["prm"], test, str(root / "bon"), str(root / "hgs"))
    folders = {f"{FRONTIER}/best-of-n": str(root / "bon"), f"{FRONTIER}/hgs": str(root / "hgs")}
    declared = [{"a": a, "b": b, "task": FRONTIER} for a, b in SEARCH_COMPARISONS.values()]
    scores = {arm: arm_scores for (_, arm), arm_scores in search_scores(declared, folders).items()}
    return {"shepherd": shepherd, "trained": trained, "table": table, "scores": scores}


def search_rows(scores: dict[str, dict[str, float]]) -> list[dict]:
    """SEARCH_COMPARISONS' rows, each arm pair on the problems of the smaller (HGS-PRM runs
    on the first 30 of best-of-N's 100)."""
    return [
        compare(name, SEARCH_METRIC, a, b, *same_problems(scores[a], scores[b]))
        for name, (a, b) in SEARCH_COMPARISONS.items()
    ]


@pytest.fixture(scope="module")
def mdpo_run(runs) -> dict:
    return runs.method("preference")["mdpo"]


@pytest.fixture(scope="module")
def mkto_run(runs) -> dict:
    return runs.method("preference")["mkto"]


@pytest.fixture(scope="module")
def online_run(runs) -> dict:
    return runs.method("online-async")


@pytest.fixture(scope="module")
def online_sync_run(runs) -> dict:
    """The same run with generation and learning taking turns: the baseline async must match."""
    return runs.method("online-sync")


@pytest.fixture(scope="module")
def ppo_run(runs) -> dict:
    return runs.method("ppo")


@pytest.fixture(scope="module")
def rm_run(runs) -> dict:
    bt, rest = runs.method("rm-bt"), runs.method("reward_models")
    return {**rest, "sampled": bt["sampled"], "trained": {"bt": bt["trained"], **rest["trained"]}}


@pytest.fixture(scope="module")
def rm_ppo_runs(runs) -> dict[str, dict]:
    return {name: runs.method(f"ppo-{name}") for name in RM_PPO_VARIANTS}


@pytest.fixture(scope="module")
def comparisons(
    runs, mdpo_run, mkto_run, online_run, online_sync_run, ppo_run, rm_run, rm_ppo_runs
) -> dict[str, dict]:
    """The file's pre-registered comparisons, Holm-adjusted together."""
    start = runs.start(METHOD_SEED)["eval"]
    arms = {"mdpo": mdpo_run["eval"], "mkto": mkto_run["eval"], "online": online_run["eval"]}
    rows = [
        compare(f"{arm}_vs_sft", "greedy_pass@1", arm, "sft", arms[arm][FRONTIER]["scores"],
                start[FRONTIER]["scores"])
        for arm in arms
    ]  # fmt: skip
    rows.append(
        compare("ppo_oracle_vs_sft", "greedy_pass@1", "ppo-oracle", "sft",
                ppo_run["eval"][FRONTIER]["scores"], start[FRONTIER]["scores"])
    )  # fmt: skip
    rows += [
        compare(f"{arm}_easy_cost", "greedy_pass@1", arm, "sft", arms[arm][EASY]["scores"],
                start[EASY]["scores"], margin=NONINFERIORITY_MARGIN)
        for arm in arms
    ]  # fmt: skip
    # The asynchronous RLHF paper's claim: one step off-policy costs no reward against sync.
    rows.append(
        compare("async_vs_sync", "greedy_pass@1", "online-async", "online-sync",
                online_run["eval"][FRONTIER]["scores"], online_sync_run["eval"][FRONTIER]["scores"],
                margin=NONINFERIORITY_MARGIN)
    )  # fmt: skip
    rows += search_rows(rm_run["scores"])
    rows.append(
        compare("pfppo_vs_ppo_s", "greedy_pass@1", "pfppo-br", "ppo-s",
                rm_ppo_runs["br"]["eval"][FRONTIER]["scores"],
                rm_ppo_runs["s"]["eval"][FRONTIER]["scores"])
    )  # fmt: skip
    return {row["name"]: row for row in holm(rows)}


def verdict(row: dict) -> str:
    return (
        f"{row['name']}: {row['value_a']:.3f} vs {row['value_b']:.3f}, diff {row['diff']:+.3f} "
        f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], p_holm {row['p_holm']:.2g}"
    )


def assert_gain(row: dict) -> None:
    """The pre-registered claim that arm a beats arm b: the paired CI above 0 and Holm's p
    under 0.05."""
    assert row["ci_low"] > 0 and row["p_holm"] < 0.05, verdict(row)


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason=START_ON_AVX2 + "its round's 8 samples are mixed on 0.187 of the prompts (pass@8 "
    "0.837), under the pre-registered 0.2 headroom gate; mdpo_vs_sft itself [+0.010, +0.048]",
)
def test_one_mdpo_round_beats_its_sft_start_on_the_frontier(mdpo_run, comparisons):
    # Measured (2026-11-26): 375 prompts, pass@8 0.765, mixed share 0.24, 90 pairs; frontier
    # 0.730 -> 0.808, +0.078 [+0.048, +0.108], p_holm 1e-6 (power 1.00); easy 1.000 -> 0.995.
    # The 600-step pilot over three SFT seeds: +0.068, +0.043, +0.065, every CI above 0.
    assert mdpo_run["headroom"]["mixed"] >= 0.2, f"no headroom: {mdpo_run['headroom']}"
    assert mdpo_run["pairs"] >= 50, "the round must find pairs to learn from"
    assert_gain(comparisons["mdpo_vs_sft"])
    cost = comparisons["mdpo_easy_cost"]
    assert cost["p_holm"] < 0.05, verdict(cost)


def test_one_mkto_round_beats_its_sft_start_on_the_frontier(mkto_run, comparisons):
    # Measured (2026-11-27) on this file's seed-0 start and labels: 45 steps on 180 unpaired
    # rows; frontier 0.730 -> 0.833, +0.103 [+0.068, +0.140], p 3e-8 (power 1.00); easy 1.000
    # -> 0.990, non-inferior at 0.03 (p 0.003). The pilot on three 600-step SFT seeds, with
    # the M-DPO round's settings: +0.105, +0.058, +0.080, every CI above 0
    # (docs/experiment-design.md, "M-KTO on the frontier").
    assert mkto_run["rows"] >= 100, "the round must have desirable and undesirable rows"
    losses = [h["loss"] for h in mkto_run["history"]]
    assert sum(losses[-5:]) < sum(losses[:5]), "the KTO loss must fall"
    assert_gain(comparisons["mkto_vs_sft"])
    cost = comparisons["mkto_easy_cost"]
    assert cost["p_holm"] < 0.05, verdict(cost)


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason=START_ON_AVX2 + "from it online DPO 0.795 vs 0.772, +0.022 [+0.005, +0.043], "
    "p_holm 0.21: a gain that does not survive Holm over the file's 12 comparisons",
)
def test_online_dpo_beats_its_sft_start_on_the_frontier(online_run, comparisons):
    # Measured (2026-11-26): 78 pairs, last KL 0.05; frontier 0.730 -> 0.783, +0.053 [+0.030,
    # +0.078], p_holm 5e-5 (power 0.99); easy 1.000 -> 1.000. The 600-step pilot over three
    # SFT seeds: +0.038, +0.030 (p 0.050), +0.040.
    assert sum(h["pairs"] for h in online_run["history"]) >= 64, "the run must find pairs"
    assert_gain(comparisons["online_vs_sft"])
    cost = comparisons["online_easy_cost"]
    assert cost["p_holm"] < 0.05, verdict(cost)


def test_async_online_dpo_matches_sync_on_the_frontier(online_run, online_sync_run, comparisons):
    # Measured (2026-11-27): 78 / 76 pairs; frontier async 0.782, sync 0.782, +0.000 [-0.007,
    # +0.007], p_holm 1e-15; wall-clock 117 s async, 143 s sync. The pilot over three SFT
    # seeds: +0.000, -0.005, -0.005, each non-inferior at p <= 3e-5
    # (docs/experiment-design.md, "async online DPO against sync"). The wall-clocks are
    # reported, not asserted: the speedup is bench/'s ratio (BENCHMARKS.md).
    walls = (
        f"wall-clock async {online_run['wall_seconds']:.0f} s,"
        f" sync {online_sync_run['wall_seconds']:.0f} s"
    )
    for run in (online_run, online_sync_run):
        assert sum(h["pairs"] for h in run["history"]) >= 64, "each run must find pairs"
    same = comparisons["async_vs_sync"]
    assert same["ci_low"] > -NONINFERIORITY_MARGIN and same["p_holm"] < 0.05, (
        f"{verdict(same)}; {walls}"
    )


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason=START_ON_AVX2 + "from it PPO 0.787 vs 0.772, +0.015 [+0.003, +0.030], p_holm 0.29: "
    "a gain that does not survive Holm over the file's 12 comparisons",
)
def test_ppo_with_the_verifier_reward_beats_its_sft_start_on_the_frontier(ppo_run, comparisons):
    # Measured (2026-11-27): best iteration 2 (selection 0.70 -> 0.74), clip fraction at most
    # 0.006, KL to the start at most 0.53; frontier 0.730 -> 0.7675, +0.0375 [+0.0125,
    # +0.0625], p 0.006 (power 0.80); p_holm 0.03 over this file's twelve comparisons
    # (2026-11-29; 0.006 over the eight before the search and PF-PPO comparisons joined the
    # family). The pilot's PPO seeds
    # 1 and 2 from this start: +0.028 each, p 0.07 and 0.08 (docs/experiment-design.md, "PPO
    # rewarded by the verifier beats its SFT start").
    history = ppo_run["metrics"]["history"]
    assert max(h["clip_fraction"] for h in history) < 0.2, (
        "the updates must stay in the trust region"
    )
    assert_gain(comparisons["ppo_oracle_vs_sft"])


def test_reward_models_learn_from_the_frontier_pool_and_leave_the_vote_headroom(rm_run):
    """What the three search comparisons below stand on: real reward-model data, both
    Math-Shepherd labels, and best-of-16 samples a reranker could pick better from than the
    vote (pass@16 above maj@16)."""
    # Measured (2026-11-27): 500 samples (accuracy 0.694), labels 135 "+" / 65 "-", pass@16
    # 0.78 against maj@16 0.72 and greedy 0.70 on the first 100 frontier test problems.
    assert rm_run["sampled"]["samples"] == 500, rm_run["sampled"]
    labels = rm_run["shepherd"]["labels"]
    assert labels.get("+", 0) > 0 and labels.get("-", 0) > 0, labels
    rows = {row["method"]: row["accuracy"] for row in rm_run["table"]["rows"] if row["N"] == 16}
    assert rows["pass@N"] > rows["maj@N"] + 0.05, rows


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: prm-min@16 0.65 vs maj@16 0.72 on 100 problems, -0.07 "
    "[-0.14, 0.00], p 0.09, p_holm 0.28 (2026-11-27); the PRM calls every held-out step '+'",
)
def test_best_of_16_by_the_prm_beats_majority_vote_on_the_frontier(rm_run, comparisons):
    # Measured (2026-11-27): 200 Math-Shepherd steps of 100 solutions (2 per solution: the
    # program and the answer), "-" precision 0.91 and recall 1.00 against the steps' exact
    # correctness; the PRM after 40 steps predicts "+" for all 20 held-out steps. 13 % of the
    # problems are discordant (3 PRM-only, 10 vote-only): McNemar has 80 % power there only for
    # a gain of 0.105, and a +0.05 gain would need about 500 problems.
    assert_gain(comparisons["prm_vs_maj"])


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: orm@16 0.67 vs maj@16 0.72 on 100 problems, -0.05 "
    "[-0.10, 0.00], p 0.12, p_holm 0.28 (2026-11-27)",
)
def test_best_of_16_by_the_orm_beats_majority_vote_on_the_frontier(rm_run, comparisons):
    # Measured (2026-11-27): ORM held-out accuracy 0.66 on 50 solutions; 7 % of the problems
    # discordant (1 ORM-only, 6 vote-only), too few for any gain to reach 80 % power on 100
    # problems; a +0.05 gain at that discordance would need about 300.
    assert_gain(comparisons["orm_vs_maj"])


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: HGS-PRM 0.833 = greedy 0.833 on 30 problems, no discordant "
    "problem (2026-11-27); the PRM accepts every step, so HGS never backtracks",
)
def test_hgs_prm_beats_greedy_decoding_on_the_frontier(rm_run, comparisons):
    # Measured (2026-11-27): 2 policy calls per problem (the program, the answer), 0
    # backtracks; the compute-matched sample (1 per problem) is 0.833 too. No problem is
    # discordant, so the test has no power at all at this scale.
    assert_gain(comparisons["hgs_vs_greedy"])


def test_ppo_rewarded_by_the_bt_rm_filters_and_stays_in_its_trust_region(rm_ppo_runs):
    """What pfppo_vs_ppo_s stands on: both variants train on the BT-RM's reward within the
    trust region, PPO-S on one response to each of N x the queries, PF-PPO (BR) on the best
    and a random one of each query's N (the paper's Table 4), whose buffer the RM rates
    above the samples it was drawn from."""
    ppo = learning_config(METHOD_SEED)["ppo"]
    prompts, n = ppo["prompts_per_iteration"], ppo["responses_per_prompt"]
    rows = {"s": prompts * n, "br": prompts * ppo["draws_per_prompt"]}
    for name, run in rm_ppo_runs.items():
        metrics = run["metrics"]
        assert max(h["clip_fraction"] for h in metrics["history"]) < 0.2, name
        assert {it["buffer_rows"] for it in metrics["iterations"]} == {rows[name]}, name
    # Measured (2026-11-29): buffers of 64 (PPO-S) and 32 (BR) rows every iteration; clip
    # fraction at most 0.003, KL to the start at most 0.50 (PPO-S) and 0.13 (BR); BR's buffer
    # rated 1.10 against its samples' 0.97 on average. The RM's reward of the samples rises
    # (PPO-S 0.71 -> 1.42, BR -0.14 -> 1.55) while held-out pass@1 stays at 0.69-0.72.
    filtered = rm_ppo_runs["br"]["metrics"]["iterations"]
    kept, drawn = (sum(it[key] for it in filtered) for key in ("reward_buffer", "reward_sampled"))
    assert kept > drawn, filtered


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: PF-PPO (BR) 0.730 vs PPO-S 0.735 on 400 problems, -0.005 "
    "[-0.020, +0.010], p 0.75, p_holm 1 (2026-11-29); the default's BT-RM (15 pairs) ranks "
    "its 2 held-out pairs wrong, so both optimise a reward that does not track correctness",
)
def test_pf_ppo_beats_ppo_s_with_the_bt_rm_on_the_frontier(rm_ppo_runs, comparisons):
    # Measured (2026-11-29): best iterations 4 and 4 by held-out pass@1 (BR 0.72, PPO-S 0.70;
    # the start 0.70); against the start (0.730) BR +0.000 and PPO-S +0.005. 10 of 400
    # problems discordant (4 BR-only, 6 PPO-S-only): at that discordance McNemar has power
    # 0.15 for a +0.01 gain and 0.67 for +0.02 on 400 problems; +0.01 would need about 1,500.
    # The pilot with an all-pairs BT-RM (R^2 0.18, held-out pair accuracy 0.76) over three PPO
    # seeds: -0.020, 0.000, +0.005 (docs/experiment-design.md, "PF-PPO against PPO-S").
    assert_gain(comparisons["pfppo_vs_ppo_s"])
