# The base policy: built from scratch ("tiny") or converted from the bundled SmolLM2 GGUF
# ("smollm2"). Any other policy.base is a hub id or local folder that no rule produces.

if config["policy"]["base"] == "tiny":

    rule build_tiny_policy:
        input:
            corpus=tokenizer_corpus,
        output:
            directory(BASE_MODEL_DIR),
        log:
            "logs/models/base.log",
        benchmark:
            "benchmarks/models/base.tsv"
        conda:
            CONDA_ENV
        container:
            rule_container("build_tiny_policy")
        threads: torch_threads
        params:
            config=config_json("policy"),
            corpus=lambda wildcards, input: repeated_flag("--corpus", input.corpus),
        shell:
            "reasonrl build-tiny --config-json {params.config} {params.corpus}"
            " --out {output:q} > {log:q} 2>&1"

elif config["policy"]["base"] == "smollm2":

    rule convert_smollm2:
        output:
            directory(BASE_MODEL_DIR),
        log:
            "logs/models/base.log",
        benchmark:
            "benchmarks/models/base.tsv"
        conda:
            CONDA_ENV
        container:
            rule_container("convert_smollm2")
        threads: torch_threads
        params:
            config=config_json("policy"),
        shell:
            "reasonrl convert-gguf --config-json {params.config} --out {output:q} > {log:q} 2>&1"
