# Reward models on the SFT policy (reward_models.policy), started from its weights or from
# reward_models.base: SFT samples of train prompts ->
# Bradley-Terry RM and ORM; Math-Shepherd annotation (math) or AST mutants (code) -> PRM
# (per task, or with reward_models.pooled one of each on the union of the tasks' data);
# then best-of-N reranking and HGS-PRM decoding on the test split, and their tables.


include: "helpers/reward_models.smk"


wildcard_constraints:
    kind=r"bt|orm|prm",


rule sample_rm_data:
    input:
        gate=calibration_gate(),
        model=rm_policy_model,
        problems=prompt_source("reward_models"),
        parts=split_parts("sample_rm_data", "results/rm/{task}/samples.parts/{part}"),
    output:
        samples="results/rm/{task}/samples/samples.jsonl",
        metrics="results/rm/{task}/samples/metrics.json",
        manifest="results/rm/{task}/samples/manifest.json",
    log:
        "logs/rm/{task}/samples.log",
    benchmark:
        "benchmarks/rm/{task}/samples.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("sample_rm_data")
    threads: torch_threads
    params:
        config=lambda wildcards: config_json(
            "reward_models",
            "policy",
            "rollout",
            "generation",
            "sandbox",
            "tasks",
            task=wildcards.task,
        ),
        out_dir=subpath(output.manifest, parent=True),
        split=parts_arg,
    shell:
        "reasonrl sample-rm-data --config-json {params.config} --model {input.model:q}"
        " --problems {input.problems:q} --out-dir {params.out_dir:q} {params.split}"
        " > {log:q} 2>&1"


# One share of sample_rm_data's shards (config split.sample_rm_data > 1).
use rule sample_rm_data as sample_rm_data_part with:
    input:
        gate=calibration_gate(),
        model=rm_policy_model,
        problems=prompt_source("reward_models"),
    output:
        temp(directory("results/rm/{task}/samples.parts/{part}")),
    log:
        "logs/rm/{task}/samples.part{part}.log",
    benchmark:
        "benchmarks/rm/{task}/samples.part{part}.tsv"
    params:
        out_dir="results/rm/{task}/samples.parts/{part}",
        split=part_arg("sample_rm_data"),


rule annotate_prm:
    input:
        model=rm_policy_model,
        problems=prompt_source("reward_models"),
        samples="results/rm/{task}/samples/samples.jsonl",
        parts=split_parts("annotate_prm", "results/rm/{task}/shepherd.parts/{part}"),
    output:
        data="results/rm/{task}/shepherd/prm.jsonl",
        metrics="results/rm/{task}/shepherd/metrics.json",
        manifest="results/rm/{task}/shepherd/manifest.json",
    log:
        "logs/rm/{task}/shepherd.log",
    benchmark:
        "benchmarks/rm/{task}/shepherd.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("annotate_prm")
    threads: torch_threads
    params:
        config=lambda wildcards: config_json(
            "reward_models",
            "policy",
            "rollout",
            "generation",
            "sandbox",
            "tasks",
            task=wildcards.task,
        ),
        out_dir=subpath(output.manifest, parent=True),
        split=parts_arg,
    shell:
        "reasonrl annotate-prm --config-json {params.config} --model {input.model:q}"
        " --problems {input.problems:q} --samples {input.samples:q}"
        " --out-dir {params.out_dir:q} {params.split} > {log:q} 2>&1"


# One share of annotate_prm's shards (config split.annotate_prm > 1).
use rule annotate_prm as annotate_prm_part with:
    input:
        model=rm_policy_model,
        problems=prompt_source("reward_models"),
        samples="results/rm/{task}/samples/samples.jsonl",
    output:
        temp(directory("results/rm/{task}/shepherd.parts/{part}")),
    log:
        "logs/rm/{task}/shepherd.part{part}.log",
    benchmark:
        "benchmarks/rm/{task}/shepherd.part{part}.tsv"
    params:
        out_dir="results/rm/{task}/shepherd.parts/{part}",
        split=part_arg("annotate_prm"),


rule mutate_code_prm:
    input:
        problems=prompt_source("reward_models"),
    output:
        data="results/rm/{task}/mutation/prm.jsonl",
        metrics="results/rm/{task}/mutation/metrics.json",
        manifest="results/rm/{task}/mutation/manifest.json",
    log:
        "logs/rm/{task}/mutation.log",
    benchmark:
        "benchmarks/rm/{task}/mutation.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("mutate_code_prm")
    params:
        config=lambda wildcards: config_json(
            "reward_models", "sandbox", "tasks", task=wildcards.task
        ),
        out_dir=subpath(output.manifest, parent=True),
    shell:
        "reasonrl mutate-code-prm --config-json {params.config}"
        " --problems {input.problems:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


if rm_converts_smollm2():

    rule convert_rm_smollm2:
        output:
            directory(RM_SMOLLM2_DIR),
        log:
            "logs/rm/base-smollm2.log",
        benchmark:
            "benchmarks/rm/base-smollm2.tsv"
        conda:
            CONDA_ENV
        container:
            rule_container("convert_rm_smollm2")
        threads: torch_threads
        params:
            config=config_json("policy"),
        shell:
            "reasonrl convert-gguf --config-json {params.config} --out {output:q} > {log:q} 2>&1"


rule train_reward_model:
    input:
        model=rm_backbone_model,
        problems=rm_training_problems,
        data=rm_training_data,
    output:
        directory("results/rm/{task}/model-{kind}"),
    log:
        "logs/rm/{task}/model-{kind}.log",
    benchmark:
        "benchmarks/rm/{task}/model-{kind}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("train_reward_model")
    threads: torch_threads
    params:
        config=config_json("reward_models", "policy"),
        launch=launcher,
        model=rm_backbone_arg,
    shell:
        "{params.launch} train-reward-model --config-json {params.config} --kind {wildcards.kind}"
        " --model {params.model:q} --problems {input.problems:q} --data {input.data:q}"
        " --out {output:q} > {log:q} 2>&1"


rule best_of_n:
    input:
        policy=rm_policy_model,
        problems="results/data/{task}/test.jsonl",
        bt=reward_model("bt"),
        orm=reward_model("orm"),
        prm=reward_model("prm"),
        parts=split_parts("best_of_n", "results/search/{task}/best-of-n.parts/{part}"),
    output:
        table="results/search/{task}/best-of-n/best_of_n.json",
        csv="results/search/{task}/best-of-n/best_of_n.csv",
        greedy="results/search/{task}/best-of-n/greedy.jsonl",
        samples="results/search/{task}/best-of-n/samples.jsonl",
        scores="results/search/{task}/best-of-n/scores.jsonl",
        rlhflow="results/search/{task}/best-of-n/rlhflow.jsonl",
        manifest="results/search/{task}/best-of-n/manifest.json",
    log:
        "logs/search/{task}/best-of-n.log",
    benchmark:
        "benchmarks/search/{task}/best-of-n.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("best_of_n")
    threads: torch_threads
    params:
        config=lambda wildcards: config_json(
            "reward_models",
            "policy",
            "rollout",
            "generation",
            "sandbox",
            "tasks",
            task=wildcards.task,
        ),
        out_dir=subpath(output.manifest, parent=True),
        split=parts_arg,
    shell:
        "reasonrl best-of-n --config-json {params.config} --policy {input.policy:q}"
        " --problems {input.problems:q} --bt {input.bt:q} --orm {input.orm:q}"
        " --prm {input.prm:q} --out-dir {params.out_dir:q} {params.split} > {log:q} 2>&1"


# One share of best_of_n's shards (config split.best_of_n > 1).
use rule best_of_n as best_of_n_part with:
    input:
        policy=rm_policy_model,
        problems="results/data/{task}/test.jsonl",
        bt=reward_model("bt"),
        orm=reward_model("orm"),
        prm=reward_model("prm"),
    output:
        temp(directory("results/search/{task}/best-of-n.parts/{part}")),
    log:
        "logs/search/{task}/best-of-n.part{part}.log",
    benchmark:
        "benchmarks/search/{task}/best-of-n.part{part}.tsv"
    params:
        out_dir="results/search/{task}/best-of-n.parts/{part}",
        split=part_arg("best_of_n"),


rule hgs_search:
    input:
        policy=rm_policy_model,
        prm=reward_model("prm"),
        problems="results/data/{task}/test.jsonl",
        scores="results/search/{task}/best-of-n/scores.jsonl",
        parts=split_parts("hgs_search", "results/search/{task}/hgs.parts/{part}"),
    output:
        metrics="results/search/{task}/hgs/hgs.json",
        csv="results/search/{task}/hgs/hgs.csv",
        trajectories="results/search/{task}/hgs/trajectories.jsonl",
        matched="results/search/{task}/hgs/matched.jsonl",
        matched_scores="results/search/{task}/hgs/matched_scores.jsonl",
        manifest="results/search/{task}/hgs/manifest.json",
    log:
        "logs/search/{task}/hgs.log",
    benchmark:
        "benchmarks/search/{task}/hgs.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("hgs_search")
    threads: torch_threads
    params:
        config=lambda wildcards: config_json(
            "reward_models",
            "policy",
            "rollout",
            "generation",
            "sandbox",
            "tasks",
            task=wildcards.task,
        ),
        best_of_n=subpath(input.scores, parent=True),
        out_dir=subpath(output.manifest, parent=True),
        split=parts_arg,
    shell:
        "reasonrl hgs-search --config-json {params.config} --policy {input.policy:q}"
        " --prm {input.prm:q} --problems {input.problems:q}"
        " --best-of-n {params.best_of_n:q} --out-dir {params.out_dir:q} {params.split}"
        " > {log:q} 2>&1"


# One share of hgs_search's shards (config split.hgs_search > 1).
use rule hgs_search as hgs_search_part with:
    input:
        policy=rm_policy_model,
        prm=reward_model("prm"),
        problems="results/data/{task}/test.jsonl",
        scores="results/search/{task}/best-of-n/scores.jsonl",
    output:
        temp(directory("results/search/{task}/hgs.parts/{part}")),
    log:
        "logs/search/{task}/hgs.part{part}.log",
    benchmark:
        "benchmarks/search/{task}/hgs.part{part}.tsv"
    params:
        out_dir="results/search/{task}/hgs.parts/{part}",
        split=part_arg("hgs_search"),


rule reward_tables:
    input:
        best_of_n=expand(
            "results/search/{task}/best-of-n/best_of_n.json", task=rm_tasks()
        ),
        hgs=expand("results/search/{task}/hgs/hgs.json", task=hgs_tasks()),
        prm=rm_table_prms(),
    output:
        markdown="results/report/reward_models/reward_models.md",
        best_of_n="results/report/reward_models/best_of_n.csv",
        hgs="results/report/reward_models/hgs.csv",
        prm="results/report/reward_models/prm_precision_recall.csv",
    log:
        "logs/report/reward_models.log",
    benchmark:
        "benchmarks/report/reward_models.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("reward_tables")
    params:
        config=config_json("reward_models"),
        hgs=lambda wildcards, input: " ".join(map(shlex.quote, input.hgs)),
        out_dir=subpath(output.markdown, parent=True),
    shell:
        "reasonrl reward-tables --config-json {params.config} --best-of-n {input.best_of_n:q}"
        " --hgs {params.hgs} --prm {input.prm:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
