"""GPU memory plan of a config: per GPU rule, the bytes of parameters, gradients, optimizer
states, activations and the other models or engine it holds, under its job's GPUs and ZeRO
stage, against the memory of one GPU.

Model states follow the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3.1): mixed
precision AdamW holds 2 bytes of bf16 weights, 2 of gradients and 12 of fp32 master weights,
momentum and variance per trained parameter (16 in all; fp32 training: 4 + 4 + 8); 8-bit
AdamW keeps momentum and variance in 1 byte each, plus an fp32 scale per block of 256.
Without DeepSpeed the training loop holds the trained parameters themselves in fp32 (4 bytes
of weights, 4 of gradients, 8 of moments): the same 16, measured within 0.92x-1.06x of
torch.cuda.max_memory_allocated on an H100 (BENCHMARKS.md, 2026-11-28).
QLoRA's base (lora.quantize nf4) holds each decoder linear in 4-bit NormalFloat: half a byte
per weight, a 1-byte scale per block of 64 and an fp32 scale per 256 of those (double
quantization), plus the two code books; the rest of the model and the adapters are fp32 (as
peft's prepare_model_for_kbit_training casts them). ZeRO-1 divides the optimizer states over
the job's GPUs, ZeRO-2 the gradients too, ZeRO-3 the parameters too (frozen models included,
as DeepSpeed's ZeRO-3 does for every prepared model; PPO shards its frozen reference and
reward model as its policy, and samples with its policy gathered whole beside the shards,
unless its generator has a GPU of its own). LoRA trains only the adapters. A generator on a
GPU of its own (resource generator_gpus: online DPO's, PPO's) is planned on that GPU: one
copy of the policy and its KV cache (vLLM: within its reservation).

Activations are the tensors autograd saves for the backward pass, counted the way Korthikanti
et al. 2022 (section 4) count them, for the Hugging Face Llama/Mistral/Gemma decoder block
with SDPA attention (no stored attention scores, so no a*s^2 term) and no dropout; bytes per
token and layer, e = 2 (bf16 autocast) or 4 (fp32):
    norms  2 * (4h + 2*e*h)    RMSNorm: its fp32 input, the normalised input, the output
    attn   e * (3*a*d + 2*k*d) queries, keys, values, SDPA output and o_proj's input
    mlp    4 * e * i           gate and up outputs, SiLU output, down_proj's input
(h hidden, a heads, k key-value heads, d head size, i intermediate size). The head saves
the final norm's and the fp32 log-softmax of the logits (4 bytes per vocabulary entry).
With gradient checkpointing a layer keeps only its input (e*h per token). On top of what is
saved, the plan counts the transient peaks: the logits themselves (e bytes per vocabulary
entry, beside their fp32 log-softmax) and, with checkpointing, the one layer recomputed at a
time. A frozen model's forward keeps nothing: its peak is one layer's working set and the
logits. tests/test_memory_plan.py checks the saved bytes against the tensors autograd saves
for the tiny policy (fp32, bf16, checkpointed).

Architectures come from a local model folder's config.json when there is one, else from the
published configurations of the models the recipes name (PUBLISHED); nothing is downloaded.
The reward models have their own (reward_models.base: the policy's unless it names another
model), trained in train_reward_model and frozen where they score (best-of-N, HGS, PPO's R2
and the PPO and online learners' BT-RM reward).
"""

from reasonrl.memory_plan.checks import (
    BATCH_SECTIONS,
    CHECKED_LAUNCHES,
    buffer_steps_message,
    check_fits,
    check_global_batches,
    check_launches,
    check_ppo_buffers,
    first_misfit,
    misfit_message,
)
from reasonrl.memory_plan.plan import (
    GIB,
    GPU_BYTES,
    LAUNCHED_RULES,
    LORA_TARGETS,
    OVERHEAD_BYTES,
    PUBLISHED,
    REFERENCE_ROWS,
    WHOLE_POLICY_RULES,
    Architecture,
    OnlineLearner,
    Placement,
    PPOLearner,
    RulePlan,
    RuleSpec,
    Trained,
    activation_bytes,
    architecture,
    buffer_rows,
    from_hf_config,
    learner_gpus_per_node,
    model_state_bytes,
    online_learner,
    placement,
    plan_config,
    plan_rows,
    ppo_learner,
    profile_placements,
    rm_architecture,
    saved_activation_bytes,
)

__all__ = [
    "BATCH_SECTIONS",
    "CHECKED_LAUNCHES",
    "GIB",
    "GPU_BYTES",
    "LAUNCHED_RULES",
    "LORA_TARGETS",
    "OVERHEAD_BYTES",
    "PUBLISHED",
    "REFERENCE_ROWS",
    "WHOLE_POLICY_RULES",
    "Architecture",
    "OnlineLearner",
    "PPOLearner",
    "Placement",
    "RulePlan",
    "RuleSpec",
    "Trained",
    "activation_bytes",
    "architecture",
    "buffer_rows",
    "buffer_steps_message",
    "check_fits",
    "check_global_batches",
    "check_launches",
    "check_ppo_buffers",
    "first_misfit",
    "from_hf_config",
    "learner_gpus_per_node",
    "misfit_message",
    "model_state_bytes",
    "online_learner",
    "placement",
    "plan_config",
    "plan_rows",
    "ppo_learner",
    "profile_placements",
    "rm_architecture",
    "saved_activation_bytes",
]
