# Task data: train and test problems of one task (generated, bundled or loaded), and the
# prompt pools its consumers draw from instead of the train split (tasks.TASK.pools).


include: "helpers/data.smk"


rule make_task_data:
    output:
        train="results/data/{task}/train.jsonl",
        test="results/data/{task}/test.jsonl",
        manifest="results/data/{task}/manifest.json",
    log:
        "logs/data/{task}.log",
    benchmark:
        "benchmarks/data/{task}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("make_task_data")
    params:
        config=task_data_json,
        out_dir=subpath(output.manifest, parent=True),
    shell:
        "reasonrl make-data --config-json {params.config} --task {wildcards.task:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule make_task_pool:
    output:
        problems="results/data/{task}/pool-{pool}/problems.jsonl",
        manifest="results/data/{task}/pool-{pool}/manifest.json",
    log:
        "logs/data/{task}/pool-{pool}.log",
    benchmark:
        "benchmarks/data/{task}/pool-{pool}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("make_task_pool")
    params:
        config=lambda wildcards: config_json("tasks", task=wildcards.task),
        out_dir=subpath(output.manifest, parent=True),
    shell:
        "reasonrl make-pool --config-json {params.config} --task {wildcards.task:q}"
        " --pool {wildcards.pool:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
