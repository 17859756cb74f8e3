"""Experiment config: load YAML/JSON, fill schema defaults, reject unknown keys."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from reasonrl.errors import ReasonRLError
from reasonrl.hub import names_local_path
from reasonrl.io import load_schema


def _fill_defaults(schema: dict, instance: Any) -> Any:
    """Return `instance` with every missing property set to its schema default, recursively."""
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [_fill_defaults(schema["items"], item) for item in instance]
    if not isinstance(instance, dict) or schema.get("type") != "object":
        return instance
    filled = dict(instance)
    for key, sub in schema.get("properties", {}).items():
        if key not in filled and "default" in sub:
            filled[key] = copy.deepcopy(sub["default"])
        if key in filled:
            filled[key] = _fill_defaults(sub, filled[key])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in filled:
            if key not in schema.get("properties", {}):
                filled[key] = _fill_defaults(extra, filled[key])
    return filled


# Keys renamed so that one concept has one name in every method: (section, old) -> (new,
# why). A config with the old name is refused with a pointer to the new one (list indices
# dropped).
KL_NAME = "one name for the KL coefficient in every method"
RENAMED_KEYS = {
    ("preference.variants", "eta"): ("beta", KL_NAME),
    ("ppo", "kl_beta"): ("beta", KL_NAME),
}


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - allowed)
        key = ".".join(filter(None, [where, unknown[0] if unknown else ""]))
        section = ".".join(str(p) for p in error.absolute_path if not isinstance(p, int))
        renamed = RENAMED_KEYS.get((section, unknown[0] if unknown else ""))
        if renamed:
            return f"config key '{key}' is now '{renamed[0]}' ({renamed[1]})"
        hint = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
        return f"unknown config key '{key}'{hint}"
    return f"config key '{where or '<root>'}': {error.message}"


def validate_config(raw: dict | None, source: str = "config", stage: bool = False) -> dict:
    """Validate a config dict against schemas/config.schema.yaml; return it with defaults.

    `stage`: a rule's reduced config (--config-json), where a missing section is one the
    stage does not read, not a default to check others against.
    Raises ReasonRLError with one line naming the offending key.
    """
    schema = load_schema("config")
    filled = _fill_defaults(schema, raw or {})
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(filled), key=lambda e: list(e.absolute_path))
    if errors:
        raise ReasonRLError(f"{source}: {_describe(errors[0])}")
    for name, task in filled["tasks"].items():
        if task["min_ops"] > task["max_ops"]:
            raise ReasonRLError(f"{source}: config key 'tasks.{name}.min_ops' exceeds max_ops")
        if task["min_distractors"] > task["max_distractors"]:
            raise ReasonRLError(
                f"{source}: config key 'tasks.{name}.min_distractors' exceeds max_distractors"
            )
    # Only sections the input gives, and not in a stage's config: it holds at most its own
    # task (the workflow checked the whole config before it reduced it).
    for section in ("sft", "evaluation", "policy"):
        if section not in (raw or {}) or stage:
            continue
        for key, names in _task_lists(section, filled).items():
            for name in names:
                if name not in filled["tasks"]:
                    raise ReasonRLError(
                        f"{source}: config key '{key}' names '{name}', which is not under 'tasks'"
                    )
    _check_sft(filled["sft"], source)
    given = {"tasks", "preference"} <= set(raw or {})
    _check_preference(filled["preference"], filled["tasks"], source, given)
    _check_reward_models(raw or {}, filled, source, stage)
    _check_online(
        filled["online_dpo"], filled["tasks"], source, {"tasks", "online_dpo"} <= set(raw or {})
    )
    _check_ppo(raw or {}, filled, source)
    if not stage:
        _check_start_policies(set(raw or {}), filled, source)
    if "comparisons" in (raw or {}) and not stage:
        _check_comparisons(filled, source)
    if "calibration" in (raw or {}) and not stage:
        _check_calibration(filled, source)
    _check_model_folders(filled, source)
    return filled


def _task_lists(section: str, filled: dict) -> dict[str, list[str]]:
    """The keys of `section` that name tasks -> the names they hold."""
    if section == "policy":
        return {"policy.tiny.tokenizer_tasks": filled["policy"]["tiny"]["tokenizer_tasks"]}
    lists = {f"{section}.tasks": filled[section]["tasks"]}
    if section == "sft":
        lists.update(
            (f"sft.variants.{name}.tasks", policy["tasks"])
            for name, policy in sft_policies(filled).items()
        )
    return lists


# policy.base values a rule of the workflow builds (not a folder or hub id).
BUILT_BASES = ("tiny", "smollm2")
# Task kinds whose problems are programs checked by tests (the others are math, graded by
# their final answer); their PRM data come from mutants, not Math-Shepherd annotation.
CODE_TASK_KINDS = ("pycode", "humaneval", "mbpp")


# reward_models.base values the workflow resolves itself: the start policy's weights, or
# SmolLM2 converted by a rule; any other value is a folder or hub id.
RM_BUILT_BASES = ("policy", "smollm2")
# Names of this workflow's models (the tiny base, a policy's folder under results/models/),
# which reward_models.base cannot name: `policy` starts from the reward models' own policy.
WORKFLOW_MODEL_NAME = re.compile(r"tiny|base|sft-.+|online-.+|ppo-.+|.+-round\d+")


def _check_rm_base(value: str, source: str) -> None:
    if WORKFLOW_MODEL_NAME.fullmatch(value):
        raise ReasonRLError(
            f"{source}: config key 'reward_models.base': '{value}' names a model of this"
            " workflow; use policy (the weights of reward_models.policy), smollm2, a folder"
            " or a hub id"
        )


def _check_model_folders(filled: dict, source: str) -> None:
    """A model value that names a local folder must exist: caught when the config is read
    (the workflow's dry run included), not when the stage that loads it runs."""
    models = {
        "preference.prompts.rephrase_model": filled["preference"]["prompts"]["rephrase_model"]
    }
    if filled["policy"]["base"] not in BUILT_BASES:
        models["policy.base"] = filled["policy"]["base"]
    rm_base = filled["reward_models"]["base"]
    if rm_base not in RM_BUILT_BASES:
        _check_rm_base(rm_base, source)
        models["reward_models.base"] = rm_base
    for key, name in models.items():
        if name and names_local_path(name) and not Path(name).expanduser().is_dir():
            raise ReasonRLError(f"{source}: config key '{key}': model folder '{name}' not found")


def sft_policies(config: dict) -> dict[str, dict]:
    """Each SFT policy's name (its folder is sft-{name}) -> style, tasks, max_steps, and
    own_tasks (whether the entry names its tasks rather than taking sft.tasks).

    A bare style in sft.variants is the policy of that name trained on sft.tasks.
    """
    section = config["sft"]
    policies = {}
    for entry in section["variants"]:
        if isinstance(entry, str):
            entry = {"name": entry, "style": entry}
        policies[entry["name"]] = {
            "style": entry.get("style", "tool"),
            "tasks": entry.get("tasks", section["tasks"]),
            "max_steps": entry.get("max_steps", section["max_steps"]),
            "own_tasks": "tasks" in entry,
        }
    return policies


def _reject_repeat(names: list[str], name: str, key: str, source: str) -> None:
    """The one-line error for a variant list `key` that names `name` twice."""
    if names.count(name) > 1:
        raise ReasonRLError(f"{source}: config key '{key}' repeats '{name}'")


def _check_sft(section: dict, source: str) -> None:
    """SFT policy names unique."""
    names = [e if isinstance(e, str) else e["name"] for e in section["variants"]]
    for name in names:
        _reject_repeat(names, name, "sft.variants", source)


def _check_online(section: dict, tasks: dict, source: str, both_given: bool) -> None:
    """online_dpo variant names unique; steps split into whole generation rounds; micro-batches
    within a step; the prompt task configured (when there are variants to run)."""
    names = [v["name"] for v in section["variants"]]
    micro, prompts = section["micro_batch_prompts"], section["prompts_per_step"]
    if micro is not None and micro > prompts:
        raise ReasonRLError(
            f"{source}: config key 'online_dpo.micro_batch_prompts' ({micro}) is more than"
            f" online_dpo.prompts_per_step ({prompts}), the prompts of a step"
        )
    if both_given and names and section["task"] not in tasks:
        raise ReasonRLError(
            f"{source}: config key 'online_dpo.task' names '{section['task']}', "
            "which is not under 'tasks'"
        )
    for variant in section["variants"]:
        _reject_repeat(names, variant["name"], "online_dpo.variants", source)
        if section["steps"] % variant["off_policy"]:
            raise ReasonRLError(
                f"{source}: config key 'online_dpo.steps' ({section['steps']}) is not a multiple"
                f" of variant '{variant['name']}' off_policy ({variant['off_policy']})"
            )


def _check_preference(section: dict, tasks: dict, source: str, both_given: bool) -> None:
    """Variant names unique and not ending in -round<r>; the prompt task configured (when
    there are rounds to feed)."""
    names = [v["name"] for v in section["variants"]]
    for name in names:
        _reject_repeat(names, name, "preference.variants", source)
        if re.search(r"-round\d+$", name) or name in ("base", "sft"):
            raise ReasonRLError(
                f"{source}: config key 'preference.variants' name '{name}' is reserved"
            )
    if both_given and names and section["task"] not in tasks:
        raise ReasonRLError(
            f"{source}: config key 'preference.task' names '{section['task']}', "
            "which is not under 'tasks'"
        )
    unknown = [name for name in section["prompts"]["sources"] if name not in tasks]
    if both_given and names and unknown:
        raise ReasonRLError(
            f"{source}: config key 'preference.prompts.sources' names '{unknown[0]}', "
            "which is not under 'tasks'"
        )


def _check_start_policies(given: set[str], filled: dict, source: str) -> None:
    """Each section the input gives (`given`) with work to do starts from a policy the
    workflow trains: an SFT policy of sft.variants, or (online, PPO, reward models) the base;
    so does the calibration. Checked here, a wrong name is one line naming its key, not a
    KeyError in the DAG's input functions."""
    sft = [f"sft-{name}" for name in sft_policies(filled)]
    starts = [
        (f"{section}.policy", filled[section]["policy"], allowed)
        for section, allowed in (
            ("preference", sft),
            ("online_dpo", [*sft, "base"]),
            ("ppo", [*sft, "base"]),
        )
        if section in given and filled[section]["variants"]
    ]
    starts += [
        (key, policy, [*sft, "base"]) for key, policy in _reward_model_policies(given, filled)
    ]
    calibration = filled["calibration"]
    if "calibration" in given and calibration["frontier_task"] is not None:
        starts.append(("calibration.policy", calibration["policy"], sft))
    for key, policy, allowed in starts:
        if policy not in allowed:
            raise ReasonRLError(
                f"{source}: config key '{key}' names '{policy}', which is not an SFT policy of"
                f" sft.variants ({', '.join(sft)})"
            )


def _reward_model_policies(given: set[str], filled: dict) -> list[tuple[str, str]]:
    """(key, policy) of the policies that sample and initialise the reward models the given
    sections use: per task under task_policies, else `policy`. The tasks with reward models:
    reward_models.tasks, PPO's (its R^2 table reads the BT-RM even under the verifier's
    reward), online DPO's unless the verifier alone rewards it."""
    rm, ppo, online = filled["reward_models"], filled["ppo"], filled["online_dpo"]
    used = set(rm["tasks"]) if "reward_models" in given else set()
    if "ppo" in given and ppo["variants"]:
        used.add(ppo["task"])
    if "online_dpo" in given and online["variants"] and online["reward"] != "oracle":
        used.add(online["task"])
    own = rm["task_policies"] if "reward_models" in given else {}
    starts = [(f"reward_models.task_policies.{task}", policy) for task, policy in own.items()]
    if used - own.keys():
        starts.append(("reward_models.policy", rm["policy"]))
    return starts


def _check_calibration(filled: dict, source: str) -> None:
    """With a frontier task: both bands are configured tasks and the evaluation samples the
    start policy (checked trained with the other start policies) at least k times."""
    section = filled["calibration"]
    if section["frontier_task"] is None:
        return
    for key in ("frontier_task", "easy_task"):
        if section[key] not in filled["tasks"]:
            raise ReasonRLError(
                f"{source}: config key 'calibration.{key}' names '{section[key]}', "
                "which is not under 'tasks'"
            )
    evaluation = filled["evaluation"]
    sampled = evaluation["sampled_policies"]
    if sampled is not None and section["policy"] not in sampled:
        raise ReasonRLError(
            f"{source}: config key 'evaluation.sampled_policies' leaves out"
            f" '{section['policy']}', the calibration's policy: its pass@k needs samples"
        )
    if evaluation["n_samples"] < section["k"]:
        raise ReasonRLError(
            f"{source}: config key 'calibration.k' ({section['k']}) exceeds evaluation.n_samples"
            f" ({evaluation['n_samples']}): pass@k needs k samples per problem"
        )
    if evaluation["temperature"] == 0:
        raise ReasonRLError(
            f"{source}: config key 'evaluation.temperature' is 0: calibration needs sampled"
            " trajectories"
        )


def _check_reward_models(raw: dict, filled: dict, source: str, stage: bool) -> None:
    """reward_models.tasks name configured tasks (a stage's config holds only its own task);
    HGS-PRM runs only where reward models do."""
    if "reward_models" not in raw:
        return
    section = filled["reward_models"]
    for name in section["tasks"]:
        if not stage and name not in filled["tasks"]:
            raise ReasonRLError(
                f"{source}: config key 'reward_models.tasks' names '{name}', "
                "which is not under 'tasks'"
            )
    for name in section["task_policies"]:
        if name not in section["tasks"]:
            raise ReasonRLError(
                f"{source}: config key 'reward_models.task_policies' names '{name}', "
                "which is not in reward_models.tasks"
            )
    for name in section["hgs"]["tasks"]:
        if section["tasks"] and name not in section["tasks"]:
            raise ReasonRLError(
                f"{source}: config key 'reward_models.hgs.tasks' names '{name}', "
                "which is not in reward_models.tasks"
            )
    if section["pooled"] and not stage:
        _check_pooled(section, filled["tasks"], source)
    low, high = section["hgs"]["neutral_band"]
    if low > high:
        raise ReasonRLError(
            f"{source}: config key 'reward_models.hgs.neutral_band' is not low, high"
        )


def _check_pooled(section: dict, tasks: dict, source: str) -> None:
    """One reward model on the union of reward_models.tasks' data starts from one policy and
    learns one kind of step labels (code PRMs have three classes, math PRMs two)."""
    names = section["tasks"]
    starts = sorted({section["task_policies"].get(name, section["policy"]) for name in names})
    if len(starts) > 1:
        raise ReasonRLError(
            f"{source}: config key 'reward_models.pooled': its tasks' reward models start from"
            f" different policies ({', '.join(starts)}), one model on their union from one"
        )
    code = {tasks[name]["kind"] in CODE_TASK_KINDS for name in names}
    if len(code) > 1:
        raise ReasonRLError(
            f"{source}: config key 'reward_models.pooled': reward_models.tasks mixes code and"
            " math tasks, whose PRM labels differ"
        )


def _check_ppo(raw: dict, filled: dict, source: str) -> None:
    """PPO variant names unique; the PPO task configured (when there are variants to run)."""
    section = filled["ppo"]
    names = [v["name"] for v in section["variants"]]
    for name in names:
        _reject_repeat(names, name, "ppo.variants", source)
    if "ppo" in raw and "tasks" in raw and names and section["task"] not in filled["tasks"]:
        raise ReasonRLError(
            f"{source}: config key 'ppo.task' names '{section['task']}', which is not under 'tasks'"
        )


def evaluated_arms(config: dict) -> dict[str, list[str]]:
    """Every policy the workflow evaluates on a test split -> the tasks it is evaluated on:
    the arms a declared comparison may name (METHOD-best is the round the held-out selection
    picked)."""
    tasks = config["evaluation"]["tasks"]
    arms = {"base": tasks}
    for name, policy in sft_policies(config).items():
        arms[f"sft-{name}"] = (
            [t for t in tasks if t in policy["tasks"]] if policy["own_tasks"] else tasks
        )
    for variant in config["preference"]["variants"]:
        rounds = range(1, variant["rounds"] + 1)
        arms.update((f"{variant['name']}-round{r}", tasks) for r in rounds)
        arms[f"{variant['name']}-best"] = tasks
    online_tasks = list(dict.fromkeys([config["online_dpo"]["task"], *tasks]))
    for variant in config["online_dpo"]["variants"]:
        # its own task, and the evaluation tasks: what it costs on another band is a claim too
        arms[f"online-{variant['name']}"] = online_tasks
    ppo = config["ppo"]
    for variant in ppo["variants"]:
        arms[f"ppo-{variant['name']}"] = [ppo["task"]]
    if ppo["variants"]:
        # the PPO table scores its start on ppo.task too: PPO against its start is a claim
        arms[ppo["policy"]] = list(dict.fromkeys([*arms.get(ppo["policy"], []), ppo["task"]]))
    return arms


# The reward models whose score is a probability that the solution is right (the ORM's and
# each PRM aggregation's P("+")), so their sum over an answer's samples weighs a vote; the
# BT-RM's score is an unbounded logit (a negative one would count against its answer).
VOTE_WEIGHTS = ("orm", "prm-min", "prm-mean", "prm-last")
# What a best-of-N arm may select with (bon:SELECTION@N): pass is the oracle (some sample of
# the N is correct), maj the plurality answer, vote-SCORER the answer with the largest sum
# of that reward model's scores, the rest the top sample of a reward model (the scorers
# reasonrl.rewards.reranking writes; a test keeps the two lists equal).
BEST_OF_N_SELECTIONS = (
    "pass",
    "maj",
    *(f"vote-{scorer}" for scorer in VOTE_WEIGHTS),
    "bt",
    "orm",
    "prm-min",
    "prm-mean",
    "prm-last",
)
# What a compute-matched arm of the HGS stage may select with (hgs-matched:SELECTION): its
# samples are scored by the search's PRM only.
MATCHED_SELECTIONS = ("pass", "maj", "prm-min", "prm-mean", "prm-last")
_SEARCH_ARM = re.compile(r"^bon:(?P<method>[a-z][a-z-]*)@(?P<n>[1-9][0-9]*)$")


@dataclass(frozen=True)
class SearchArm:
    """A comparison arm scored from a search stage's outputs rather than a policy's evaluation:
    `stage` is its folder under results/search/{task}/ (best-of-n or hgs), `method` the
    selection (greedy, hgs, one of BEST_OF_N_SELECTIONS, or at stage hgs one of
    MATCHED_SELECTIONS over the compute-matched samples), `n` the samples it chooses from."""

    stage: str
    method: str
    n: int = 1


def search_arm(arm: str) -> SearchArm | None:
    """The search arm `arm` names (hgs, hgs-matched:SELECTION, bon:greedy or
    bon:SELECTION@N), None for a policy.

    Raises ReasonRLError for a bon: or hgs-matched: arm of another form or selection.
    """
    if arm == "hgs":
        return SearchArm("hgs", "hgs")
    if arm.startswith("hgs-matched:"):
        selection = arm.removeprefix("hgs-matched:")
        if selection not in MATCHED_SELECTIONS:
            raise ReasonRLError(
                f"'{arm}' selects by '{selection}', not one of {', '.join(MATCHED_SELECTIONS)}"
            )
        return SearchArm("hgs", selection)
    if not arm.startswith("bon:"):
        return None
    if arm == "bon:greedy":
        return SearchArm("best-of-n", "greedy")
    match = _SEARCH_ARM.match(arm)
    if not match:
        raise ReasonRLError(f"'{arm}' is not bon:greedy or bon:SELECTION@N")
    if match["method"] not in BEST_OF_N_SELECTIONS:
        raise ReasonRLError(
            f"'{arm}' selects by '{match['method']}', not one of {', '.join(BEST_OF_N_SELECTIONS)}"
        )
    return SearchArm("best-of-n", match["method"], int(match["n"]))


def _search_arm_unmade(arm: str, search: SearchArm, config: dict, task: str) -> str | None:
    """Why the config does not produce a search arm on `task` (None when it does)."""
    section = config["reward_models"]
    if task not in section["tasks"]:
        return f"'{arm}' needs best-of-N data of '{task}', which reward_models.tasks does not list"
    if search.stage == "hgs" and task not in section["hgs"]["tasks"]:
        return f"'{arm}' needs the HGS-PRM search of '{task}', not in reward_models.hgs.tasks"
    n_max = max(section["best_of_n"]["n"])
    if search.n > n_max:
        return f"'{arm}' selects from {search.n} samples; reward_models.best_of_n.n draws {n_max}"
    return None


def _check_comparisons(config: dict, source: str) -> None:
    """Declared comparisons: unique names, two arms the workflow produces on the task: policies
    it evaluates, or search arms (which are scored on the search stages' test problems, so a
    comparison does not mix the two kinds)."""
    declared = config["comparisons"]["declared"]
    names = [c["name"] for c in declared]
    arms = evaluated_arms(config)
    for index, comparison in enumerate(declared):
        _reject_repeat(names, comparison["name"], "comparisons.declared", source)
        kinds = set()
        for side in ("a", "b"):
            key = f"{source}: config key 'comparisons.declared.{index}.{side}'"
            arm, task = comparison[side], comparison["task"]
            try:
                search = search_arm(arm)
            except ReasonRLError as err:
                raise ReasonRLError(f"{key}: {err}") from None
            kinds.add(search is None)
            if search:
                unmade = _search_arm_unmade(arm, search, config, task)
            elif task not in arms.get(arm, []):
                unmade = f"'{arm}' is not a policy this config evaluates on '{task}'"
            else:
                unmade = None
            if unmade:
                raise ReasonRLError(f"{key}: {unmade}")
        if len(kinds) > 1:
            raise ReasonRLError(
                f"{source}: config key 'comparisons.declared.{index}': pairs a policy with a "
                "search arm, which are scored on different test problems (bon:greedy is the "
                "policy's greedy decoding on the search's problems)"
            )


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content; malformed YAML raises `path:line:column: malformed YAML: why`
    (line and column 1-based, as editors count). FileNotFoundError passes through."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None)
        reason = f": {problem}" if problem else ""
        raise ReasonRLError(f"{path}{where}: malformed YAML{reason}") from None


def read_json(path: str | Path) -> Any:
    """A JSON file's content (None for an empty file); malformed JSON raises
    `path:line:column: malformed JSON: why`. FileNotFoundError passes through."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text) if text.strip() else None
    except json.JSONDecodeError as err:
        raise ReasonRLError(f"{path}:{err.lineno}:{err.colno}: malformed JSON: {err.msg}") from None


def load_config(path: str | Path | None = None, json_text: str | None = None) -> dict:
    """Load a config from a YAML file or a JSON string (as Snakemake rules pass it)."""
    if json_text is not None:
        try:
            raw = json.loads(json_text)
        except json.JSONDecodeError as err:
            raise ReasonRLError(f"--config-json: malformed JSON: {err.msg}") from None
        return validate_config(raw, "--config-json", stage=True)
    if path is None:
        return validate_config({})
    return validate_config(_read_mapping(path), str(path))


def _read_mapping(path: str | Path) -> dict | None:
    """A config file's mapping (None for an empty file), one-line errors naming the file. A
    .json file is read as JSON: YAML 1.1 reads JSON's `3e-05` (no dot) as a string."""
    read = read_json if Path(path).suffix == ".json" else read_yaml
    try:
        raw = read(path)
    except FileNotFoundError:
        raise ReasonRLError(f"{path}: config file not found") from None
    if raw is not None and not isinstance(raw, dict):
        raise ReasonRLError(f"{path}: a config must be a mapping")
    return raw


def _merged(base: dict, update: dict) -> dict:
    """`update` over `base`: mappings merged key by key, other values replaced (how Snakemake
    merges a --configfile onto the Snakefile's configfile)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def merged_over(base: dict, update: dict) -> dict:
    """`update` over `base` as one more config file: sections merged key by key, except
    `tasks`, which an update that names it replaces whole. A recipe says which tasks it runs;
    merging would run the default's tasks (data, tokenizer corpus) in every recipe too."""
    out = _merged(base, update)
    if isinstance(update.get("tasks"), dict):
        out["tasks"] = update["tasks"]
    return out


def named_tasks(configfiles: list[str], cli_config: dict) -> dict | None:
    """The task set of a Snakemake run: `tasks` of the last config file naming it (files in
    the order Snakemake merges them), with `--config` edits over it; None when none names it."""
    tasks = None
    for path in configfiles:
        mapping = _read_mapping(path) or {}
        if isinstance(mapping.get("tasks"), dict):
            tasks = mapping["tasks"]
    edits = cli_config.get("tasks")
    if tasks is not None and isinstance(edits, dict):
        tasks = _merged(tasks, edits)
    return tasks


def load_workflow_config(configfiles: list[str], default: str = "config/config.yaml") -> dict:
    """The config the workflow runs with `--configfile` each of `configfiles`: the default
    config file (when present) with each merged over it in turn (`merged_over`), validated,
    defaults filled."""
    merged: dict = {}
    sources = [default] if Path(default).is_file() else []
    for path in sources + list(configfiles):
        merged = merged_over(merged, _read_mapping(path) or {})
    return validate_config(merged, " + ".join(map(str, sources + list(configfiles))))
