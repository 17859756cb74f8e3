# Task data: train and test problems of one task (generated, bundled or loaded).


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
        config=lambda wildcards: config_json("tasks", task=wildcards.task),
        out_dir=subpath(output.manifest, parent=True),
    shell:
        "reasonrl make-data --config-json {params.config} --task {wildcards.task:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
