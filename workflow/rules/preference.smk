# Online iterative preference learning (M-DPO, M-KTO and baselines), one round per wildcard:
# augment prompts -> sample round r with the tool loop (mixture of rounds r-1 and r-2) ->
# label pairs -> cache reference log-probs -> train {method}-round{r} -> held-out selection.
# Methods and their round counts are config (preference.variants); ablations add entries.


include: "helpers/preference.smk"


wildcard_constraints:
    round=r"\d+",
    lineage=r"[a-z][a-z0-9.-]*",
    method=r"[a-z][a-z0-9.-]*",


rule augment_prompts:
    input:
        train=prompt_source("preference"),
        sources=train_files(PREFERENCE["prompts"]["sources"]),
        eval_sets=expand(
            "results/data/{eval_task}/test.jsonl",
            eval_task=config["evaluation"]["tasks"],
        ),
    output:
        rounds=expand(
            "results/prompts/{{task}}/round{r}.jsonl",
            r=range(1, max_preference_round() + 1),
        ),
        selection="results/prompts/{task}/selection.jsonl",
        stats="results/prompts/{task}/stats.json",
        manifest="results/prompts/{task}/manifest.json",
    log:
        "logs/prompts/{task}.log",
    benchmark:
        "benchmarks/prompts/{task}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("augment_prompts")
    params:
        config=preference_shared_json("generation", "policy", parts=["prompts"]),
        rounds=max_preference_round(),
        eval_sets=lambda wildcards, input: repeated_flag(
            "--eval-set",
            [
                f"{t}={p}"
                for t, p in zip(config["evaluation"]["tasks"], input.eval_sets)
            ],
        ),
        sources=lambda wildcards, input: repeated_flag(
            "--source",
            [
                f"{t}={p}"
                for t, p in zip(PREFERENCE["prompts"]["sources"], input.sources)
            ],
        ),
        out_dir=subpath(output.manifest, parent=True),
    shell:
        "reasonrl augment-prompts --config-json {params.config} --task {wildcards.task:q}"
        " --train {input.train:q} {params.sources} {params.eval_sets} --rounds {params.rounds}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule sample_round:
    input:
        gate=calibration_gate(),
        prompts=f"results/prompts/{PREFERENCE['task']}/round{{round}}.jsonl",
        models=sampler_models,
        parts=split_parts(
            "sample_round", "results/rollouts/{lineage}/round{round}.parts/{part}"
        ),
    output:
        samples="results/rollouts/{lineage}/round{round}/samples.jsonl",
        stats="results/rollouts/{lineage}/round{round}/sampling.json",
        manifest="results/rollouts/{lineage}/round{round}/manifest.json",
    log:
        "logs/rollouts/{lineage}/round{round}.log",
    benchmark:
        "benchmarks/rollouts/{lineage}/round{round}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("sample_round")
    threads: torch_threads
    params:
        config=preference_shared_json(
            "rollout", "generation", "sandbox", "policy", parts=["sampling"]
        ),
        samplers=sampler_args,
        style=policy_style(ROUND0_POLICY),
        out_dir=subpath(output.manifest, parent=True),
        split=parts_arg,
    shell:
        "reasonrl sample-round --config-json {params.config} --prompts {input.prompts:q}"
        " {params.samplers} --round {wildcards.round} --style {params.style} {params.split}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


# One share of sample_round's shards (config split.sample_round > 1).
use rule sample_round as sample_round_part with:
    input:
        gate=calibration_gate(),
        prompts=f"results/prompts/{PREFERENCE['task']}/round{{round}}.jsonl",
        models=sampler_models,
    output:
        temp(directory("results/rollouts/{lineage}/round{round}.parts/{part}")),
    log:
        "logs/rollouts/{lineage}/round{round}.part{part}.log",
    benchmark:
        "benchmarks/rollouts/{lineage}/round{round}.part{part}.tsv"
    params:
        out_dir="results/rollouts/{lineage}/round{round}.parts/{part}",
        split=part_arg("sample_round"),


rule label_preferences:
    input:
        samples="results/rollouts/{lineage}/round{round}/samples.jsonl",
    output:
        pairs="results/preference/{lineage}/round{round}/pairs.jsonl",
        unpaired="results/preference/{lineage}/round{round}/unpaired.jsonl",
        winners="results/preference/{lineage}/round{round}/winners.jsonl",
        stats="results/preference/{lineage}/round{round}/stats.json",
        manifest="results/preference/{lineage}/round{round}/manifest.json",
    log:
        "logs/preference/{lineage}/round{round}.log",
    benchmark:
        "benchmarks/preference/{lineage}/round{round}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("label_preferences")
    params:
        config=preference_shared_json(parts=["labelling"]),
        out_dir=subpath(output.manifest, parent=True),
    shell:
        "reasonrl label-preferences --config-json {params.config} --samples {input.samples:q}"
        " --round {wildcards.round} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule reference_logps:
    input:
        model=lambda wildcards: f"results/models/{reference_policy(wildcards)}",
        labels=lambda wildcards: f"{labelled_dir(wildcards.method, wildcards.round)}/stats.json",
    output:
        reference="results/reference/{method}/round{round}/reference.jsonl",
        manifest="results/reference/{method}/round{round}/manifest.json",
    log:
        "logs/reference/{method}/round{round}.log",
    benchmark:
        "benchmarks/reference/{method}/round{round}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("reference_logps")
    threads: torch_threads
    params:
        config=lambda wildcards: preference_config_json(wildcards.method, "policy"),
        data=subpath(input.labels, parent=True),
        launch=launcher,
    shell:
        "{params.launch} reference-logps --config-json {params.config}"
        " --variant {wildcards.method:q}"
        " --model {input.model:q} --data {params.data:q} --out {output.reference:q} > {log:q} 2>&1"


rule preference_train:
    input:
        model=lambda wildcards: f"results/models/{round_policy(wildcards.method, int(wildcards.round) - 1)}",
        labels=lambda wildcards: f"{labelled_dir(wildcards.method, wildcards.round)}/stats.json",
        reference=reference_input,
    output:
        directory("results/models/{method}-round{round}"),
    log:
        "logs/models/{method}-round{round}.log",
    benchmark:
        "benchmarks/models/{method}-round{round}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("preference_train")
    threads: torch_threads
    params:
        config=lambda wildcards: preference_config_json(wildcards.method, "policy"),
        data=subpath(input.labels, parent=True),
        reference=reference_arg,
        launch=launcher,
    shell:
        "{params.launch} preference-train --config-json {params.config}"
        " --variant {wildcards.method:q}"
        " --model {input.model:q} --data {params.data:q} {params.reference}"
        " --out {output:q} > {log:q} 2>&1"


rule evaluate_selection:
    input:
        model="results/models/{policy}",
        problems="results/prompts/{task}/selection.jsonl",
    output:
        trajectories="results/selection/{policy}/{task}/trajectories.jsonl",
        metrics="results/selection/{policy}/{task}/metrics.json",
        table="results/selection/{policy}/{task}/metrics.csv",
        manifest="results/selection/{policy}/{task}/manifest.json",
    log:
        "logs/selection/{policy}/{task}.log",
    benchmark:
        "benchmarks/selection/{policy}/{task}.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("evaluate_selection")
    threads: torch_threads
    params:
        config=lambda wildcards: selection_config_json(wildcards.task),
        style=lambda wildcards: policy_style(wildcards.policy),
        out_dir=subpath(output.metrics, parent=True),
    shell:
        "reasonrl evaluate --config-json {params.config} --model {input.model:q}"
        " --style {params.style} --task {wildcards.task:q} --problems {input.problems:q}"
        " --policy {wildcards.policy:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule select_best:
    input:
        selection=lambda wildcards: selection_metrics(wildcards.method),
    output:
        best="results/selection/{method}-best/best.json",
        table="results/selection/{method}-best/best.csv",
    log:
        "logs/selection/{method}-best.log",
    benchmark:
        "benchmarks/selection/{method}-best.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("select_best")
    params:
        out_dir=subpath(output.best, parent=True),
    shell:
        "reasonrl select-best --selection {input.selection:q} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"


rule preference_table:
    input:
        metrics=[path for _, _, path in table_rows()],
        best=expand(
            "results/selection/{method}-best/best.json", method=preference_methods()
        ),
    output:
        csv="results/report/preference/table.csv",
        md="results/report/preference/table.md",
    log:
        "logs/report/preference.log",
    benchmark:
        "benchmarks/report/preference.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("preference_table")
    params:
        rows=table_row_args,
        out_dir=subpath(output.csv, parent=True),
    shell:
        "reasonrl preference-table {params.rows} --best {input.best:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
