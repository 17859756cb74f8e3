# The memory plan (reasonrl.memory_plan): when a rule's job asks for GPUs (resource gpu, from
# the profile), every GPU rule of this config must fit its job's GPUs (resources deepspeed and
# gpu_mem_mb too), else the workflow stops here with one line naming the rule, before any job
# is submitted; so must a launched rule's global_batch_size divide by its batch_size x GPUs,
# a rule that sends its whole policy to a generator (online_dpo) not ask for ZeRO-3, and ppo
# not ask for vLLM over several GPUs.
# The CLI verb `plan --configfile F --profile P` prints the whole table. Included
# after every rule, so it sees their resources.


include: "helpers/plan.smk"


try:
    GPU_PLACEMENTS = gpu_placements()
    if GPU_PLACEMENTS:
        check_global_batches(config, GPU_PLACEMENTS, config_files)
        check_launches(config, GPU_PLACEMENTS, config_files)
        check_fits(plan_config(config, GPU_PLACEMENTS), config_files)
except ReasonRLError as err:
    exit_with(err)
