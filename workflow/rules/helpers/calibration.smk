# Helpers of calibration.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


def calibration_trajectories(band):
    """The start policy's evaluation trajectories on calibration.`band` (easy_task, frontier_task)."""
    return (
        f"results/eval/{CALIBRATION['policy']}/{CALIBRATION[band]}/trajectories.jsonl"
    )


def calibration_config_json():
    """The calibrate stage's config: the calibration section less enforce (read by the gate
    alone) and the temperature its samples were drawn at."""
    section = {k: v for k, v in CALIBRATION.items() if k != "enforce"}
    evaluation = {"temperature": config["evaluation"]["temperature"]}
    reduced = {"seed": config["seed"], "calibration": section, "evaluation": evaluation}
    return json_param(reduced)


def method_temperatures():
    """Config key -> sampling temperature of each method this config runs from an SFT policy."""
    methods = [
        (
            "preference.sampling.temperature",
            PREFERENCE["variants"],
            PREFERENCE["sampling"],
        ),
        ("online_dpo.temperature", ONLINE["variants"], ONLINE),
        ("reward_models.temperature", rm_tasks(), config["reward_models"]),
        ("ppo.temperature", PPO["variants"], PPO),
    ]
    return {key: section["temperature"] for key, runs, section in methods if runs}


def method_temperature_args():
    return repeated_flag(
        "--method-temperature", [f"{k}={t}" for k, t in method_temperatures().items()]
    )
