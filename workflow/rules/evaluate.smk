# Evaluation of one policy on one task's test split: greedy pass@1, pass@k and maj@k.


rule evaluate:
    input:
        model=lambda wildcards: policy_model_input(wildcards.policy),
        problems="results/data/{task}/test.jsonl",
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
    threads: torch_threads
    params:
        config=lambda wildcards: config_json(
            "evaluation",
            "policy",
            "rollout",
            "generation",
            "sandbox",
            "tasks",
            task=wildcards.task,
        ),
        model=model_arg,
        style=lambda wildcards: policy_style(wildcards.policy),
        out_dir=subpath(output.metrics, parent=True),
    shell:
        "reasonrl evaluate --config-json {params.config} --model {params.model:q}"
        " --style {params.style} --task {wildcards.task:q} --problems {input.problems:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
