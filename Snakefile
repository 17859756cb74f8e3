# reasonrl: post-train language models for math and code reasoning.
# build (or convert) base policy -> make task data -> SFT (tool, cot) -> evaluate -> report
import os

from reasonrl.config import named_tasks, read_yaml, validate_config
from reasonrl.errors import ReasonRLError, exit_with
from reasonrl.tracking import ENV_VAR, workflow_environment

# Snakemake's own message for a malformed config file names neither the file nor the line.
try:
    read_yaml("config/config.yaml")
except FileNotFoundError:
    pass  # a --configfile stands in for it
except ReasonRLError as err:
    exit_with(err)


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# Snakemake merges every section key by key; a recipe's `tasks` replace the default's instead
# (reasonrl.config.merged_over), in the order Snakemake merges: config.yaml, then --configfile.
try:
    cli_files = list(workflow.config_settings.configfiles)
    default_files = [f for f in workflow.configfiles if f not in cli_files]
    tasks = named_tasks(
        default_files + cli_files, dict(workflow.config_settings.config)
    )
except ReasonRLError as err:
    exit_with(err)
if tasks is not None:
    config["tasks"] = tasks

# Fill schema defaults in place (rules read config[...]) and reject unknown keys in one line.
# A file given twice (the default and --configfile config/config.yaml) is named once.
named = {}
for path in map(str, workflow.configfiles):
    named.setdefault(os.path.realpath(path), path)
config_files = " + ".join(named.values()) or "config"
try:
    config.update(validate_config(config, config_files))
except ReasonRLError as err:
    exit_with(err)

# One tracking run name per invocation, in the environment every rule (and SLURM job) inherits.
try:
    os.environ[ENV_VAR] = workflow_environment(config, os.environ)
except ReasonRLError as err:
    exit_with(err)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/sft.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/calibration.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/preference.smk"
include: "workflow/rules/reward_models.smk"
include: "workflow/rules/online_dpo.smk"
include: "workflow/rules/ppo.smk"
# After every rule: the memory plan of the GPU rules their resources ask for.
include: "workflow/rules/plan.smk"
# Keep last: it sees every rule above.
include: "workflow/rules/docker.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
        rules.report_pages.output,
        rules.preference_table.output if config["preference"]["variants"] else [],
        reward_model_targets(),
        rules.online_dpo_table.output if config["online_dpo"]["variants"] else [],
        ppo_targets(),
