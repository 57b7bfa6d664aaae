"""The training loop: :class:`TrainStep` (one optimisation step) and :class:`Trainer` (epochs, checkpoints, logs).

Randomness is a function of ``(seed, epoch)``: every epoch reseeds torch, numpy and the MONAI transforms, so a
run resumed from ``last.pt`` replays exactly what an uninterrupted run would have done. A checkpoint written
mid-epoch by a graceful stop (SIGINT/SIGTERM) also holds the step, the losses so far and the torch RNG: the
resumed run replays the loader through the steps already taken (so the transforms' random streams advance as
before), restores the RNG, and goes on from the next step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data.utils import set_rnd
from monai.utils import set_determinism
from torch import nn
from tqdm import tqdm

from medseg.config import TrainConfig, value_text
from medseg.data.labels import LabelSpec
from medseg.data.nnunet_draws import DRAWS
from medseg.errors import CheckpointError, NoSpaceError, TrainingError, TrainingInterrupted
from medseg.io import atomic_write_json
from medseg.models import build_model, unwrap_model
from medseg.optim import build_optimizer, build_scheduler
from medseg.runs.checkpoint import (
    MODEL_KEYS,
    load_checkpoint,
    load_fitting_state,
    load_model_state,
    read_start_weights,
    save_checkpoint,
    state_mismatch,
)
from medseg.runs.layout import RunLayout
from medseg.runs.nnunet_model import NnunetModel
from medseg.runtime.device import amp_dtype, autocast, peak_memory_mb, reset_peak_memory
from medseg.runtime.distributed import any_rank, broadcast_object, gather_objects
from medseg.runtime.launch import SINGLE_PROCESS, DistInfo
from medseg.tables import text_table
from medseg.training.attention_logging import log_attention
from medseg.training.budget import TimeBudget
from medseg.training.loop import GracefulStop, replay
from medseg.training.losses import build_loss, named_class_weights
from medseg.training.nnunet_start import nnunet_start, read_val_cases, start_from_nnunet
from medseg.training.prepare import PreparedData
from medseg.training.progress import PROGRESS_KEYS, Progress
from medseg.training.pseudo_dice import moving_average, pseudo_dice
from medseg.training.tensorboard import TensorBoardLogger
from medseg.training.validation import ValidationResult, validate
from medseg.typed_config import to_typed

log = logging.getLogger("medseg")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs (MONAI's ``set_determinism``, every CUDA device too)."""
    set_determinism(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch: distinct per (seed, epoch), the same on every resume."""
    return (seed * 1_000_003 + epoch * 7919) % 2**31


RESUMED_KEYS = (*MODEL_KEYS, "optimizer", "scheduler", "step", "torch_rng", "cuda_rng", *PROGRESS_KEYS)
"""The entries of :meth:`Trainer.state` a resume cannot do without (the AMP scaler's state can: a fresh one)."""


def saved_at(epoch: int, step: int) -> str:
    """Where a checkpoint of ``epoch`` completed epochs (and ``step`` > 0 steps into the next) stands, as messages
    say it: ``"epoch 3"``, or ``"epoch 4, step 2"``."""
    return f"epoch {epoch + 1}, step {step}" if step else f"epoch {epoch}"


def differing_values(mine: Mapping[str, Any], theirs: Mapping[str, Any],
                     prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """``(dotted key, mine, theirs)`` for every leaf where two nested config dicts differ (None where one lacks it)."""
    for key in [*mine, *(k for k in theirs if k not in mine)]:
        a, b = mine.get(key), theirs.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            yield from differing_values(a, b, f"{prefix}{key}.")
        elif a != b:
            yield f"{prefix}{key}", a, b


MEANING_KEYS = ("data.spacing", "data.normalization", "data.resampling", "data.regions", "data.regions_class_order",
                "model", "dataset")
"""The keys (and the nodes whose every key) that say what a checkpoint's weights mean: the spacing and intensities of
their input, their outputs (the regions; ``dataset``: the dataset's labels and channels) and the network, every
``model`` key but :data:`RUN_ONLY_MODEL_KEYS`. A resumed run keeps them. ``data.patch_size`` may change: the same
convolutions see another patch (a block whose parameters follow the patch grid changes their shapes, refused by
:func:`~medseg.runs.checkpoint.load_model_state`)."""
RUN_ONLY_MODEL_KEYS = ("model.checkpointing", "model.channels_last", "model.dropout", "model.attention.drop_path",
                       "model.attention.max_bias_gb")
"""The ``model`` keys that change how the network is trained or run, not what its weights compute."""


def meaning_changes(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """``key=mine (checkpoint: theirs)`` for each key of :data:`MEANING_KEYS` where a resumed run (``mine``: its
    config as nested dicts, plus ``dataset``) differs from its checkpoint (``theirs``, the same form)."""
    def means(key: str) -> bool:
        return key not in RUN_ONLY_MODEL_KEYS and any(key == k or key.startswith(f"{k}.") for k in MEANING_KEYS)

    return [f"{key}={value_text(a)} (checkpoint: {value_text(b)})" for key, a, b in differing_values(mine, theirs)
            if means(key)]


class TrainStep:
    """One optimisation step: zero grads, forward under autocast, loss in float32, backward, clip, update.

    A step whose loss or gradient norm is not finite changes nothing (no weight, optimizer or scaler update)
    and returns None; under DDP every rank then skips together, so none waits in an all-reduce the others left.
    fp16 scales the loss (``GradScaler``), which skips overflowing steps itself.

    Args:
        model: the network, on ``device`` (possibly DDP-wrapped or compiled), in train mode.
        loss_fn: ``loss_fn(output, label)``; ``output`` is a list under deep supervision.
        grad_clip: max gradient norm; None: no clipping.
        amp: autocast dtype, or None for fp32.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
                 grad_clip: float | None, amp: torch.dtype | None, device: torch.device,
                 dist: DistInfo = SINGLE_PROCESS) -> None:
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.grad_clip, self.amp, self.device, self.dist = grad_clip, amp, device, dist
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

    def __call__(self, image: torch.Tensor, label: torch.Tensor) -> float | None:
        """``image`` ``(B, C, *spatial)``, ``label`` ``(B, 1, *spatial)`` -> the step's loss, or None if skipped."""
        image = image.to(self.device, non_blocking=True)
        label = label.to(self.device, non_blocking=True)
        with autocast(self.device, self.amp):
            output = self.model(image)
        loss = self.loss_fn([o.float() for o in output] if isinstance(output, list) else output.float(), label)
        self.optimizer.zero_grad(set_to_none=True)
        if any_rank(not bool(torch.isfinite(loss)), self.dist, self.device):
            return None
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        norm = (nn.utils.clip_grad_norm_(parameters, self.grad_clip) if self.grad_clip
                else nn.utils.get_total_norm([p.grad for p in parameters]))
        if not torch.isfinite(norm) and not self.scaler.is_enabled():  # the same norm on every rank under DDP
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.item()


def count_nonfinite(progress: Progress, loss: float | None, step: int, limit: int, last_checkpoint: Path) -> None:
    """The non-finite policy: a skipped step (``loss`` None) of ``step`` is logged and counted in ``progress``;
    ``limit`` in a row stop training.

    Raises:
        TrainingError: ``limit`` skipped steps in a row; the message names the last good checkpoint.
    """
    if loss is not None:
        progress.nonfinite_streak = 0
        return
    progress.nonfinite_streak += 1
    progress.nonfinite_total += 1
    epoch = progress.epoch + 1
    log.warning("non-finite loss or gradient at epoch %d step %d: step skipped (%d in a row)", epoch, step,
                progress.nonfinite_streak)
    if progress.nonfinite_streak >= limit:
        saved = str(last_checkpoint) if last_checkpoint.is_file() else "none yet (no epoch completed)"
        raise TrainingError(
            f"the loss or gradient was non-finite for {progress.nonfinite_streak} steps in a row at epoch {epoch}; "
            f"stopping. Last good checkpoint: {saved}. Lower trainer.lr, set trainer.grad_clip, or check the data "
            f"(scripts/check_data.py).")


class Trainer:
    """Trains one model on prepared data and writes checkpoints, ``metrics.json`` and TensorBoard logs.

    Args:
        cfg: the whole config, planned values resolved.
        data: loaders and datasets from :func:`medseg.training.prepare.prepare_data`.
        model: the network, already on ``device`` (possibly DDP-wrapped or compiled).
        output_dir: the run directory.
        class_weights: ``trainer.class_weights`` resolved, one per network output
            (:func:`medseg.training.losses.resolve_class_weights`), or None.
        run_started: ``time.perf_counter()`` when the run started (before its data and planning), the start of
            ``wall_seconds``; None: now.
    """

    def __init__(self, cfg: TrainConfig, data: PreparedData, model: nn.Module, device: torch.device,
                 output_dir: Path, dist: DistInfo, class_weights: list[float] | None,
                 run_started: float | None = None) -> None:
        self.cfg, self.data, self.model, self.device, self.dist = cfg, data, model, device, dist
        self.trainer = cfg.trainer
        self.layout = RunLayout(output_dir)
        self.output_dir = output_dir
        self.optimizer = build_optimizer(model.parameters(), self.trainer)
        self.scheduler = build_scheduler(self.optimizer, self.trainer)
        self.step = TrainStep(model, build_loss(cfg, data.info, class_weights), self.optimizer,
                              self.trainer.grad_clip, amp_dtype(self.trainer.precision, device), device, dist)
        self.loss = {"name": self.trainer.loss, "class_weights": named_class_weights(class_weights, data.info)}
        if dist.is_main:
            weights = self.loss["class_weights"]
            log.info("loss %s; class weights %s", self.loss["name"],
                     ", ".join(f"{name} {w:.3g}" for name, w in weights.items()) if weights else "none")
        minutes = self.trainer.max_minutes
        self.budget = None if minutes is None else TimeBudget(60.0 * minutes, self.trainer.max_epochs)
        self.progress = Progress()
        self.start_step = 0  # > 0: the step a mid-epoch resume goes on from
        self.run_started = time.perf_counter() if run_started is None else run_started
        self.resume_rng: dict[str, torch.Tensor | None] | None = None
        self.saved_last: str | None = None  # the epoch (and step) last.pt holds, for the message of a failed save
        self.tb = TensorBoardLogger(self.layout.tensorboard) if dist.is_main else None

    # --- the loop ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``max_epochs`` (from a resumed epoch if any); returns the metrics written to metrics.json."""
        reset_peak_memory(self.device)
        with GracefulStop(self.dist, self.device, str(self.layout.last_checkpoint)) as stop, self.tb or nullcontext():
            while self.progress.epoch < self.trainer.max_epochs:
                started, steps = time.perf_counter(), len(self.data.train_loader) - self.start_step
                record = {"epoch": self.progress.epoch + 1, "loss": self.train_epoch(stop),
                          "lr": self.optimizer.param_groups[0]["lr"], "steps": len(self.data.train_loader)}
                self.scheduler.step()
                self.progress.epoch += 1  # from here on, the number of completed epochs
                trained = time.perf_counter() - started
                self.progress.step_seconds += trained
                self.progress.steps_run += steps
                self.stop_if_budget_spent(trained)
                if self.data.val_patch_loader is not None:
                    record.update(self.validate_patches())
                if self.full_validation_due():
                    record.update(self.validate())
                self.progress.train_seconds += time.perf_counter() - started
                record["train_seconds"] = round(self.progress.train_seconds, 2)  # so far: val Dice over time
                self.fit_schedule_to_budget(time.perf_counter() - started, trained)
                self.progress.history.append(record)
                self.save(self.layout.last_checkpoint)
                self.log_epoch(record)
                if stop.requested():
                    if self.progress.epoch < self.trainer.max_epochs:
                        self.interrupt(stop, step=0)
                    elif self.dist.is_main:  # trained, validated and saved: the record takes no time to finish
                        log.warning("received %s during the last epoch: finishing the run's record", stop.name)
        return self.metrics()

    def train_epoch(self, stop: GracefulStop) -> float:
        """One pass over the training loader (from ``start_step`` after a mid-epoch resume); its mean loss."""
        self.model.train()
        self.seed_epoch()
        if not self.start_step:
            self.progress.epoch_losses, self.progress.nonfinite_streak = [], 0
        bar = tqdm(total=len(self.data.train_loader), initial=self.start_step, leave=False, dynamic_ncols=True,
                   desc=f"epoch {self.progress.epoch + 1}/{self.trainer.max_epochs}",
                   disable=not (self.trainer.progress and self.dist.is_main))
        for step, batch in replay(self.data.train_loader, self.start_step, self.restore_rng):
            image, label = batch["image"], batch["label"]
            if self.data.batch_augment is not None:  # data.augment_on=device: the draws applied here
                image, label = self.data.batch_augment(image.to(self.device, non_blocking=True),
                                                       label.to(self.device, non_blocking=True), batch[DRAWS])
            loss = self.step(image, label)
            count_nonfinite(self.progress, loss, step, self.trainer.max_nonfinite_steps, self.layout.last_checkpoint)
            if loss is not None:
                self.progress.epoch_losses.append(loss)
                bar.set_postfix(loss=f"{loss:.4f}")
            bar.update()
            if stop.requested():
                self.interrupt(stop, step + 1)
        bar.close()
        self.start_step, self.resume_rng = 0, None
        mean = float(np.mean(self.progress.epoch_losses)) if self.progress.epoch_losses else math.nan
        return float(np.mean([m for m in gather_objects(mean, self.dist) if not math.isnan(m)] or [mean]))

    def seed_epoch(self) -> None:
        """Reseed torch, numpy and the transforms for this epoch (per rank under DDP, still from ``(seed, epoch)``)."""
        seed = epoch_seed(self.trainer.seed, self.progress.epoch)
        seed_everything(seed)
        set_rnd(self.data.train_dataset, seed + self.dist.rank)

    def full_validation_due(self) -> bool:
        """Whether this epoch (``self.progress.epoch`` completed) predicts the validation volumes whole: every
        ``trainer.val_every`` epochs (never with null), the last one, and under ``trainer.max_minutes`` the first (the
        budget times an epoch with its validation)."""
        every, epoch = self.trainer.val_every, self.progress.epoch
        return (epoch == self.trainer.max_epochs or bool(every and epoch % every == 0)
                or (self.budget is not None and epoch == 1))

    def validate_patches(self) -> dict[str, Any]:
        """``trainer.val_iterations``: the pseudo-Dice of this epoch's validation patches and its moving average;
        ``best.pt`` when the average beats every earlier one (nnU-Net's checkpoint_best); the record entries."""
        set_rnd(self.data.val_patch_loader.dataset,
                epoch_seed(self.trainer.seed, self.progress.epoch) + self.dist.rank)
        result = pseudo_dice(self.model, self.data.val_patch_loader, self.data.info.label_spec, self.device,
                             amp_dtype(self.trainer.precision, self.device), self.dist)
        self.progress.pseudo_dice_ema = moving_average(self.progress.pseudo_dice_ema, result.dice)
        if self.progress.pseudo_dice_ema > self.progress.best_pseudo_dice_ema:
            self.progress.best_pseudo_dice_ema = self.progress.pseudo_dice_ema
            self.progress.best_epoch = self.progress.epoch
            self.save(self.layout.best_checkpoint)
        return {"pseudo_dice": result.dice, "pseudo_dice_ema": self.progress.pseudo_dice_ema,
                "pseudo_dice_per_class": result.per_class}

    def validate(self) -> dict[str, Any]:
        """Predict the validation volumes whole; the record entries. Without the pseudo-Dice, keep ``best.pt`` when
        the mean foreground Dice beats every earlier one. With it (which chose ``best.pt``), the last epoch validates
        ``best.pt``'s weights, whose Dice the run reports, and the earlier ones the current weights."""
        chosen_by_patches = self.data.val_patch_loader is not None and self.progress.best_pseudo_dice_ema >= 0
        if chosen_by_patches and self.progress.epoch == self.trainer.max_epochs:
            result = self.validate_weights(self.layout.best_checkpoint)
            self.progress.best_metric, self.progress.best_per_class = result.dice, result.per_class
        else:
            result = validate(self.model, self.data.val_dataset, self.data.window, self.cfg,
                              self.data.info.label_spec, self.device, self.dist)
        if self.tb is not None and result.overlay is not None and self.trainer.log_images:
            self.tb.overlay("val/overlay", *result.overlay, axis=self.data.window.slice_axis,
                            step=self.progress.epoch)
        if not chosen_by_patches and result.dice > self.progress.best_metric:  # never replace best.pt with a worse one
            self.progress.best_metric, self.progress.best_per_class = result.dice, result.per_class
            self.progress.best_epoch = self.progress.epoch
            self.save(self.layout.best_checkpoint)
        record: dict[str, Any] = {"val_dice": result.dice, "val_dice_per_class": result.per_class}
        if self.tb is not None and self.trainer.attention_maps and len(self.data.val_dataset):
            record["attention_distance_mm"] = log_attention(
                self.tb, self.model, self.data.val_dataset[0], self.data.window,
                self.cfg.model.spatial_dims, self.cfg.data.spacing, self.device, self.progress.epoch)
        return record

    def validate_weights(self, path: Path) -> ValidationResult:
        """The full validation of the weights of checkpoint ``path``; the network keeps its own weights."""
        network = unwrap_model(self.model)
        own = {key: value.clone() for key, value in network.state_dict().items()}
        load_model_state(self.model, load_checkpoint(path, map_location=self.device)["model"], path)
        try:
            return validate(self.model, self.data.val_dataset, self.data.window, self.cfg,
                            self.data.info.label_spec, self.device, self.dist)
        finally:
            network.load_state_dict(own)

    def stop_if_budget_spent(self, trained: float) -> None:
        """``trainer.max_minutes``: make this epoch (``trained`` seconds so far) the last when another would not fit."""
        if self.budget is not None and broadcast_object(  # rank 0 decides for all
                self.budget.spent(self.progress.train_seconds + trained, self.progress.epoch), self.dist):
            self.set_max_epochs(self.progress.epoch)

    def fit_schedule_to_budget(self, first_epoch: float, trained: float) -> None:
        """``trainer.max_minutes``, after the first epoch (``first_epoch`` seconds with its validation, ``trained``
        without): the epochs the budget spans become ``max_epochs``, and the schedule spans them."""
        if self.budget is None or self.progress.epoch != 1 or self.progress.epoch >= self.trainer.max_epochs:
            return
        horizon = self.budget.horizon(first_epoch, trained, first_epoch - trained,
                                      self.trainer.val_every or self.trainer.max_epochs)
        self.set_max_epochs(broadcast_object(horizon, self.dist), reschedule=True)

    def set_max_epochs(self, epochs: int, reschedule: bool = False) -> None:
        """End training after ``epochs`` (``trainer.max_minutes``); ``reschedule``: the schedule spans them, continued
        from the epochs done. The checkpoints' config carries the new value, which a resumed run takes over."""
        self.trainer = replace(self.trainer, max_epochs=epochs)
        self.cfg = replace(self.cfg, trainer=self.trainer)
        if reschedule:  # torch's schedules compute each lr from the last one: start from the peak lr again
            for group in self.optimizer.param_groups:
                group["lr"] = group["initial_lr"]
            self.scheduler = build_scheduler(self.optimizer, self.trainer)
            for _ in range(self.progress.epoch):
                self.scheduler.step()
        if self.dist.is_main:
            log.info("trainer.max_minutes=%g: %d epoch(s) fit the budget", self.trainer.max_minutes, epochs)

    def interrupt(self, stop: GracefulStop, step: int) -> None:
        """Save ``last.pt`` (mid-epoch at ``step`` > 0) and stop with :class:`TrainingInterrupted`."""
        path = self.save(self.layout.last_checkpoint, step=step)
        raise TrainingInterrupted(
            f"stopped by {stop.name} at {saved_at(self.progress.epoch, step)}; saved {path or 'last.pt (rank 0)'}. "
            f"Resume with the same overrides plus: hydra.run.dir={self.output_dir} trainer.resume=true",
            128 + stop.signum)

    # --- checkpoints -------------------------------------------------------------------------
    def state(self, step: int = 0) -> dict[str, Any]:
        """Everything needed to resume; ``step`` > 0 marks a checkpoint written mid-epoch."""
        return {
            "model": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.step.scaler.state_dict(),
            "step": step,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            **self.progress.saved(step, self.wall_seconds()),
            "config": asdict(self.cfg),
            "loss": self.loss,
            "dataset": self.dataset_description(),
        }

    def dataset_description(self) -> dict[str, Any]:
        """The labels and channels of the dataset, as checkpoints hold them (``dataset``)."""
        return {**self.data.info.label_spec.as_dict(), "channel_names": self.data.info.channel_names}

    def save(self, path: Path, step: int = 0) -> Path | None:
        """Write the checkpoint ``path`` (rank 0 only; ``self.layout``'s best or last); returns it.

        Raises:
            NoSpaceError: the disk is full; the message says which epoch ``last.pt`` still holds.
        """
        if not self.dist.is_main:
            return None
        try:
            save_checkpoint(path, self.state(step))
        except NoSpaceError as err:
            kept = f"last.pt of {self.saved_last} is intact" if self.saved_last else "no last.pt was saved yet"
            raise NoSpaceError(f"{err}; {kept}: free some space, then resume with trainer.resume=true") from None
        if path == self.layout.last_checkpoint:
            self.saved_last = saved_at(self.progress.epoch, step)
        return path

    def resume(self, path: Path) -> None:
        """Restore model, optimizer, scheduler, scaler, epoch/step, best metric and history from ``path``."""
        state = load_checkpoint(path, map_location=self.device, needs=RESUMED_KEYS)
        load_model_state(self.model, state["model"], path)
        self.check_same_meaning(state, path)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.budget is not None and state["epoch"] > 0:  # the epochs the budget was found to span
            self.set_max_epochs(state["config"]["trainer"]["max_epochs"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.step.scaler.load_state_dict(state["scaler"])
        elif self.step.scaler.is_enabled() and self.dist.is_main:
            log.info("%s holds no fp16 loss scale: it starts afresh (its first steps may be skipped)", path)
        self.progress, self.start_step = Progress.restored(state), state["step"]
        self.resume_rng = {"torch": state["torch_rng"], "cuda": state["cuda_rng"]} if self.start_step else None
        if path.resolve() == self.layout.last_checkpoint.resolve():
            self.saved_last = saved_at(self.progress.epoch, self.start_step)
        if self.dist.is_main:
            log.info("resumed from %s at %s (best val Dice %.4f)", path, saved_at(self.progress.epoch, self.start_step),
                     self.progress.best_metric)

    def check_same_meaning(self, state: Mapping[str, Any], path: Path) -> None:
        """Refuse to resume checkpoint ``state`` (read from ``path``) when its weights mean something else in this run:
        a key of :data:`MEANING_KEYS` differs (after planning), though the weights may fit.

        Raises:
            CheckpointError: naming each differing key with both values.
        """
        theirs = {**asdict(to_typed(TrainConfig, state["config"])), "dataset": state["dataset"]}
        changes = meaning_changes({**asdict(self.cfg), "dataset": self.dataset_description()}, theirs)
        if changes:
            raise CheckpointError(
                f"checkpoint {path} was trained with other values of keys that change what its weights mean: "
                f"{'; '.join(changes)}. Resume with the checkpoint's values (data.plan_from=init takes its planned "
                f"ones), or start a new run from its weights with trainer.init_from={path}")

    def init_weights(self, path: Path) -> None:
        """``trainer.init_from``: another run's weights, and nothing else of it (the optimizer, the schedule and the
        epochs start afresh): a medseg checkpoint, a plain state dict of medseg's network
        (:func:`~medseg.runs.checkpoint.read_start_weights`), or a trained nnU-Net model (:meth:`init_from_nnunet`).

        The model config must match the weights'. Only the layers whose shape follows the number of classes or
        input channels may differ: those keep their fresh initialisation and are named in one log line.

        Raises:
            CheckpointError: the weights are missing or foreign, or their architecture differs otherwise (the message
                names the differing tensors and, for a checkpoint, the differing model config keys).
        """
        source = nnunet_start(self.cfg)
        if source is not None:
            self.init_from_nnunet(source)
            return
        state = read_start_weights(path, map_location=self.device)
        network = unwrap_model(self.model)
        inserted = [name for name in network.slot_blocks() if not any(k.startswith(f"{name}.") for k in state["model"])]
        outside = tuple(f"{name}." for name in inserted)
        changes = (self.check_fit(state, path, outside) if "config" in state
                   else self.check_state_dict_fit(state["model"], path, outside))
        kept = [key for key in load_fitting_state(self.model, state["model"]) if not key.startswith(outside)]
        network.start_slots_as_identity(inserted)
        self.progress.started_from = str(path)
        if self.dist.is_main:
            layers = sorted({key.rsplit(".", 1)[0] for key in kept})
            log.info("initialised from %s (its weights only); re-initialised %d layer(s) of another shape%s: %s%s",
                     path, len(layers), f" ({', '.join(changes)})" if changes else "", ", ".join(layers) or "none",
                     f"; inserted as the identity: {', '.join(inserted)}" if inserted else "")

    def check_fit(self, state: Mapping[str, Any], path: Path, inserted: tuple[str, ...] = ()) -> list[str]:
        """Refuse a medseg checkpoint whose network is not this run's but for its classes and input channels and the
        attention blocks it lacks (``inserted``: their key prefixes); returns the classes and channels that differ, in
        words.

        Raises:
            CheckpointError: naming the differing tensors and model config keys.
        """
        try:
            source_classes = LabelSpec.from_dict(state["dataset"]).num_outputs
            source_channels = len(state["dataset"]["channel_names"])
            source_model = state["config"]["model"]
        except (KeyError, TypeError) as err:
            raise CheckpointError(f"trainer.init_from={path} lacks the config or dataset description of its run "
                                  f"({type(err).__name__}: {err})") from None
        with torch.random.fork_rng(devices=[]):  # the same network with the checkpoint's classes and channels
            like_source = build_model(self.cfg.model, source_channels, source_classes, self.data.window.net_patch)
        expected = {key: value for key, value in like_source.state_dict().items() if not key.startswith(inserted)}
        mismatch = state_mismatch(expected, state["model"])
        if mismatch:
            differing = [f"model.{key}={mine} (checkpoint: {theirs})"
                         for key, mine, theirs in differing_values(asdict(self.cfg.model), source_model)]
            raise CheckpointError(
                f"trainer.init_from={path} does not fit this model ({mismatch}); only the number of classes and input "
                f"channels may differ, set the model config as the checkpoint's"
                + (f": {', '.join(differing[:4])}" if differing else ""))
        info = self.data.info
        return [f"{what} {before} -> {now}" for what, before, now in (
            ("classes", source_classes, info.num_outputs), ("input channels", source_channels, info.in_channels))
            if before != now]

    def check_state_dict_fit(self, weights: Mapping[str, torch.Tensor], path: Path,
                             inserted: tuple[str, ...] = ()) -> list[str]:
        """Refuse a plain state dict that is not this run's network but in the layers whose shape follows the classes
        or input channels (found by building the network with one more of each) and the attention blocks it lacks
        (``inserted``: their key prefixes); returns nothing to add.

        Raises:
            CheckpointError: naming the tensors that differ.
        """
        info, patch = self.data.info, self.data.window.net_patch
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            own = build_model(self.cfg.model, info.in_channels, info.num_outputs, patch).state_dict()
            wider = build_model(self.cfg.model, info.in_channels + 1, info.num_outputs + 1, patch).state_dict()
        following = {key for key in own if own[key].shape != wider[key].shape or key.startswith(inserted)}
        mismatch = state_mismatch({key: value for key, value in own.items() if key not in following},
                                  {key: value for key, value in weights.items() if key not in following})
        missing = sorted(key for key in following - set(weights) if not key.startswith(inserted))
        if mismatch or missing:
            raise CheckpointError(f"trainer.init_from={path} (a state dict) does not fit this model ("
                                  f"{mismatch or 'missing: ' + ', '.join(missing)}); only the layers that follow the "
                                  "classes and input channels may differ: set the model config of the network it is of")
        return []

    def init_from_nnunet(self, source: NnunetModel) -> None:
        """``trainer.init_from`` a trained nnU-Net model: :func:`~medseg.training.nnunet_start.start_from_nnunet`, its
        attention slots started as the identity, and one log line of what started afresh.

        Raises:
            CheckpointError: see :func:`~medseg.training.nnunet_start.start_from_nnunet`.
        """
        val_cases = read_val_cases(self.layout.splits_file)
        start = start_from_nnunet(self.model, self.cfg, self.data.info, source, val_cases)
        self.progress.started_from = source.describe()
        if self.dist.is_main:
            log.info("initialised from %s (its weights only): %s; started as the identity: %s; started afresh: %s; "
                     "%s", source.describe(), start.classes, ", ".join(start.identity_slots) or "no attention slot",
                     ", ".join(start.fresh) or "nothing else", start.leak_check)

    def restore_rng(self) -> None:
        """Put back the torch (and CUDA) RNG of a mid-epoch checkpoint."""
        assert self.resume_rng is not None
        torch.set_rng_state(self.resume_rng["torch"].cpu())
        if self.resume_rng["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(self.resume_rng["cuda"].cpu(), self.device)

    # --- outputs -----------------------------------------------------------------------------
    def wall_seconds(self) -> float:
        """The run's wall time so far: from its start, planning, data preparation and validation included (over
        resumes, the sum of each process's time up to its last checkpoint)."""
        return self.progress.wall_seconds + time.perf_counter() - self.run_started

    def log_epoch(self, record: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        msg = f"epoch {record['epoch']}/{self.trainer.max_epochs}  loss {record['loss']:.4f}"
        if "pseudo_dice" in record:
            msg += f"  pseudo-Dice {record['pseudo_dice']:.4f} (average {record['pseudo_dice_ema']:.4f})"
        if "val_dice" in record:  # best.pt's Dice is known once a full validation scored it
            msg += f"  val Dice {record['val_dice']:.4f}"
            progress = self.progress
            msg += f" (best {progress.best_metric:.4f} @ {progress.best_epoch})" if progress.best_metric >= 0 else ""
        log.info(msg)
        assert self.tb is not None
        self.tb.scalars(record, nonfinite_steps=self.progress.nonfinite_total)

    def metrics(self) -> dict[str, Any]:
        """The run's results, as written to ``metrics.json``."""
        return {
            "status": "completed",
            "best_val_dice": self.progress.best_metric,
            "best_epoch": self.progress.best_epoch,
            "epochs": self.progress.epoch,
            "val_dice_per_class": self.progress.best_per_class,
            "train_seconds": round(self.progress.train_seconds, 2),
            "wall_seconds": round(self.wall_seconds(), 2),
            "seconds_per_step": (round(self.progress.step_seconds / self.progress.steps_run, 4)
                                 if self.progress.steps_run else None),
            "params": sum(p.numel() for p in unwrap_model(self.model).parameters()),
            "peak_memory_mb": round(peak_memory_mb(self.device), 1),
            "device": str(self.device),
            "nonfinite_steps": self.progress.nonfinite_total,
            "started_from": self.progress.started_from,
            "history": self.progress.history,
        }

    def finish(self, metrics: dict[str, Any], hparams: dict[str, Any]) -> None:
        """Write ``metrics.json``, the TensorBoard hparams, and log the summary table (rank 0)."""
        if not self.dist.is_main:
            return
        atomic_write_json(self.layout.metrics_file, metrics)
        assert self.tb is not None
        self.tb.hparams(hparams, {"hparam/best_val_dice": metrics["best_val_dice"]})
        log.info("run finished; outputs in %s\n%s", self.output_dir, self.summary(metrics))

    def summary(self, metrics: dict[str, Any]) -> str:
        """The end-of-run table printed to the terminal."""
        rows = [["best val Dice (mean fg)", metrics["best_val_dice"]], ["best epoch", metrics["best_epoch"]]]
        rows += [[f"  Dice {name}", value] for name, value in metrics["val_dice_per_class"].items()]
        per_step = metrics["seconds_per_step"]
        rows += [["epochs", metrics["epochs"]], ["train time (s)", f"{metrics['train_seconds']:.1f}"],
                 ["wall time, whole run (s)", f"{metrics['wall_seconds']:.1f}"],
                 ["s per training step", "-" if per_step is None else f"{per_step:.3g}"],
                 ["parameters", f"{metrics['params']:,}"]]
        if "gflops_per_patch_forward" in metrics:  # medseg.training.run.train counts them
            gflops = metrics["gflops_per_patch_forward"]
            rows.append(["GFLOPs, forward of one patch", "not counted" if gflops is None else f"{gflops:.4g}"])
        rows.append(["peak memory (MB)", f"{metrics['peak_memory_mb']:.0f}"])
        if "peak_ram_mb" in metrics:  # medseg.training.run.train measures it
            rows.append(["peak RAM with workers (MB)", f"{metrics['peak_ram_mb']:.0f}"])
        if "estimated_memory_mb" in metrics:
            rows.append(["training step, planner's estimate (MB)", f"{metrics['estimated_memory_mb']:.0f}"])
        if "planned_for" in metrics:
            target = metrics["planned_for"]
            budget = "voxel budget" if target["memory_gb"] is None else f"{target['memory_gb']:g} GB"
            rows.append(["planned for", f"{target['device']}, {target['precision']}, {budget}"])
        rows.append(["checkpoints", str(self.layout.checkpoints)])
        return text_table(["result", "value"], rows)
