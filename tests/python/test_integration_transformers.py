"""Hugging Face transformers.Trainer through shardsafe.integrations.transformers.

The real Trainer (transformers 5.23.0, accelerate 1.15.0) trains a tiny,
randomly initialised Llama (tests/python/hf_models.py, with attention
dropout so the loss depends on the generator state) on the CPU, with a
linear warm-up/decay schedule and a shuffled data order. A run stopped
after step 3 and resumed by a new ShardsafeTrainer (another
initialisation, resume_from_checkpoint=True, found by transformers'
get_last_checkpoint) must take bit-for-bit the same losses, through the
epoch boundary, and end with the same weights as a run that never
stopped. A missing transformers / accelerate fails the import of this
module: never a skip.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import shardsafe
import shardsafe.hf
from conftest import import_error_without
from hf_models import TINY
from shardsafe.integrations.transformers import ShardsafeTrainer, is_shardsafe_checkpoint

STEPS = 8  # two epochs of 4 steps
STOP = 3  # the interrupted run's last step, mid-epoch

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY, attention_dropout=0.2))


def _data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, TINY["vocab_size"], (8, 12), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


class Recording:
    """A trainer that records the loss of each training step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses: dict[int, torch.Tensor] = {}

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.losses[self.state.global_step + 1] = loss.detach().clone()
        return loss


class RecordingShardsafe(Recording, ShardsafeTrainer):
    pass


class RecordingHF(Recording, Trainer):
    pass


class StopAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def _args(out, **kw) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=2,
        learning_rate=2e-2, warmup_steps=2, lr_scheduler_type="linear", weight_decay=0.1,
        save_strategy="steps", save_steps=STOP, logging_steps=1, report_to="none", seed=0,
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, **kw)


def _train(cls, out, seed: int = 0, stop: int | None = None, resume=None, **kw):
    trainer = cls(model=_model(seed), args=_args(out, **kw), train_dataset=_data(),
                  callbacks=[StopAt(stop)] if stop else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The uninterrupted run (transformers' own checkpoints do not change it)."""
    return _train(RecordingHF, tmp_path_factory.mktemp("full"))


def test_resumed_run_continues_on_the_same_loss_curve(tmp_path, full):
    assert sorted(full.losses) == list(range(1, STEPS + 1))
    first = _train(RecordingShardsafe, tmp_path, stop=STOP)
    for step, loss in first.losses.items():
        assert torch.equal(loss, full.losses[step]), step

    ckpt = tmp_path / f"checkpoint-{STOP}"
    assert get_last_checkpoint(str(tmp_path)) == str(ckpt)  # transformers finds it
    assert is_shardsafe_checkpoint(ckpt)
    assert not (ckpt / "model.safetensors").exists() and not (ckpt / "optimizer.pt").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == STOP
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    desc = shardsafe.describe(ckpt)
    assert "model.model.embed_tokens.weight" in desc["tensors"]
    assert "optimizer.state.0.exp_avg" in desc["tensors"]
    assert desc["values"]["scheduler"]["last_epoch"] == STOP
    assert shardsafe.CheckpointManager(tmp_path).latest_step() == STOP

    resumed = _train(RecordingShardsafe, tmp_path, seed=7, resume=True)
    assert sorted(resumed.losses) == list(range(STOP + 1, STEPS + 1))
    for step, loss in resumed.losses.items():
        assert torch.equal(loss, full.losses[step]), f"step {step}: {loss} != {full.losses[step]}"
    _same_weights(resumed.model, full.model)
    assert [c for c in sorted(os.listdir(tmp_path)) if c.startswith("checkpoint-")] == [
        "checkpoint-3", "checkpoint-6", "checkpoint-8"]


class NoRng(RecordingShardsafe):
    def _load_rng_state(self, checkpoint):
        pass


def test_the_curve_depends_on_the_rng_state(tmp_path, full):
    """The comparison above would catch a lost generator state: without it
    the dropout masks, and the losses, differ."""
    _train(RecordingShardsafe, tmp_path, stop=STOP)
    resumed = _train(NoRng, tmp_path, resume=True)
    assert not torch.equal(resumed.losses[STOP + 1], full.losses[STOP + 1])


def test_rotation_and_best_model_at_end(tmp_path):
    """save_total_limit removes old checkpoints (transformers' rotation,
    keeping the best and the last); load_best_model_at_end loads the best
    through shardsafe. With greater_is_better (the worst loss wins) the
    best is an early checkpoint, not the last."""
    trainer = ShardsafeTrainer(
        model=_model(0), train_dataset=_data(), eval_dataset=_data()[:2],
        args=_args(tmp_path, save_total_limit=2, eval_strategy="steps", eval_steps=STOP,
                   load_best_model_at_end=True, metric_for_best_model="loss",
                   greater_is_better=True))
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best in [str(tmp_path / f"checkpoint-{s}") for s in (STOP, 2 * STOP)], best
    assert is_shardsafe_checkpoint(best)
    left = sorted(c for c in os.listdir(tmp_path) if c.startswith("checkpoint-"))
    assert left == sorted([os.path.basename(best), f"checkpoint-{STEPS}"])
    parts = ["optimizer", "scheduler", "rng"]
    at_best, at_last = {"model": _model(1)}, {"model": _model(1)}
    shardsafe.load(at_best, best, skip_keys=parts)
    shardsafe.load(at_last, tmp_path / f"checkpoint-{STEPS}", skip_keys=parts)
    _same_weights(trainer.model, at_best["model"])
    assert not torch.equal(trainer.model.lm_head.weight, at_last["model"].lm_head.weight)


def test_exported_checkpoint_loads_with_from_pretrained(tmp_path):
    trainer = _train(ShardsafeTrainer, tmp_path / "run", stop=STOP)
    shardsafe.hf.export(tmp_path / "run" / f"checkpoint-{STOP}", tmp_path / "hf", prefix="model.")
    model = LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    _same_weights(model, trainer.model)


def test_resuming_a_transformers_checkpoint(tmp_path, full):
    """Switching mid-run: a checkpoint transformers wrote resumes through
    its own code, and the next checkpoints are shardsafe ones."""
    _train(Trainer, tmp_path, stop=STOP)
    assert not is_shardsafe_checkpoint(tmp_path / f"checkpoint-{STOP}")
    resumed = _train(RecordingShardsafe, tmp_path, seed=7, resume=True)
    for step, loss in resumed.losses.items():
        assert torch.equal(loss, full.losses[step]), step
    assert is_shardsafe_checkpoint(tmp_path / "checkpoint-6")


def test_save_only_model(tmp_path):
    _train(ShardsafeTrainer, tmp_path, stop=STOP, save_only_model=True)
    desc = shardsafe.describe(tmp_path / f"checkpoint-{STOP}")
    assert desc["tensors"] and all(k.startswith("model.") for k in desc["tensors"])
    assert set(desc["values"]) <= {"model"}, desc["values"].keys()


def test_import_without_transformers_names_the_extra():
    out = import_error_without("transformers", "shardsafe.integrations.transformers")
    assert "pip install shardsafe[transformers]" in out, out
