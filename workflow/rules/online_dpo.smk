# Asynchronous off-policy online DPO (asynchronous RLHF paper): one run per variant from the
# SFT policy (sync or async, same steps), each evaluated by the evaluate rule as policy
# online-{name}, then the sync-vs-async table with reward/KL plots against wall-clock. Over
# a job's GPUs the learner is data parallel (DDP or ZeRO-2), the generator on the main one, or
# on a GPU of its own with resource generator_gpus: 1 (the job's last).


include: "helpers/online_dpo.smk"


wildcard_constraints:
    online=r"[a-z][a-z0-9.]*(-[a-z0-9.]+)*",


rule online_dpo:
    input:
        gate=calibration_gate(),
        model=policy_model_input(ONLINE["policy"]),
        train=online_prompts,
        reward_model=bt_reward_model(ONLINE),
    output:
        model=directory("results/models/online-{online}"),
    log:
        "logs/models/online-{online}.log",
    benchmark:
        "benchmarks/models/online-{online}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("online_dpo")
    threads: online_threads
    params:
        config=config_json("online_dpo", "generation", "rollout", "sandbox", "policy"),
        model=model_arg,
        style=policy_style(ONLINE["policy"]),
        launch=launcher,
        generator=generator_gpus_arg,
        reward_model=reward_model_arg,
    shell:
        "{params.launch} online-dpo --config-json {params.config} --variant {wildcards.online}"
        " --model {params.model:q} --train {input.train:q} --style {params.style}"
        " {params.reward_model} {params.generator} --threads {threads} --out {output.model:q}"
        " > {log:q} 2>&1"


rule online_dpo_table:
    input:
        models=expand("results/models/online-{name}", name=online_names()),
        evals=expand(
            "results/eval/online-{name}/{task}/metrics.json",
            name=online_names(),
            task=ONLINE["task"],
        ),
    output:
        md="results/report/online_dpo/table.md",
        csv="results/report/online_dpo/table.csv",
        json="results/report/online_dpo/table.json",
        plot=report(
            "results/report/online_dpo/plot.png",
            caption="../report/online_dpo.rst",
            category="Online DPO",
        ),
    log:
        "logs/report/online_dpo.log",
    benchmark:
        "benchmarks/report/online_dpo.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("online_dpo_table")
    params:
        rows=online_table_args,
        out_dir=subpath(output.md, parent=True),
    shell:
        "reasonrl online-dpo-table {params.rows} --out-dir {params.out_dir:q} > {log:q} 2>&1"
