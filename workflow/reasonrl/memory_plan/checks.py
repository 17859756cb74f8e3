"""The checks a config's plan runs before any job is submitted (the dry run's, `reasonrl
plan`'s): each launched rule's global batch divides over its job's GPUs, PPO's buffer is whole
optimizer steps, a rule launched over several GPUs can run so, and every rule fits its GPUs.
Each raises the one line the job would otherwise stop with after the jobs before it ran."""

from __future__ import annotations

from reasonrl.errors import ReasonRLError
from reasonrl.memory_plan.plan import (
    GIB,
    WHOLE_POLICY_RULES,
    Placement,
    RulePlan,
    online_learner,
    ppo_learner,
)

# Launched rules whose launch check_launches checks.
CHECKED_LAUNCHES = ("online_dpo", "ppo")


# Each launched training rule's section, whose global_batch_size its job's GPUs must divide
# (training.loop.with_accumulation).
BATCH_SECTIONS = {
    "sft": ("sft",),
    "preference_train": ("preference", "train"),
    "train_reward_model": ("reward_models", "train"),
    "ppo": ("ppo",),
}


def check_global_batches(config: dict, placements: dict[str, Placement], source: str) -> None:
    """Raise the one-line error of the first launched rule whose global_batch_size is not a
    multiple of batch_size x its job's GPUs: its job would stop there, after the jobs
    before it had run."""
    for rule, path in BATCH_SECTIONS.items():
        section = config
        for part in path:
            section = section[part]
        wanted, size = section["global_batch_size"], section["batch_size"]
        place = placements.get(rule, Placement(0))
        gpus = max(1, place.gpus) if place.launched else 1
        if wanted is not None and wanted % (size * gpus):
            raise ReasonRLError(
                f"{source}: '{'.'.join(path)}.global_batch_size' ({wanted}) is not a multiple"
                f" of batch_size x GPUs of rule {rule} ({size} x {gpus})"
            )
    check_ppo_buffers(config, placements, source)


def check_ppo_buffers(config: dict, placements: dict[str, Placement], source: str) -> None:
    """Raise the one-line error of the first ppo variant whose buffer (its nominal rows an
    iteration, as ppo_run.rows_per_iteration counts them) is not a whole number of optimizer
    steps over rule ppo's job (batch_size x its accumulation x the learner's GPUs): each
    epoch's last step would wrap round and train rows twice (ppo_run.check_buffer_steps stops
    the stage likewise). Run by check_global_batches, after the global batch divides."""
    learner = ppo_learner(config)
    if learner is None:
        return
    place = placements.get("ppo", Placement(0))
    gpus = max(1, place.gpus) if place.launched else 1
    size, wanted = learner.batch_size, learner.global_batch_size
    accum = wanted // (size * gpus) if wanted is not None else learner.grad_accum
    step = size * accum * gpus
    for name, rows in learner.buffers:
        if rows % step:
            raise ReasonRLError(f"{source}: {buffer_steps_message(name, rows, size, accum, gpus)}")


def buffer_steps_message(variant: str, rows: int, size: int, accum: int, gpus: int) -> str:
    """The line a ppo variant whose buffer is not whole optimizer steps fails with."""
    parts = [f"ppo.batch_size {size}"] + [f"{accum} accumulated"] * (accum > 1)
    parts.append(f"{gpus} GPUs")
    return (
        f"ppo variant '{variant}' trains {rows} buffer rows an iteration, not a multiple of an"
        f" optimizer step's {size * accum * gpus} ({' x '.join(parts)}): an epoch would train"
        " rows twice; set ppo.prompts_per_iteration or ppo.global_batch_size"
    )


def check_launches(config: dict, placements: dict[str, Placement], source: str) -> None:
    """Raise the one-line error of the first rule launched over several GPUs in a way it
    cannot run: ZeRO-3 for WHOLE_POLICY_RULES, a vLLM engine in each of PPO's processes (not
    on a GPU of its own), an online learner whose step's micro-batches do not share out
    over the GPUs."""
    engine = config["generation"]["engine"]
    for rule in CHECKED_LAUNCHES:
        place = placements.get(rule, Placement(0))
        # the rule's section is named as the rule; without variants the config runs none
        if not (config[rule]["variants"] and place.launched and place.gpus > 1):
            continue
        if place.zero >= 3 and rule in WHOLE_POLICY_RULES:
            raise ReasonRLError(
                f"{source}: rule {rule} cannot run under DeepSpeed ZeRO-3"
                f" ({WHOLE_POLICY_RULES[rule]}): give it resource deepspeed: zero2"
            )
        if rule == "online_dpo":
            micro = online_learner(config).micro_batches
            if micro % place.gpus:
                raise ReasonRLError(
                    f"{source}: rule online_dpo over {place.gpus} GPUs: a step's {micro}"
                    " micro-batches (online_dpo.prompts_per_step / micro_batch_prompts) do not"
                    " share out over them"
                )
        if rule == "ppo" and engine != "hf" and not place.generator_own_gpu:
            raise ReasonRLError(
                f"{source}: rule {rule} over {place.gpus} GPUs samples with the hf engine, not"
                f" generation.engine {engine} (one engine per job): give it resource"
                " generator_gpus: 1"
            )


def first_misfit(plans: list[RulePlan]) -> RulePlan | None:
    return next((p for p in plans if not p.fits), None)


def check_fits(plans: list[RulePlan], source: str) -> None:
    """Raise the one-line error of the first rule that does not fit its job's GPUs."""
    misfit = first_misfit(plans)
    if misfit is not None:
        raise ReasonRLError(misfit_message(misfit, source))


def misfit_message(plan: RulePlan, source: str) -> str:
    """The one line a recipe that cannot fit fails with."""
    if plan.generator > plan.generator_memory:
        return (
            f"{source}: rule {plan.rule}'s generator needs {plan.generator / GIB:.1f} GiB on its"
            f" own GPU, over the {plan.generator_memory / GIB:.1f} GiB it may use ('reasonrl"
            " plan' prints the table)"
        )
    if plan.gpus_needed:
        need = f"it needs {plan.gpus_needed} such GPUs"
    elif plan.launched:
        need = "no job of up to 64 such GPUs fits it"
    else:
        need = "it runs on one GPU (not launched over several)"
    return (
        f"{source}: rule {plan.rule} needs {plan.total / GIB:.1f} GiB per GPU on {plan.gpus}"
        f" GPU(s) (ZeRO-{plan.zero}), over the {plan.gpu_memory / GIB:.1f} GiB it may use;"
        f" {need} ('reasonrl plan' prints the table)"
    )
