# Helpers of report.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


def evaluated_policies():
    """The policies of the summary, each on every evaluation task (easy and frontier band
    reported apart): base, SFT, every preference round and every online DPO run."""
    sft = [f"sft-{name}" for name in SFT_POLICIES]
    online = [f"online-{name}" for name in online_names()]
    return ["base", *sft, *preference_policies(), *online]


def evaluated_tasks(policy):
    """evaluation.tasks, less those an SFT entry with its own task list does not learn: a
    code policy beside the arith one is not scored on arith (a bare style, trained on
    sft.tasks, is scored on every evaluation task, transfer included)."""
    tasks = config["evaluation"]["tasks"]
    settings = SFT_POLICIES.get(policy.removeprefix("sft-"))
    if settings and settings["own_tasks"]:
        return [t for t in tasks if t in settings["tasks"]]
    return tasks


def eval_metrics():
    """Every evaluation the summary lists: the policies of evaluated_policies on their tasks,
    and each PPO run on ppo.task (where it is evaluated)."""
    ppo = [ppo_eval_metrics(f"ppo-{name}") for name in ppo_variants()]
    return [
        f"results/eval/{policy}/{task}/metrics.json"
        for policy in evaluated_policies()
        for task in evaluated_tasks(policy)
    ] + ppo


def sft_models():
    return expand("results/models/sft-{variant}", variant=list(SFT_POLICIES))


def sft_train_metrics(wildcards, input):
    """The metrics.json inside each SFT model folder (a file in a directory() output)."""
    return " ".join(shlex.quote(f"{model}/metrics.json") for model in input.sft_models)


# --- Calibration (calibration.smk) -----------------------------------------------------------
# Off while calibration.frontier_task is null: then no rule below takes these inputs and the
# DAG is that of a config without the section.


def calibration_report_input():
    return CALIBRATION_JSON if calibration_on() else []


def calibration_report_arg(wildcards, input):
    return (
        f"--calibration {shlex.quote(input.calibration)}" if input.calibration else ""
    )


# ---- Preference rounds (M-DPO, M-KTO and baselines) ----------------------------------------
# Round 0 is the SFT policy preference.policy (sft-tool by default), whose style the rounds
# sample and are evaluated in; policy {method}-round{r} trains from {method}-round{r-1} on
# data sampled by that lineage. Round 1 samples only the SFT policy, so its data is shared by
# every method (lineage "sft"); later rounds sample the method's own policies.


def preference_policies():
    return [f"{m}-round{r}" for m in preference_methods() for r in preference_rounds(m)]


def comparison_policies(arm):
    """The policies whose test trajectories an arm needs: METHOD-best needs every round of
    the method and the SFT start, since the held-out selection picks among them; a search
    arm needs none (comparison_search_files)."""
    if search_arm(arm):
        return []
    if arm.endswith("-best"):
        method = arm.removesuffix("-best")
        return [round_policy(method, r) for r in [0, *preference_rounds(method)]]
    return [arm]


def comparison_arms():
    """TASK/POLICY -> test trajectories of every arm of every declared comparison (a policy
    compared on two tasks, e.g. its gain on one band and its cost on the other, has two).
    """
    arms = {}
    for comparison in COMPARISONS:
        task = comparison["task"]
        for side in ("a", "b"):
            for policy in comparison_policies(comparison[side]):
                arms[f"{task}/{policy}"] = (
                    f"results/eval/{policy}/{task}/trajectories.jsonl"
                )
    return arms


def comparison_best_files():
    methods = {
        c[side].removesuffix("-best")
        for c in COMPARISONS
        for side in ("a", "b")
        if c[side].endswith("-best")
    }
    return {m: f"results/selection/{m}-best/best.json" for m in sorted(methods)}


def search_arm_files(spec):
    if spec.stage == "hgs" and spec.method != "hgs":
        return MATCHED_ARM_FILES  # hgs-matched:SELECTION
    return SEARCH_ARM_FILES.get(spec.method, BEST_OF_N_ARM_FILES)


def comparison_search_folders():
    """TASK/STAGE -> results/search/TASK/STAGE/ of every search arm (hgs, bon:...) that a
    declared comparison names, with the files there it is scored from."""
    folders = {}
    for comparison in COMPARISONS:
        for side in ("a", "b"):
            spec = search_arm(comparison[side])
            if spec:
                key = f"{comparison['task']}/{spec.stage}"
                folders.setdefault(key, set()).update(search_arm_files(spec))
    return {key: sorted(files) for key, files in sorted(folders.items())}


def comparison_search_files():
    return [
        f"results/search/{key}/{name}"
        for key, names in comparison_search_folders().items()
        for name in names
    ]


def comparison_args(wildcards, input):
    arms = [f"{arm}={path}" for arm, path in comparison_arms().items()]
    best = [f"{method}={path}" for method, path in comparison_best_files().items()]
    search = [f"{key}=results/search/{key}" for key in comparison_search_folders()]
    return " ".join(
        [
            repeated_flag("--arm", arms),
            repeated_flag("--best", best),
            repeated_flag("--search", search),
        ]
    )


def comparison_outputs():
    """The report's comparison files when the config declares comparisons, else none."""
    if not COMPARISONS:
        return {}
    files = {
        f"comparisons_{kind}": f"results/report/comparisons.{kind}"
        for kind in ("json", "csv", "md")
    }
    files["comparisons_plot"] = report(
        "results/report/comparisons.png",
        caption="../report/comparisons.rst",
        category="Comparisons",
    )
    return files


# --- Report pages (report.smk) ----------------------------------------------------------------


def report_tables():
    """NAME -> CSV of every result table this config makes, shown as an HTML page each."""
    tables = {"summary": "results/report/summary.csv"}
    if calibration_on():
        tables["calibration"] = "results/report/calibration.csv"
    if COMPARISONS:
        tables["comparisons"] = "results/report/comparisons.csv"
    if config["preference"]["variants"]:
        tables["preference"] = "results/report/preference/table.csv"
    if rm_tasks():
        for name in ("best_of_n", "hgs", "prm_precision_recall"):
            tables[name] = f"results/report/reward_models/{name}.csv"
    if online_names():
        tables["online_dpo"] = "results/report/online_dpo/table.csv"
    if ppo_variants():
        tables["ppo"] = "results/report/ppo/table.csv"
        tables["ppo_r2"] = "results/ppo/r2/r2.csv"
    return tables


def report_curve_inputs():
    """The inputs of the report's curves: the preference table (rounds), and the samples and
    scores of every task's best-of-N stage (best-of-N curves over N)."""
    inputs = {}
    if "preference" in report_tables():
        inputs["preference"] = [report_tables()["preference"]]
    if rm_tasks():
        inputs["best_of_n"] = [
            f"results/search/{task}/best-of-n/{name}"
            for task in rm_tasks()
            for name in BEST_OF_N_ARM_FILES
        ]
    return inputs


def report_curve_outputs():
    """best_of_n.png with its numbers, and rounds.png, for the methods this config runs."""
    inputs = report_curve_inputs()
    outputs = {}
    if "best_of_n" in inputs:
        outputs["best_of_n"] = report(
            "results/report/pages/best_of_n.png",
            caption="../report/best_of_n.rst",
            category="Curves",
        )
        for kind in ("csv", "json"):
            outputs[f"best_of_n_{kind}"] = (
                f"results/report/pages/best_of_n_curves.{kind}"
            )
    if "preference" in inputs:
        outputs["preference"] = report(
            "results/report/pages/rounds.png",
            caption="../report/rounds.rst",
            category="Curves",
        )
    return outputs


def report_pages_args(wildcards, input):
    tables = repeated_flag(
        "--table", [f"{name}={path}" for name, path in report_tables().items()]
    )
    best_of_n = repeated_flag(
        "--best-of-n",
        [f"{task}=results/search/{task}/best-of-n" for task in rm_tasks()],
    )
    preference = repeated_flag(
        "--preference", report_curve_inputs().get("preference", [])
    )
    return f"{tables} {best_of_n} {preference}"

# --- The memory plan (workflow/rules/plan.smk) ----------------------------------------------
