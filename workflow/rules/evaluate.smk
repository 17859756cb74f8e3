# Evaluation of one policy on one task's test split: greedy pass@1, pass@k and maj@k.


include: "helpers/evaluate.smk"


rule evaluate:
    input:
        model=lambda wildcards: policy_model_input(wildcards.policy),
        problems="results/data/{task}/test.jsonl",
        parts=split_parts("evaluate", "results/eval/{policy}/{task}.parts/{part}"),
    output:
        trajectories="results/eval/{policy}/{task}/trajectories.jsonl",
        metrics="results/eval/{policy}/{task}/metrics.json",
        table="results/eval/{policy}/{task}/metrics.csv",
        manifest="results/eval/{policy}/{task}/manifest.json",
    log:
        "logs/eval/{policy}/{task}.log",
    benchmark:
        "benchmarks/eval/{policy}/{task}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("evaluate")
    threads: torch_threads
    params:
        config=evaluation_config_json,
        model=model_arg,
        style=lambda wildcards: policy_style(wildcards.policy),
        out_dir=subpath(output.metrics, parent=True),
        split=parts_arg,
    shell:
        "reasonrl evaluate --config-json {params.config} --model {params.model:q}"
        " --style {params.style} --task {wildcards.task:q} --problems {input.problems:q}"
        " --policy {wildcards.policy:q} {params.split}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


# One share of evaluate's shards (config split.evaluate > 1); the gathering job adopts them.
use rule evaluate as evaluate_part with:
    input:
        model=lambda wildcards: policy_model_input(wildcards.policy),
        problems="results/data/{task}/test.jsonl",
    output:
        temp(directory("results/eval/{policy}/{task}.parts/{part}")),
    log:
        "logs/eval/{policy}/{task}.part{part}.log",
    benchmark:
        "benchmarks/eval/{policy}/{task}.part{part}.tsv"
    params:
        out_dir="results/eval/{policy}/{task}.parts/{part}",
        split=part_arg("evaluate"),
