# PPO / PF-PPO from the SFT policy (ppo section) on ppo.task's ppo pool, else its train split:
# R^2 of reward vs true score per filtering strategy from SFT samples; one PPO run per variant
# (policies ppo-{name}, evaluated by the evaluate rule; data parallel over the job's GPUs,
# DDP or DeepSpeed ZeRO-2/3, its generator on the job's last GPU with resource
# generator_gpus: 1); the table of held-out pass@1 beside R^2 and compute.


include: "helpers/ppo.smk"


wildcard_constraints:
    ppo_variant=ppo_variant_pattern(),


rule ppo_r2:
    input:
        gate=calibration_gate(),
        model=policy_model_input(PPO["policy"]),
        reward_model=f"results/rm/{rm_folder(PPO['task'])}/model-bt",
        problems=ppo_prompts,
    output:
        table="results/ppo/r2/r2.json",
        csv="results/ppo/r2/r2.csv",
        markdown="results/ppo/r2/r2.md",
        plot="results/ppo/r2/score_by_reward_bin.png",
        samples="results/ppo/r2/samples.jsonl",
        manifest="results/ppo/r2/manifest.json",
    log:
        "logs/ppo/r2.log",
    benchmark:
        "benchmarks/ppo/r2.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("ppo_r2")
    threads: torch_threads
    params:
        # lazy: a DAG without PPO variants need not have ppo.task among its tasks
        config=lambda wildcards: config_json(
            "ppo",
            "policy",
            "rollout",
            "generation",
            "sandbox",
            "tasks",
            task=PPO["task"],
        ),
        model=model_arg,
        out_dir=subpath(output.manifest, parent=True),
    shell:
        "reasonrl ppo-r2 --config-json {params.config} --model {params.model:q}"
        " --reward-model {input.reward_model:q} --problems {input.problems:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule ppo:
    input:
        gate=calibration_gate(),
        model=policy_model_input(PPO["policy"]),
        reward_model=bt_reward_model(PPO),
        problems=ppo_prompts,
    output:
        directory("results/models/ppo-{ppo_variant}"),
    log:
        "logs/models/ppo-{ppo_variant}.log",
    benchmark:
        "benchmarks/models/ppo-{ppo_variant}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("ppo")
    threads: torch_threads
    params:
        # lazy: a DAG without PPO variants need not have ppo.task among its tasks
        config=lambda wildcards: config_json(
            "ppo",
            "policy",
            "rollout",
            "generation",
            "sandbox",
            "tasks",
            task=PPO["task"],
        ),
        model=model_arg,
        reward_model=reward_model_arg,
        launch=launcher,
        generator=generator_gpus_arg,
    shell:
        "{params.launch} ppo --config-json {params.config} --variant {wildcards.ppo_variant}"
        " --model {params.model:q} {params.reward_model} --problems {input.problems:q}"
        " {params.generator} --out {output:q} > {log:q} 2>&1"


rule ppo_table:
    input:
        sft=ppo_eval_metrics(PPO["policy"]),
        evals=[ppo_eval_metrics(f"ppo-{name}") for name in ppo_variants()],
        models=expand("results/models/ppo-{name}", name=ppo_variants()),
        r2=rules.ppo_r2.output.table,
    output:
        csv="results/report/ppo/table.csv",
        markdown="results/report/ppo/table.md",
    log:
        "logs/report/ppo.log",
    benchmark:
        "benchmarks/report/ppo.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("ppo_table")
    params:
        rows=ppo_table_rows,
        out_dir=subpath(output.csv, parent=True),
    shell:
        "reasonrl ppo-table --sft-eval {input.sft:q} {params.rows} --r2 {input.r2:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
