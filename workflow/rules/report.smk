# Tables and plots over every evaluation and SFT run; also shown by `snakemake --report`.


include: "helpers/report.smk"


rule report:
    input:
        metrics=eval_metrics(),
        sft_models=sft_models(),
        trajectories=list(comparison_arms().values()),
        best=list(comparison_best_files().values()),
        search=comparison_search_files(),
        calibration=calibration_report_input(),
    output:
        **comparison_outputs(),
        summary_csv=report(
            "results/report/summary.csv",
            caption="../report/summary.rst",
            category="Evaluation",
        ),
        summary_md="results/report/summary.md",
        index="results/report/index.md",
        pass_at_1=report(
            "results/report/pass_at_1.png",
            caption="../report/pass_at_1.rst",
            category="Evaluation",
        ),
        pass_at_k=report(
            "results/report/pass_at_k.png",
            caption="../report/pass_at_k.rst",
            category="Evaluation",
        ),
        sft_loss=report(
            "results/report/sft_loss.png",
            caption="../report/sft_loss.rst",
            category="Training",
        ),
    log:
        "logs/report.log",
    benchmark:
        "benchmarks/report.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("report")
    params:
        config=config_json("evaluation", "comparisons"),
        train_metrics=sft_train_metrics,
        comparisons=comparison_args,
        calibration=calibration_report_arg,
        out_dir=subpath(output.index, parent=True),
    shell:
        "reasonrl report --config-json {params.config} --metrics {input.metrics:q}"
        " --train-metrics {params.train_metrics} {params.comparisons} {params.calibration}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


# Every result table as an HTML page and the best-of-N and round curves, for `snakemake --report`.
rule report_pages:
    input:
        tables=list(report_tables().values()),
        curves=[path for paths in report_curve_inputs().values() for path in paths],
    output:
        **report_curve_outputs(),
        tables=report(
            directory("results/report/pages/tables"),
            patterns=["{name}.html"],
            caption="../report/tables.rst",
            category="Tables",
        ),
    log:
        "logs/report/pages.log",
    benchmark:
        "benchmarks/report/pages.tsv"
    conda:
        CONDA_ENV
    container:
        rule_container("report_pages")
    params:
        args=report_pages_args,
        out_dir=subpath(output.tables, parent=True),
    shell:
        "reasonrl report-pages {params.args} --out-dir {params.out_dir:q} > {log:q} 2>&1"
