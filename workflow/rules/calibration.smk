# Calibration between SFT and the post-SFT methods (config calibration; off while
# calibration.frontier_task is null): the start policy's headroom from its evaluation
# trajectories on the easy and frontier tasks, then the gate every method starting from an
# SFT policy waits for. Two rules: Snakemake deletes a failed job's outputs, and the measures
# of a failed gate are what the user needs to see.


include: "helpers/calibration.smk"


rule calibrate:
    input:
        easy=calibration_trajectories("easy_task"),
        frontier=calibration_trajectories("frontier_task"),
    output:
        json="results/report/calibration.json",
        csv="results/report/calibration.csv",
    log:
        "logs/report/calibration.log",
    benchmark:
        "benchmarks/report/calibration.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("calibrate")
    params:
        config=calibration_config_json(),
        temperatures=method_temperature_args(),
        out_dir=subpath(output.json, parent=True),
    shell:
        "reasonrl calibrate --config-json {params.config} --easy {input.easy:q}"
        " --frontier {input.frontier:q} {params.temperatures}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule calibration_gate:
    input:
        calibration=rules.calibrate.output.json,
    output:
        CALIBRATION_GATE,
    log:
        "logs/report/calibration_gate.log",
    benchmark:
        "benchmarks/report/calibration_gate.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("calibration_gate")
    params:
        config=config_json("calibration"),
    shell:
        "reasonrl calibration-gate --config-json {params.config}"
        " --calibration {input.calibration:q} --out {output:q} > {log:q} 2>&1"
