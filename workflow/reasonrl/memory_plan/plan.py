"""The plan itself: a model's architecture, what each GPU rule of a config trains and holds
(RuleSpec), and the bytes of its model states, activations and other models on its job's GPUs
(RulePlan); the package's docstring gives the accounting."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from reasonrl.config import sft_policies
from reasonrl.errors import ReasonRLError

GIB = 1024**3
# CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation, per GPU (a measured CUDA
# context alone is 0.3-0.6 GiB; DeepSpeed's bucket buffers add about 1 GiB).
OVERHEAD_BYTES = 2 * GIB
# Memory of one GPU when the profile does not say (resource gpu_mem_mb): an A100/H100 80GB.
GPU_BYTES = 80 * GIB
# Rules that start under `accelerate launch` with DeepSpeed when their job has several GPUs
# (the `launch=launcher` param in workflow/rules/); the others use one GPU whatever the job
# holds. A launched rule that trains nothing (reference_logps) holds a whole model on each of
# its GPUs, each scoring its part of the rows. tests/test_memory_plan.py keeps this in step
# with the rules.
LAUNCHED_RULES = frozenset(
    {"sft", "preference_train", "train_reward_model", "reference_logps", "ppo", "online_dpo"}
)
# Launched rules that use a process's whole policy beside training, so run under DeepSpeed
# ZeRO-2 at most: the online learner sends the main process's to its generator. (PPO samples
# with each process's policy gathered whole for the sampling, or sends its generator the
# policy gathered one parameter at a time: it runs under ZeRO-3.)
WHOLE_POLICY_RULES = {
    "online_dpo": "its generator is sent the main process's whole policy",
}
# Rows of one reference forward: sequences.summed_logps and token_logps score in chunks of
# this many (their batch_size), whatever the rows to score; the online learner in chunks of
# online_dpo.reference_rows.
REFERENCE_ROWS = 16
# The linears of a Llama-style layer, where LoRA puts adapters unless told otherwise (the
# schema's default lora.target_modules).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shape (the Llama family's parameter layout)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    head_dim: int = 0  # 0: hidden // heads
    source: str = ""

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def params(self) -> int:
        """Embedding, decoder layers (attention, gated MLP, two norms), final norm, head."""
        h, d = self.hidden, self.d
        attention = h * self.heads * d * 2 + h * self.kv_heads * d * 2
        layer = attention + 3 * h * self.intermediate + 2 * h
        head = 0 if self.tied else self.vocab * h
        return self.vocab * h + self.layers * layer + h + head

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of every linear of one layer by its module name (LoRA's targets)."""
        h, d, i = self.hidden, self.d, self.intermediate
        q, kv = self.heads * d, self.kv_heads * d
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def kv_bytes_per_token(self, e: int) -> int:
        return 2 * self.layers * self.kv_heads * self.d * e

    def layer_activation_bytes(self, e: int) -> int:
        """Saved-for-backward bytes per token of one decoder layer (formula in the docstring)."""
        h, a, k, d = self.hidden, self.heads, self.kv_heads, self.d
        return 2 * (4 * h + 2 * e * h) + e * (3 * a * d + 2 * k * d) + 4 * e * self.intermediate

    def head_activation_bytes(self, e: int) -> int:
        """Saved-for-backward bytes per token of the final norm and the fp32 log-softmax."""
        return 4 * self.hidden + 2 * e * self.hidden + 4 * self.vocab


# Published configurations (config.json on each model's hub page, as released) of the models
# the shipped recipes name, so a plan needs no download.
PUBLISHED = {
    "google/gemma-1.1-7b-it": Architecture(3072, 28, 16, 16, 24576, 256000, True, 256),
    "mistralai/Mistral-7B-v0.3": Architecture(4096, 32, 32, 8, 14336, 32768, False),
    "peiyi9979/mistral-7b-sft": Architecture(4096, 32, 32, 8, 14336, 32000, False),
    "deepseek-ai/deepseek-coder-6.7b-base": Architecture(4096, 32, 32, 32, 11008, 32256, False),
    "realtreetune/rho-1b-sft-GSM8K": Architecture(2048, 22, 32, 4, 5632, 32000, False),
    "smollm2": Architecture(576, 30, 9, 3, 1536, 49152, True),
    # the Dr. GRPO recipe's: Qwen2.5-1.5B's shape (the model card names it as the base model)
    "Qwen/Qwen2.5-Math-1.5B": Architecture(1536, 28, 12, 2, 8960, 151936, True),
    # the multi-node PF-PPO recipe's (config/multi-node-pfppo-qwen2.5-14b.yaml)
    "Qwen/Qwen2.5-14B": Architecture(5120, 48, 40, 8, 13824, 152064, False),
}


def architecture(config: dict) -> Architecture:
    """The policy's architecture (policy.base)."""
    return base_architecture(config["policy"]["base"], config, "policy.base")


def rm_architecture(config: dict) -> Architecture:
    """The reward models' architecture: the policy's under reward_models.base `policy`, else
    that base's, resolved as policy.base is (so `tiny` is policy.tiny's shape)."""
    base = config["reward_models"]["base"]
    if base == "policy":
        return architecture(config)
    return base_architecture(base, config, "reward_models.base")


def base_architecture(base: str, config: dict, key: str) -> Architecture:
    """The architecture of model `base`: the tiny policy's config (policy.tiny), a local
    folder's config.json, or the published table; a hub id it does not know is a one-line
    error naming config key `key`."""
    if base == "tiny":
        t = config["policy"]["tiny"]
        shape = (t["hidden_size"], t["num_layers"], t["num_heads"], t["num_kv_heads"])
        return Architecture(
            *shape, t["intermediate_size"], t["vocab_size"], True, source="policy.tiny"
        )
    local = Path(base).expanduser() / "config.json"
    if local.is_file():
        return from_hf_config(json.loads(local.read_text(encoding="utf-8")), str(local))
    if base in PUBLISHED:
        return replace(PUBLISHED[base], source=f"published config of {base}")
    raise ReasonRLError(
        f"config key '{key}': no architecture for '{base}' (not a local folder with"
        " config.json, nor in reasonrl.memory_plan.PUBLISHED)"
    )


def from_hf_config(cfg: dict, source: str) -> Architecture:
    heads = cfg["num_attention_heads"]
    return Architecture(
        hidden=cfg["hidden_size"],
        layers=cfg["num_hidden_layers"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        intermediate=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        tied=cfg.get("tie_word_embeddings", False),
        head_dim=cfg.get("head_dim") or 0,
        source=source,
    )


@dataclass(frozen=True)
class Trained:
    """A model a rule trains: its precision, optimizer, LoRA rank and checkpointing."""

    precision: str  # fp32 or bf16 (mixed: bf16 compute, fp32 master weights)
    sequences: int  # per micro-batch and GPU
    length: int  # tokens per sequence
    optimizer: str = "adamw"  # adamw or adamw8bit
    lora_rank: int = 0  # 0: full fine-tuning
    checkpointing: bool = False
    lora_targets: tuple[str, ...] = LORA_TARGETS  # the linears with adapters
    quantized: bool = False  # QLoRA: the base's decoder linears in 4-bit NormalFloat
    rm_backbone: bool = False  # of the reward models' architecture, not the policy's


@dataclass(frozen=True)
class RuleSpec:
    """What one rule holds on its GPUs: trained models, frozen models, a generator. Not
    counted: host memory (a job's mem_mb: e.g. each PPO process loads its policy, reference,
    RM and critic trunk on the CPU before they reach its GPU, docs/cluster.md sizes it), and, for
    PPO, the policy gathered whole outside a step (keep_if_best, restore_best and
    policy_state under ZeRO-3, while no activations are held) and the RM scoring forward's
    and the reference's logits (smaller than a training step's activations)."""

    rule: str
    trained: list[Trained]
    frozen: int = 0  # frozen copies of the policy (reference)
    frozen_rm: int = 0  # frozen reward models, of the reward models' architecture
    # ... held whole by the rule's generator process (online DPO's reward): on the generator's
    # own GPU where it has one, else beside the learner
    generator_rm: int = 0
    gathered: int = 0  # trained models gathered whole beside their ZeRO-3 shards (sampling)
    # ... where the generator has a GPU of its own: those gathered whole to be sent to it
    # (LoRA's merged weights; a plain policy goes one parameter at a time)
    sent_whole: int = 0
    engine_copies: int = 0  # models an HF engine holds beside the rule's others
    frozen_tokens: int = 0  # tokens of one frozen forward (its logits are held)
    kv_tokens: int = 0  # tokens of an HF engine's KV cache
    vllm_share: float = 0.0  # share of the GPU a vLLM engine reserves (weights + KV cache)
    vllm_copies: int = 0  # models the vLLM engines of the rule hold
    vllm_tokens: int = 0  # KV cache of one sequence: the least an engine must hold
    note: str = ""


@dataclass(frozen=True)
class Placement:
    """A rule's job: GPUs (0: no GPU asked) and the memory of each, ZeRO stage, whether it is
    launched over them, and whether its vLLM generator has GPUs of its own."""

    gpus: int
    zero: int = 2
    launched: bool = False
    generator_own_gpu: bool = False
    gpu_bytes: float = GPU_BYTES
    nodes: int = 1


@dataclass
class RulePlan:
    rule: str
    gpus: int
    zero: int
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    gpu_memory: float
    gpus_needed: int | None
    note: str = ""
    launched: bool = False
    generator: float = 0.0  # on the generator's own GPU (0: it has none)
    generator_memory: float = 0.0
    nodes: int = 1
    fits: bool = field(init=False)
    total: float = field(init=False)

    def __post_init__(self) -> None:
        self.total = self.params + self.grads + self.optimizer + self.activations + self.other
        learner = self.gpus == 0 or self.total <= self.gpu_memory
        self.fits = learner and self.generator <= self.generator_memory


def _dtype_bytes(config: dict) -> int:
    return 2 if config["policy"]["dtype"] == "bfloat16" else 4


def model_state_bytes(arch: Architecture, t: Trained, weight_bytes: int, zero: int, n: int):
    """(params, grads, optimizer) bytes per GPU of one trained model over n GPUs."""
    total = arch.params()
    trainable = total
    if t.lora_rank:
        shapes = arch.linear_shapes()
        # A target outside the layer's linears (another architecture's name) adds nothing
        # here; the stage that loads the model rejects it.
        trainable = arch.layers * sum(
            t.lora_rank * sum(shapes[name]) for name in t.lora_targets if name in shapes
        )
    mixed = (t.precision == "bf16" or weight_bytes == 2) and not t.quantized
    grad_b = 2 if mixed else 4
    master = 4 if mixed else 0
    moments = 2 + 2 * 4 / 256 if t.optimizer == "adamw8bit" else 8
    if t.quantized:  # adapters and the unquantized rest in fp32
        linears = [i * o for i, o in arch.linear_shapes().values()]
        base = arch.layers * sum(map(nf4_bytes, linears))
        params = base + (total - arch.layers * sum(linears) + trainable) * 4
    else:
        params = total * weight_bytes + (trainable * (weight_bytes if t.lora_rank else 0))
    grads = trainable * grad_b
    optim = trainable * (master + moments)
    shard = max(1, n)
    return (
        params / (shard if zero >= 3 else 1),
        grads / (shard if zero >= 2 else 1),
        optim / (shard if zero >= 1 else 1),
    )


def nf4_bytes(weights: int) -> int:
    """Bytes of a linear's `weights` in bitsandbytes' 4-bit NormalFloat with double
    quantization: two weights per byte, a uint8 scale per block of 64, an fp32 scale per 256
    blocks, the 16- and 256-entry fp32 code books and the scales' fp32 offset."""
    blocks = -(-weights // 64)
    return weights // 2 + blocks + 4 * -(-blocks // 256) + 4 * (16 + 256 + 1)


def _compute_bytes(t: Trained, weight_bytes: int) -> int:
    """Bytes of an activation: 2 under bf16 weights or bf16 autocast, else 4."""
    return 2 if t.precision == "bf16" or weight_bytes == 2 else 4


def saved_activation_bytes(arch: Architecture, t: Trained, weight_bytes: int) -> float:
    """Bytes autograd saves for the backward pass of one micro-batch (module docstring)."""
    e = _compute_bytes(t, weight_bytes)
    kept = e * arch.hidden if t.checkpointing else arch.layer_activation_bytes(e)
    # Token ids saved by the embedding's backward: 8 bytes each.
    return t.sequences * t.length * (arch.layers * kept + arch.head_activation_bytes(e) + 8)


def activation_bytes(arch: Architecture, t: Trained, weight_bytes: int) -> float:
    """Peak activation bytes of one micro-batch: the saved tensors, the logits beside their
    log-softmax and, with checkpointing, the layer being recomputed."""
    e = _compute_bytes(t, weight_bytes)
    transient = e * arch.vocab + (arch.layer_activation_bytes(e) if t.checkpointing else 0)
    return saved_activation_bytes(arch, t, weight_bytes) + t.sequences * t.length * transient


def plan_rule(
    spec: RuleSpec,
    arch: Architecture,
    config: dict,
    place: Placement,
    rm_arch: Architecture,
) -> RulePlan:
    """The memory of `spec` per GPU under `place`, with the GPUs it needs (None: more than 64
    or a rule that uses one GPU only); `arch` is the policy's, `rm_arch` the reward models'."""
    plan = _plan(spec, arch, config, place, rm_arch)
    needed = None
    for n in range(1, 65) if place.launched and spec.trained else [1]:
        if _plan(spec, arch, config, replace(place, gpus=n), rm_arch).fits:
            needed = n
            break
    plan.gpus_needed = needed
    return plan


def _plan(
    spec: RuleSpec,
    arch: Architecture,
    config: dict,
    place: Placement,
    rm_arch: Architecture,
) -> RulePlan:
    weight_b = _dtype_bytes(config)
    # Only a launched training rule spreads over its GPUs; the others use one.
    n = place.gpus if place.launched and spec.trained else min(place.gpus, 1)
    zero = place.zero if place.launched and n > 1 else 0
    params = grads = optim = acts = 0.0
    for t in spec.trained:
        model = rm_arch if t.rm_backbone else arch
        p, g, o = model_state_bytes(model, t, weight_b, zero, n)
        params, grads, optim = params + p, grads + g, optim + o
        acts += activation_bytes(model, t, weight_b)
    # A trained rule's generator with a GPU of its own holds the engine there, not here.
    own = place.generator_own_gpu and bool(spec.trained)
    frozen_params = spec.frozen * arch.params() + spec.frozen_rm * rm_arch.params()
    frozen = frozen_params * weight_b / (n if zero >= 3 else 1)
    if not own:
        frozen += spec.generator_rm * rm_arch.params() * weight_b
    if zero >= 3:
        frozen += (spec.sent_whole if own else spec.gathered) * arch.params() * weight_b
    e = 2 if weight_b == 2 else 4
    forward = spec.frozen_tokens * (arch.layer_activation_bytes(e) + (e + 4) * arch.vocab)
    other = frozen + forward + OVERHEAD_BYTES
    if not own:
        other += spec.engine_copies * arch.params() * weight_b
        other += spec.kv_tokens * arch.kv_bytes_per_token(e)
    budget = place.gpu_bytes
    engine = spec.vllm_copies * arch.params() * weight_b
    engine += spec.vllm_tokens * arch.kv_bytes_per_token(e)
    if spec.vllm_share and not spec.trained:
        # A generation rule: the engines' weights and one sequence's KV cache within their
        # reservation (vLLM refuses to start otherwise).
        other += engine
        budget = place.gpu_bytes * spec.vllm_share
    elif spec.vllm_share and not own:
        budget = place.gpu_bytes * (1 - spec.vllm_share)  # the engine's reservation, same GPU
    generator = _generator_plan(spec, arch, rm_arch, weight_b, place) if own else (0.0, 0.0)
    return RulePlan(
        spec.rule,
        place.gpus,
        zero,
        params,
        grads,
        optim,
        acts,
        other,
        budget,
        None,
        spec.note,
        place.launched and bool(spec.trained),
        *generator,
        place.nodes,
    )


def _generator_plan(
    spec: RuleSpec, arch: Architecture, rm_arch: Architecture, weight_b: int, place: Placement
) -> tuple[float, float]:
    """(bytes, budget) of a generator on a GPU of its own: one copy of the policy and the KV
    cache of its batch (HF) or of one sequence within vLLM's reservation, and the reward
    models it scores with (generator_rm)."""
    e = 2 if weight_b == 2 else 4
    weights = arch.params() * weight_b
    rm = spec.generator_rm * rm_arch.params() * weight_b
    if spec.vllm_share:
        need = weights + spec.vllm_tokens * arch.kv_bytes_per_token(e)
        reserved = place.gpu_bytes * spec.vllm_share
        if not rm or need > reserved:
            return need, reserved
        # vLLM takes its whole reservation; the reward models sit in the rest of the GPU.
        return reserved + rm, place.gpu_bytes
    need = weights + rm + spec.kv_tokens * arch.kv_bytes_per_token(e) + OVERHEAD_BYTES
    return need, place.gpu_bytes


def generation_spec(rule: str, config: dict, copies: int = 1, reward_models: int = 0) -> RuleSpec:
    """A rule that generates: the HF engine's weights and KV cache (generation.batch_size
    sequences of rollout.max_total_tokens), or vLLM's reservation holding the weights and
    at least one sequence's KV cache; `reward_models` frozen reward models score beside it."""
    gen, length = config["generation"], config["rollout"]["max_total_tokens"]
    spec = RuleSpec(rule, [], frozen_rm=reward_models)
    if gen["engine"] == "vllm":
        share = gen["vllm"]["gpu_memory_utilization"]
        return replace(spec, vllm_share=share, vllm_copies=copies, vllm_tokens=length)
    return replace(spec, engine_copies=copies, kv_tokens=gen["batch_size"] * length)


def _trained(section: dict, sequences: int, length: int) -> Trained:
    """The model a training section trains: its precision, optimizer, checkpointing and,
    where the section has the setting, its LoRA adapters and quantized base (the same `lora`
    the stage reads)."""
    lora = section.get("lora") or {"r": 0, "target_modules": LORA_TARGETS}
    return Trained(
        section.get("precision", "fp32"),
        sequences,
        length,
        optimizer=section.get("optimizer", "adamw"),
        lora_rank=lora["r"],
        checkpointing=section.get("gradient_checkpointing", False),
        lora_targets=tuple(lora["target_modules"]),
        quantized=lora.get("quantize", "none") != "none",
    )


def rule_specs(config: dict) -> list[RuleSpec]:
    """The GPU rules this config runs, with what each holds."""
    specs = []
    sft = config["sft"]
    if sft_policies(config):
        length = sft["block_size"] if sft["packing"] else sft["max_length"]
        specs.append(RuleSpec("sft", [_trained(sft, sft["batch_size"], length)]))
    specs.append(generation_spec("evaluate", config))
    pref = config["preference"]
    if pref["variants"]:
        train = pref["train"]
        pairs = 2 * train["batch_size"]  # chosen and rejected trajectories
        specs += [
            generation_spec("sample_round", config, copies=2),
            RuleSpec("reference_logps", [], frozen=1, frozen_tokens=pairs * train["max_length"]),
            RuleSpec("preference_train", [_trained(train, pairs, train["max_length"])]),
            generation_spec("evaluate_selection", config),
        ]
    specs += _reward_model_specs(config)
    specs += _ppo_specs(config)
    specs += _online_specs(config)
    return specs + _part_specs(specs, config.get("split", {}))


def _part_specs(specs: list[RuleSpec], split: dict[str, int]) -> list[RuleSpec]:
    """A split generation stage's part jobs (RULE_part) hold what the stage holds."""
    return [replace(s, rule=f"{s.rule}_part") for s in specs if split.get(s.rule, 1) > 1]


def _needs_bt(config: dict) -> bool:
    """Whether a PPO or online run is rewarded by the BT-RM (reward rm or combined)."""
    learners = (ppo_learner(config), online_learner(config))
    return any(learner is not None and learner.reward_model for learner in learners)


def _reward_model_specs(config: dict) -> list[RuleSpec]:
    rm = config["reward_models"]
    if not (rm["tasks"] or _needs_bt(config)):
        return []
    train = rm["train"]
    # BT pairs: two sequences per pair (the ORM and PRM train one each), on reward_models.base.
    trained = _trained(train, 2 * train["batch_size"], train["max_length"])
    specs = [
        generation_spec("sample_rm_data", config),
        RuleSpec("train_reward_model", [replace(trained, rm_backbone=True)]),
    ]
    if rm["tasks"]:
        specs += [
            generation_spec("annotate_prm", config),
            generation_spec("best_of_n", config, reward_models=3),  # BT, ORM and PRM score
        ]
    if [t for t in rm["hgs"]["tasks"] if t in rm["tasks"]]:
        specs.append(generation_spec("hgs_search", config, reward_models=1))  # the PRM
    return specs


@dataclass(frozen=True)
class PPOLearner:
    """What the plan reads of the ppo section, typed once (ppo_learner)."""

    # The policy on one micro-batch (batch_size rows of max_length), and a separate critic's
    # trunk beside it.
    trained: tuple[Trained, ...]
    reference_copies: int  # _reference_copies
    reward_model: bool  # reward rm or combined: the BT-RM scores beside the policy
    lora: bool  # adapters: the merged policy is gathered whole to be sent to a generator
    batch_size: int
    global_batch_size: int | None
    grad_accum: int  # the section's: where global_batch_size is set, the job's GPUs give it
    buffers: tuple[tuple[str, int], ...]  # per variant, its name and buffer_rows


def ppo_learner(config: dict) -> PPOLearner | None:
    """The PPO learner of the config's ppo section (None: it has no variants)."""
    ppo = config["ppo"]
    if not ppo["variants"]:
        return None
    # PPO trains in the policy's dtype (no precision key); under ppo.lora a separate critic's
    # trunk has adapters as the policy has, built from the dequantized weights: never 4-bit.
    precision = "bf16" if _dtype_bytes(config) == 2 else "fp32"
    policy = replace(_trained(ppo, ppo["batch_size"], ppo["max_length"]), precision=precision)
    critic = [replace(policy, quantized=False)] if ppo["critic"] == "separate" else []
    counts = [ppo[k] for k in ("prompts_per_iteration", "responses_per_prompt", "draws_per_prompt")]
    return PPOLearner(
        trained=(policy, *critic),
        reference_copies=_reference_copies(ppo),
        reward_model=ppo["reward"] != "oracle",
        lora=ppo["lora"]["r"] > 0,
        batch_size=ppo["batch_size"],
        global_batch_size=ppo["global_batch_size"],
        grad_accum=ppo["grad_accum"],
        buffers=tuple((v["name"], buffer_rows(v["filter"], *counts)) for v in ppo["variants"]),
    )


def buffer_rows(filter_name: str, prompts: int, responses: int, draws: int) -> int:
    """Buffer rows a ppo variant of filter `filter_name` nominally trains on an iteration (the
    PF-PPO paper's Table 4, per n queries, `prompts` of them): every response for PPO-S and
    PPO-M, the draws for the filters (ppo.responses_per_prompt, ppo.draws_per_prompt). It
    takes the counts, not the section: the plan reads the config, the run its settings."""
    if filter_name in ("ppo-s", "ppo-m"):
        return prompts * responses
    return prompts * draws


def _ppo_specs(config: dict) -> list[RuleSpec]:
    learner = ppo_learner(config)
    if learner is None:
        return []
    # PPO samples with the policy itself (HF engine: its KV cache) or a vLLM engine beside it
    # (generation.engine). Under ZeRO-3 its reference and RM are sharded as its policy
    # (ppo_run's frozen_shards) and it samples with its policy gathered; a generator of its
    # own is sent the policy one parameter at a time, LoRA's merged one weight at a time over
    # the policy gathered whole (one copy).
    reference = learner.reference_copies
    note = "reference + RM frozen" if reference else "RM frozen; reference: adapters off"
    # the HF engine is the policy itself (no copy); a vLLM engine holds its own
    vllm = int(config["generation"]["engine"] == "vllm")
    generator = generation_spec("ppo", config, vllm, reward_models=int(learner.reward_model))
    return [
        generation_spec("ppo_r2", config, reward_models=1),  # the BT-RM scores the samples
        replace(
            generator,
            trained=list(learner.trained),
            frozen=reference,
            note=note,
            gathered=1,
            sent_whole=int(learner.lora),
        ),
    ]


def _reference_copies(section: dict) -> int:
    """Frozen copies a PPO or online learner holds for its reference: none under LoRA (the
    reference is the policy with its adapters off, training.reference), else one."""
    return int(section["lora"]["r"] == 0)


@dataclass(frozen=True)
class OnlineLearner:
    """What the plan reads of the online_dpo section, typed once (online_learner)."""

    # The policy, on one micro-batch of an optimizer step (the learner accumulates a step's
    # micro-batches): best and worst of K (DPO), all K (RLOO, PPO, GRPO) of micro_batch_prompts
    # prompts, the most any variant's loss takes.
    trained: Trained
    micro_batches: int  # a step's: prompts_per_step / micro_batch_prompts, rounded up
    reference_copies: int  # _reference_copies
    reward_model: bool  # reward rm or combined: the BT-RM scores beside the generator
    # Tokens of the forwards without gradients: the reference's, online_dpo.reference_rows
    # rows at a time over the step's samples, and PPO's critic values of one micro-batch before the
    # step's update.
    forward_tokens: int


def online_learner(config: dict) -> OnlineLearner | None:
    """The online learner of the config's online_dpo section (None: it has no variants).
    micro_batch_prompts' null is all of a step's prompts, as the run's settings
    (online_dpo.settings) resolve it; this module, loaded with the workflow, does not import
    them with torch."""
    section = config["online_dpo"]
    if not section["variants"]:
        return None
    length = section["max_length"]
    prompts = section["micro_batch_prompts"] or section["prompts_per_step"]

    def per_prompt(variant: dict) -> int:
        """A prompt's sequences in the variant's loss: best and worst (DPO), else its K."""
        k = variant.get("samples_per_prompt", section["samples_per_prompt"])
        return 2 if variant["loss"] == "dpo" else k

    variants = section["variants"]
    critic_rows = max((prompts * per_prompt(v) for v in variants if v["loss"] == "ppo"), default=0)
    forward_rows = max(section["reference_rows"], critic_rows)
    return OnlineLearner(
        trained=_trained(section, prompts * max(map(per_prompt, variants)), length),
        micro_batches=-(-section["prompts_per_step"] // prompts),
        reference_copies=_reference_copies(section),
        reward_model=section["reward"] != "oracle",
        forward_tokens=forward_rows * length,
    )


def _online_specs(config: dict) -> list[RuleSpec]:
    learner = online_learner(config)
    if learner is None:
        return []
    kept = "frozen" if learner.reference_copies else "adapters off"
    gen = generation_spec("online_dpo", config)
    return [
        replace(
            gen,
            trained=[learner.trained],
            frozen=learner.reference_copies,
            generator_rm=int(learner.reward_model),  # the generator scores its rollouts
            frozen_tokens=learner.forward_tokens,
            note=f"reference {kept}; generator beside the learner",
        )
    ]


def plan_config(config: dict, placements: dict[str, Placement]) -> list[RulePlan]:
    """The plan of every GPU rule of `config`; a rule missing from `placements` asked no GPU."""
    specs = rule_specs(config)
    arch = architecture(config)
    # Resolved only where a rule holds a reward model: a hub id the table lacks stops no plan
    # of a config that trains none.
    rm_arch = rm_architecture(config) if any(map(_holds_reward_model, specs)) else arch
    return [
        plan_rule(spec, arch, config, placements.get(spec.rule, Placement(0)), rm_arch)
        for spec in specs
    ]


def _holds_reward_model(spec: RuleSpec) -> bool:
    return bool(spec.frozen_rm or spec.generator_rm or any(t.rm_backbone for t in spec.trained))


# Rules whose generator may have GPUs of its own (resource generator_gpus: the job's last).
OWN_GENERATOR_RULES = frozenset({"online_dpo", "ppo"})


def learner_gpus_per_node(nodes: int, gpus: int, own: int) -> int:
    """The learner's processes on each node of a job of `gpus` GPUs over `nodes` nodes, `own`
    of each node's set apart for a generator (it runs on the first node; accelerate starts as
    many processes on every machine, so the others' stay idle)."""
    if nodes == 1:
        return gpus - own
    if nodes < 1 or gpus % nodes or gpus // nodes < 2:
        raise ReasonRLError(
            f"resources nodes={nodes}, gpu={gpus}: gpu is the job's GPUs (sbatch --gpus), at"
            " least 2 on each node and as many on every node"
        )
    return gpus // nodes - own


def placement(rule: str, resources: dict) -> Placement:
    """A rule's Placement from its resources: gpu (the job's, all nodes together), nodes (1
    unless set), deepspeed (zero2 unless set), gpu_mem_mb (80 GiB unless set) and, for the
    online learner and PPO, generator_gpus (0 or 1 of a node's GPUs that are its generator's:
    the learner trains on the others)."""
    stage = str(resources.get("deepspeed") or "zero2")
    mem_mb = resources.get("gpu_mem_mb")
    gpus, own = int(resources.get("gpu") or 0), int(resources.get("generator_gpus") or 0)
    nodes = int(resources.get("nodes") or 1)
    if own and (rule not in OWN_GENERATOR_RULES or own != 1 or gpus < 2):
        raise ReasonRLError(
            f"rule {rule}: resource generator_gpus={own} (only online_dpo's and ppo's generator"
            " has a GPU of its own: 1, of a job of at least 2)"
        )
    try:
        per_node = learner_gpus_per_node(nodes, gpus, own)
    except ReasonRLError as err:
        raise ReasonRLError(f"rule {rule}: {err}") from None
    return Placement(
        nodes * per_node,
        int(stage.removeprefix("zero")),
        rule in LAUNCHED_RULES,
        generator_own_gpu=bool(own),
        gpu_bytes=float(mem_mb) * 1024**2 if mem_mb else GPU_BYTES,
        nodes=nodes,
    )


def profile_placements(profile: dict) -> dict[str, Placement]:
    """Each rule's Placement from a Snakemake profile's default-resources and set-resources."""
    default = profile.get("default-resources") or {}
    return {
        rule: placement(rule, {**default, **resources})
        for rule, resources in (profile.get("set-resources") or {}).items()
    }


def plan_rows(plans: list[RulePlan]) -> list[dict]:
    """Table rows in GiB (one decimal)."""

    def gib(x: float) -> float:
        return round(x / GIB, 1)

    return [
        {
            "rule": p.rule,
            "GPUs": p.gpus if p.nodes == 1 else f"{p.gpus} on {p.nodes} nodes",
            "launched": "yes" if p.launched else "no",
            "ZeRO": p.zero,
            "params": gib(p.params),
            "grads": gib(p.grads),
            "optimizer": gib(p.optimizer),
            "activations": gib(p.activations),
            "other": gib(p.other),
            "total": gib(p.total),
            "usable": gib(p.gpu_memory),
            "generator GPU": f"{gib(p.generator)} of {gib(p.generator_memory)}"
            if p.generator_memory
            else "-",
            "fits": "yes" if p.fits else "NO",
            "GPUs needed": p.gpus_needed if p.gpus_needed else "-",
        }
        for p in plans
    ]
