# Supervised fine-tuning of the base policy on gold solutions, one policy per entry of
# sft.variants (a solution style - tool-integrated, CoT-only - and its tasks). Resumable checkpoints go to the undeclared
# results/models/.sft-{variant}.ckpt, so a killed job resumes when rerun.


include: "helpers/sft.smk"


rule sft:
    input:
        model=policy_model_input("base"),
        train=sft_train_files,
    output:
        directory("results/models/sft-{variant}"),
    log:
        "logs/models/sft-{variant}.log",
    benchmark:
        "benchmarks/models/sft-{variant}.tsv"
    # SFT is the longest job: start both styles before the base policy's evaluation, which
    # then fills the core the shorter SFT frees (about 2 minutes less on 2 cores).
    priority: 10
    conda:
        CONDA_ENV
    container:
        rule_container("sft")
    threads: torch_threads
    params:
        config=sft_config_json,
        style=lambda wildcards: SFT_POLICIES[wildcards.variant]["style"],
        model=model_arg,
        train=lambda wildcards, input: repeated_flag("--train", input.train),
        launch=launcher,
    shell:
        "{params.launch} sft --config-json {params.config} --style {params.style}"
        " --model {params.model:q} {params.train} --out {output:q} > {log:q} 2>&1"
