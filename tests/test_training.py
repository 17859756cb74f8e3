"""The shared training loop: packing, masked loss, checkpoints and exact resume."""

import itertools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reasonrl.chat import TokenizedChat
from reasonrl.errors import ReasonRLError
from reasonrl.models import load_policy
from reasonrl.training import packed_attention
from reasonrl.training.data import IGNORE, MicroBatches, flatten, pack, pad_batch
from reasonrl.training.lm_loss import masked_lm_loss, target_tokens
from reasonrl.training.loop import (
    CheckpointStore,
    LoopSettings,
    TrainingLoop,
    make_scheduler,
    micro_batch_index,
    step_micro_batches,
    train,
    with_accumulation,
)


@pytest.fixture(scope="module")
def tiny(tiny_policy):
    return tiny_policy


def _samples(n: int, seed: int = 0) -> list[TokenizedChat]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(5, 30, (1,), generator=g))
        ids = torch.randint(10, 255, (length,), generator=g).tolist()
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        out.append(TokenizedChat(ids, mask))
    return out


@pytest.mark.parametrize("attention", ["sdpa", "packed"])
def test_packed_attention_stays_inside_each_sample(tiny, attention):
    """Every sample of a packed row has the logits it has alone, with transformers' mask from
    the position ids and with packed_sdpa_forward; changing one sample moves no other's."""
    model, _ = load_policy(tiny)
    if attention == "packed":
        packed_attention.use_packed_attention(model)
    samples = _samples(4)
    row = flatten(samples)
    inputs = {k: v for k, v in row.items() if k not in ("labels", "num_tokens")}
    changed = list(samples)
    changed[1] = TokenizedChat([t + 1 for t in samples[1].input_ids], samples[1].loss_mask)
    changed_inputs = {**inputs, "input_ids": flatten(changed)["input_ids"]}
    with torch.no_grad():
        packed = model(**inputs, use_cache=False).logits[0]
        after_change = model(**changed_inputs, use_cache=False).logits[0]
        alone = [model(input_ids=torch.tensor([s.input_ids])).logits[0] for s in samples]
    bounds = row["cu_seq_lens_q"].tolist()
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        torch.testing.assert_close(packed[lo:hi], alone[i], atol=1e-5, rtol=0)
        if i != 1:
            torch.testing.assert_close(after_change[lo:hi], packed[lo:hi], atol=1e-6, rtol=0)


def test_gathered_and_per_sample_packed_attention_agree():
    """The GPU's one gathered sdpa call gives the CPU's per-sample attention, gradients too."""
    lengths = [5, 9, 1, 7]
    bounds = torch.tensor([0, *itertools.accumulate(lengths)])
    states = [torch.randn(1, 2, sum(lengths), 8, requires_grad=True) for _ in range(3)]
    module = torch.nn.Module()
    per_sample, _ = packed_attention.packed_sdpa_forward(module, *states, None, bounds, 9)
    gathered, _ = packed_attention._gathered_sdpa(module, *states, bounds, 9)
    torch.testing.assert_close(gathered, per_sample)
    grads = [torch.autograd.grad(out.square().sum(), states) for out in (per_sample, gathered)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_packed_attention_builds_no_mask_for_packed_rows(tiny, monkeypatch):
    """A packed row is attended sample by sample without a dense [T, T] block-diagonal mask;
    a padded batch still gets sdpa's mask."""
    model, _ = load_policy(tiny)
    packed_attention.use_packed_attention(model)
    built = []
    real_mask = packed_attention.sdpa_mask
    monkeypatch.setattr(
        packed_attention, "sdpa_mask", lambda **kw: built.append(1) or real_mask(**kw)
    )
    row = flatten(_samples(4))
    with torch.no_grad():
        model(**{k: v for k, v in row.items() if k not in ("labels", "num_tokens")})
        assert built == []
        model(**{k: v for k, v in pad_batch(_samples(4), 0).items() if k != "labels"})
    assert built == [1]


@pytest.mark.parametrize("attention", ["sdpa", "packed"])
def test_packed_loss_and_gradients_equal_the_padded_ones(tiny, attention):
    """The same samples and weights give the same loss and gradients packed in one row as
    padded in a batch: packing changes the layout, not what is learned."""
    model, _ = load_policy(tiny)
    if attention == "packed":
        packed_attention.use_packed_attention(model)
    samples = _samples(6)

    def loss_and_grads(batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        loss, stats = masked_lm_loss(model, batch)
        loss.backward()
        assert stats["target_tokens"] == sum(sum(s.loss_mask[1:]) for s in samples)
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    padded_loss, padded_grads = loss_and_grads(pad_batch(samples, pad_id=0))
    packed_loss, packed_grads = loss_and_grads(flatten(samples))
    torch.testing.assert_close(packed_loss, padded_loss, atol=1e-6, rtol=1e-5)
    for packed, padded in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(packed, padded, atol=1e-6, rtol=1e-4)


def test_pack_fills_blocks_and_flatten_masks_sample_starts():
    samples = _samples(12)
    blocks = pack(samples, block_size=64)
    assert all(sum(len(s.input_ids) for s in block) <= 64 for block in blocks)
    assert [s for block in blocks for s in block] == samples  # in order, none cut
    # a block is closed only when the next sample does not fit
    for block, following in zip(blocks, blocks[1:], strict=False):
        assert sum(len(s.input_ids) for s in block) + len(following[0].input_ids) > 64
    row = flatten(samples)
    assert row["input_ids"].shape == (1, sum(len(s.input_ids) for s in samples))  # no padding
    assert int(row["num_tokens"].sum()) == row["input_ids"].shape[1]
    targets = int((row["labels"] != IGNORE).sum())
    # every sample loses its first label (never predicted across a sample boundary)
    assert targets == sum(sum(s.loss_mask[1:]) for s in samples)
    starts = row["cu_seq_lens_q"][:-1]
    assert (row["position_ids"][0, starts] == 0).all()


def test_masked_loss_matches_formula(tiny):
    model, _ = load_policy(tiny)
    batch = pad_batch(_samples(3), pad_id=0)
    projected = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _module, args, _out: projected.append(tuple(args[0].shape[:2]))
    )
    loss, stats = masked_lm_loss(model, batch)
    hook.remove()
    # the vocabulary projection ran only where it predicts a label of some row
    predicting = int((batch["labels"][:, 1:] != IGNORE).any(0).sum())
    assert projected == [(3, predicting)] and predicting < batch["labels"].shape[1] - 1
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    total, count = 0.0, 0
    for row in range(3):
        for t in range(1, batch["input_ids"].shape[1]):
            label = int(batch["labels"][row, t])
            if label != IGNORE:
                total -= F.log_softmax(logits[row, t - 1], -1)[label].item()
                count += 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)
    assert stats["target_tokens"] == count


def test_micro_batches_are_a_pure_function_of_the_index():
    samples = _samples(40)
    first = MicroBatches(samples, 4, 0, seed=3, packing=False, block_size=64)
    again = MicroBatches(samples, 4, 0, seed=3, packing=False, block_size=64)
    for i in (0, 7, 10, 23):
        assert torch.equal(first(i)["input_ids"], again(i)["input_ids"])
    assert not torch.equal(first(0)["input_ids"], first(first.per_epoch)["input_ids"])


def _epoch_of(batches: MicroBatches, epoch: int) -> list[torch.Tensor]:
    return [batches(epoch * batches.per_epoch + i)["input_ids"] for i in range(batches.per_epoch)]


def _rows(batches: list[torch.Tensor]) -> list[list[int]]:
    """The samples in these batches, padding (id 0, never a sample token here) removed."""
    return sorted([t for t in row.tolist() if t != 0] for b in batches for row in b)


def test_length_grouped_batches_pad_less_and_keep_every_epoch_a_shuffle():
    samples = _samples(400)
    plain = MicroBatches(samples, 4, 0, seed=3, packing=False, block_size=64)
    grouped = MicroBatches(samples, 4, 0, 3, False, 64, group_by_length=True)
    again = MicroBatches(samples, 4, 0, 3, False, 64, group_by_length=True)
    assert all(torch.equal(grouped(i)["input_ids"], again(i)["input_ids"]) for i in (0, 99, 150))
    for epoch in (0, 1):
        batches = _epoch_of(grouped, epoch)
        assert len(batches) == grouped.per_epoch == 100
        assert all(b.shape[0] == 4 for b in batches)
        assert _rows(batches) == _rows(_epoch_of(plain, epoch))  # the same samples, regrouped
    padded = sum(b.numel() for b in _epoch_of(grouped, 0))
    assert padded < 0.8 * sum(b.numel() for b in _epoch_of(plain, 0))
    assert not torch.equal(grouped(0)["input_ids"], grouped(grouped.per_epoch)["input_ids"])


class Crash(Exception):
    pass


def _run(tiny, folder, fingerprint="a", crash_at=None, steps=8, checkpointing=False):
    model, _ = load_policy(tiny)
    batches = MicroBatches(_samples(30), 4, 0, seed=1, packing=True, block_size=64)

    def micro_batch(i):
        if crash_at is not None and i == crash_at:
            raise Crash
        return batches(i)

    settings = LoopSettings(
        max_steps=steps,
        lr=1e-2,
        grad_accum=2,
        checkpoint_every=3,
        seed=5,
        gradient_checkpointing=checkpointing,
    )
    return train(model, micro_batch, masked_lm_loss, settings, CheckpointStore(folder, fingerprint))


def test_gradient_checkpointing_saves_a_third_of_the_activations_and_keeps_the_losses(
    tiny, tmp_path
):
    def trained(checkpointing: bool) -> tuple[dict, int]:
        """The run and the bytes autograd saved for backward over all its forward passes."""
        saved = [0]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            saved[0] += tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            run = _run(tiny, tmp_path / str(checkpointing), checkpointing=checkpointing)
        return run, saved[0]

    (plain, plain_bytes), (recomputed, recomputed_bytes) = trained(False), trained(True)
    # Each layer keeps only its input; the one layer being recomputed adds its own back.
    assert recomputed_bytes < 0.5 * plain_bytes
    losses = [h["loss"] for h in plain["history"]]
    assert [h["loss"] for h in recomputed["history"]] == pytest.approx(losses, abs=1e-5)


def test_resume_continues_from_last_checkpoint_with_identical_losses(tiny, tmp_path):
    reference = _run(tiny, tmp_path / "ref")
    with pytest.raises(Crash):
        _run(tiny, tmp_path / "ck", crash_at=2 * 7)  # dies during step 8, last checkpoint at 6
    resumed = _run(tiny, tmp_path / "ck")
    assert resumed["resumed_from"] == 6
    assert [h["step"] for h in resumed["history"]] == list(range(1, 9))
    ref_losses = [h["loss"] for h in reference["history"]]
    assert [h["loss"] for h in resumed["history"]] == pytest.approx(ref_losses, abs=1e-6)


def _run_in_parts(tiny, folder, crash_in_part=None) -> dict:
    """_run's training as updates of 2 steps each, every one on its own finite batch source
    (a method making its data between updates)."""
    model, _ = load_policy(tiny)
    batches = MicroBatches(_samples(30), 4, 0, seed=1, packing=True, block_size=64)
    settings = LoopSettings(max_steps=8, lr=1e-2, grad_accum=2, checkpoint_every=2, seed=5)
    loop = TrainingLoop(model, masked_lm_loss, settings, CheckpointStore(folder, "a"))
    for part in range(loop.step // 2, 4):
        if part == crash_in_part:
            raise Crash
        first = part * 2 * settings.grad_accum
        own = [batches(i) for i in range(first, first + 2 * settings.grad_accum)]
        loop.run(lambda i, own=own, first=first: own[i - first], 2)
    return loop.finish()


def test_the_loop_run_in_parts_is_train_and_resumes_at_its_step(tiny, tmp_path):
    whole = _run(tiny, tmp_path / "whole")
    with pytest.raises(Crash):
        _run_in_parts(tiny, tmp_path / "parts", crash_in_part=3)  # checkpoint at step 6
    parts = _run_in_parts(tiny, tmp_path / "parts")
    assert parts["resumed_from"] == 6
    assert [h["step"] for h in parts["history"]] == list(range(1, 9))
    losses = [h["loss"] for h in whole["history"]]
    assert [h["loss"] for h in parts["history"]] == pytest.approx(losses, abs=1e-6)


def test_checkpoints_follow_the_umask(tiny, tmp_path):
    """accelerate writes weights 0600: a checkpoint must still be readable as the umask says."""
    before = os.umask(0o022)
    try:
        with pytest.raises(Crash):
            _run(tiny, tmp_path / "ck", crash_at=2 * 4)  # dies in step 5: checkpoint at 3
    finally:
        os.umask(before)
    entries = [tmp_path / "ck", *(tmp_path / "ck").rglob("*")]
    assert any(p.name.endswith(".safetensors") for p in entries)
    modes = {str(p): stat.S_IMODE(p.stat().st_mode) for p in entries}
    assert modes == {str(p): 0o755 if p.is_dir() else 0o644 for p in entries}


def test_checkpoints_of_other_inputs_are_not_resumed(tiny, tmp_path):
    with pytest.raises(Crash):
        _run(tiny, tmp_path / "ck", crash_at=2 * 4)
    fresh = _run(tiny, tmp_path / "ck", fingerprint="other inputs")
    assert fresh["resumed_from"] == 0


def test_data_parallel_processes_train_on_distinct_micro_batches():
    single = [micro_batch_index(step, micro, 2, 1, 0) for step in range(3) for micro in range(2)]
    assert single == list(range(6))
    parallel = [
        micro_batch_index(step, micro, 2, 4, rank)
        for step in range(3)
        for micro in range(2)
        for rank in range(4)
    ]
    assert sorted(parallel) == list(range(24))  # every micro-batch once, none shared


def _one_step(tiny, folder, batches: list[dict], loss_units=None) -> dict:
    """The first step's history entry of a run accumulating over `batches`."""
    model, _ = load_policy(tiny)
    settings = LoopSettings(max_steps=1, lr=1e-3, grad_accum=len(batches), max_grad_norm=1e9)
    store = CheckpointStore(folder, "a")
    result = train(model, lambda i: batches[i], masked_lm_loss, settings, store, None, None,
                   loss_units)  # fmt: skip
    return result["history"][0]


def test_accumulation_weighs_micro_batches_by_their_target_tokens(tiny, tmp_path):
    """A token-mean loss accumulated over micro-batches with unequal target tokens gives the
    loss and gradient of the step's whole batch (Hugging Face's gradient-accumulation fix of
    2024); even shares, as without loss_units, overweight the small micro-batch's tokens."""
    samples = sorted(_samples(6, seed=2), key=lambda sample: sum(sample.loss_mask))
    small, large = samples[:1], samples[1:]
    assert target_tokens(pad_batch(small, 0)) * 3 < target_tokens(pad_batch(large, 0))
    whole = _one_step(tiny, tmp_path / "whole", [pad_batch(samples, 0)])
    parts = [pad_batch(small, 0), pad_batch(large, 0)]
    weighted = _one_step(tiny, tmp_path / "weighted", parts, target_tokens)
    even = _one_step(tiny, tmp_path / "even", parts)
    for key in ("loss", "grad_norm", "token_accuracy", "target_tokens", "tokens"):
        assert weighted[key] == pytest.approx(whole[key], rel=1e-4), key
    assert even["loss"] != pytest.approx(whole["loss"], rel=1e-3)
    assert even["grad_norm"] != pytest.approx(whole["grad_norm"], rel=1e-3)


def test_step_weights_count_every_process_micro_batches():
    units = [1.0, 3.0, 2.0, 4.0, 0.0, 0.0, 0.0, 0.0]  # steps 0 and 1 of 2 x 2 micro-batches
    batches = [{"units": u} for u in units]

    def weights(step: int, process: int, loss_units=lambda b: b["units"]) -> list[float]:
        return [w for _, w in step_micro_batches(batches.__getitem__, step, 2, 2, process,
                                                 loss_units)]  # fmt: skip

    # the step's 10 units over 4 micro-batches: each weighs units / 10 x 4, whatever process
    assert weights(0, 0) == pytest.approx([0.4, 0.8])  # micro-batches 0 and 2
    assert weights(0, 1) == pytest.approx([1.2, 1.6])  # 1 and 3
    assert weights(1, 0) == weights(1, 1) == [1.0, 1.0]  # nothing to count: even
    assert weights(0, 1, loss_units=None) == [1.0, 1.0]
    assert [b for b, _ in step_micro_batches(batches.__getitem__, 0, 2, 2, 1)] == [
        batches[1],
        batches[3],
    ]


def test_a_global_batch_sets_the_accumulation_for_the_jobs_processes(monkeypatch):
    section = {"batch_size": 2, "grad_accum": 3, "global_batch_size": None}
    assert with_accumulation(section, "sft") == section
    section["global_batch_size"] = 16
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert with_accumulation(section, "sft")["grad_accum"] == 8
    monkeypatch.setenv("WORLD_SIZE", "4")  # accelerate launch over 4 GPUs
    assert with_accumulation(section, "sft")["grad_accum"] == 2
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ReasonRLError, match=r"^'preference.train.global_batch_size' \(16\) is "
                       r"not a multiple of batch_size x processes \(2 x 3\)$"):  # fmt: skip
        with_accumulation(section, "preference.train")


def test_on_step_sees_the_start_and_every_step_and_extends_its_history(tiny, tmp_path):
    model, _ = load_policy(tiny)
    batches = MicroBatches(_samples(12), 4, 0, seed=1, packing=False, block_size=64)
    calls = []

    def on_step(step, module, history):
        calls.append((step, len(history), module is model))
        return {"pushed": float(step)} if step else None

    settings = LoopSettings(max_steps=3, lr=1e-2, checkpoint_every=10, seed=5)
    result = train(
        model, batches, masked_lm_loss, settings, CheckpointStore(tmp_path, "a"), on_step
    )
    assert calls == [(0, 0, True), (1, 0, True), (2, 1, True), (3, 2, True)]
    assert [h["pushed"] for h in result["history"]] == [1.0, 2.0, 3.0]


def _torchrun(policy, out: Path, *crash_at: str) -> subprocess.CompletedProcess:
    script = Path(__file__).parent / "data_parallel_train.py"
    command = [Path(sys.executable).parent / "torchrun", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    command += [script, policy, out, *crash_at]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def test_two_processes_share_checkpoint_and_output_folders(tiny, tmp_path):
    """Under accelerate launch the processes share the folders: only the main one makes,
    publishes and prunes them (before, the second process's rename or rmtree failed)."""
    out = tmp_path / "model"
    crashed = _torchrun(tiny, out, "5")  # both processes stop in step 5; checkpoint at 4
    assert crashed.returncode != 0 and not out.exists()
    assert sorted(p.name for p in (tmp_path / ".model.ckpt").glob("step-*")) == ["step-4"]
    done = _torchrun(tiny, out)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["processes"], metrics["resumed_from"]) == (2, 4)
    assert [h["step"] for h in metrics["history"]] == list(range(1, 7))
    assert (out / "model.safetensors").exists() and not (tmp_path / ".model.ckpt").exists()


def test_saving_closes_the_process_group_on_every_process(tmp_path, monkeypatch):
    """A training job's save is its last collective: the processes that do not write wait
    for the one that does, then all close the process group. Before, they left with it open
    and at times aborted at exit ("terminate called without an active exception"), which
    failed a ZeRO-3 job whose main process was still writing."""
    import torch.distributed as dist

    from reasonrl.stages import _train

    monkeypatch.setattr(_train, "is_main_process", lambda: False)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        _train.TrainingRun("sft", tmp_path / "out", {}, [], 0).save(None, None, {})
        assert not dist.is_initialized()
        assert not (tmp_path / "out").exists(), "only the main process writes"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_only_zero3_shards_are_gathered_for_saving():
    from types import SimpleNamespace

    from reasonrl.training.loop import _gathered_state_dict

    def accelerator(plugin):
        return SimpleNamespace(
            state=SimpleNamespace(deepspeed_plugin=plugin), get_state_dict=lambda m: {"w": m}
        )

    model = object()
    assert _gathered_state_dict(accelerator(None), model) is None
    assert _gathered_state_dict(accelerator(SimpleNamespace(zero_stage=2)), model) is None
    gathered = _gathered_state_dict(accelerator(SimpleNamespace(zero_stage=3)), model)
    assert gathered == {"w": model}


def test_gradient_checkpointing_uses_the_older_name_on_older_transformers():
    from reasonrl.training.loop import enable_gradient_checkpointing

    class OlderModel(torch.nn.Module):  # transformers < 5.21: no activation_checkpointing_enable
        supports_gradient_checkpointing = True

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            self.options = gradient_checkpointing_kwargs

    model = OlderModel()
    enable_gradient_checkpointing(model)
    assert model.options == {"use_reentrant": False}


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one process-wide state, fixed by its first Accelerator (fp32 in the
    other tests); a run with another precision is a process of its own in the workflow."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_bf16_training_updates_fp32_master_weights_and_returns_bf16(tiny, tmp_path):
    model, _ = load_policy(tiny, "bfloat16")
    start = {name: p.detach().float().clone() for name, p in model.named_parameters()}
    batches = MicroBatches(_samples(8), 4, 0, seed=1, packing=True, block_size=64)
    # an lr far below bf16's spacing near the weights (about 1e-4 at 0.02): pure bf16
    # AdamW would round nearly every update away
    settings = LoopSettings(max_steps=3, lr=1e-6, precision="bf16", checkpoint_every=100)
    loop = TrainingLoop(model, masked_lm_loss, settings, CheckpointStore(tmp_path, "a"))
    loop.run(batches, 3)
    trained = dict(loop.unwrapped_model.named_parameters())
    assert {p.dtype for p in trained.values()} == {torch.float32}
    weights = [n for n in trained if n.endswith("proj.weight")]
    moved = sum(int((trained[n].detach() != start[n]).sum()) for n in weights)
    assert moved / sum(trained[n].numel() for n in weights) > 0.9
    assert {p.dtype for p in loop.finish()["model"].parameters()} == {torch.bfloat16}


def _learning_rates(settings: LoopSettings, steps: int) -> list[float]:
    """The scheduler's learning rate at each of the first `steps` optimizer steps."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=settings.lr)
    scheduler = make_scheduler(optimizer, settings)
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [("cosine", [0.0, 0.5, 1.0, 0.5, 0.0]), ("constant", [0.0, 0.5, 1.0, 1.0, 1.0])],
)
def test_lr_schedule_warms_up_then_decays_or_stays(schedule, expected):
    settings = LoopSettings(max_steps=4, lr=1.0, warmup_ratio=0.5, lr_schedule=schedule)
    assert _learning_rates(settings, 5) == pytest.approx(expected, abs=1e-9)


def test_warmup_steps_override_the_ratio():
    settings = LoopSettings(max_steps=10, lr=1.0, warmup_ratio=0.5, warmup_steps=2)
    assert _learning_rates(settings, 3) == pytest.approx([0.0, 0.5, 1.0])
