"""The training loop: one readable class that trains, validates, checkpoints and logs.

Randomness is a function of ``(seed, epoch)``: every epoch reseeds torch, numpy and the MONAI
transforms, so a run resumed from ``last.pt`` replays exactly what an uninterrupted run would have done.
A checkpoint written mid-epoch by a graceful stop (SIGINT/SIGTERM) also holds the step, the losses so
far and the torch RNG: the resumed run replays the loader through the steps already taken (so the
transforms' random streams advance as before), restores the RNG, and goes on from the next step.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import resource
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data.utils import set_rnd
from monai.losses import DeepSupervisionLoss, DiceCELoss
from monai.metrics import DiceMetric
from monai.networks.utils import one_hot
from torch import nn
from tqdm import tqdm

from medseg.engine.checkpoint import load_checkpoint, load_model_state, save_checkpoint, unwrap_model
from medseg.engine.data import PreparedData
from medseg.engine.distributed import DistInfo, any_rank, gather_objects, reduce_max
from medseg.engine.inference import autocast_context, predict_volume
from medseg.engine.report import text_table
from medseg.engine.tensorboard import TensorBoardLogger
from medseg.io import atomic_write_json

log = logging.getLogger("medseg")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss stays non-finite); the message says what to do."""


class TrainingInterrupted(RuntimeError):
    """SIGINT/SIGTERM stopped training after saving ``last.pt``; ``exit_code`` is 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name}: CUDA is not available on this machine")
    return device


def amp_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for ``trainer.precision``: ``auto`` is bf16 on CUDA and fp32 (None) on the CPU."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def deterministic_algorithms(enabled: bool) -> Callable[[], None]:
    """Switch torch to deterministic algorithms (``trainer.deterministic``); returns what restores the previous mode.

    Ops without a deterministic implementation warn instead of failing. cuBLAS is deterministic only
    with ``CUBLAS_WORKSPACE_CONFIG`` set before its first use, so it is set here unless already set.
    """
    if not enabled:
        return lambda: None
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    return lambda: torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs (torch's seeds every CUDA device too)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch: distinct per (seed, epoch), the same on every resume."""
    return (seed * 1_000_003 + epoch * 7919) % 2**31


def lr_factor(schedule: str, epoch: int, max_epochs: int, warmup: int) -> float:
    """Multiplier of the base lr at ``epoch``: linear warm-up, then cosine, poly (0.9) or constant."""
    if epoch < warmup:
        return (epoch + 1) / warmup
    progress = (epoch - warmup) / max(1, max_epochs - warmup)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "poly":
        return (1.0 - progress) ** 0.9
    return 1.0


def reset_peak_memory(device: torch.device) -> None:
    """Start a new window for :func:`peak_memory_mb` (a Hydra multirun trains its jobs in one process).

    On the CPU this resets the process's peak resident memory to its current value (Linux ``clear_refs``);
    where that is unavailable, the peak stays the process's lifetime peak.
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated on CUDA; peak resident memory of the process on the CPU (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmHWM:", 1)[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Trainer:
    """Trains one model on prepared data and writes checkpoints, metrics.json and TensorBoard logs.

    Args:
        cfg: the whole resolved config as plain types (planned values filled in).
        data: loaders and datasets from :func:`medseg.engine.data.prepare_data`.
        model: the network (already on ``device``, possibly DDP-wrapped or compiled).
        output_dir: the run directory.
    """

    def __init__(self, cfg: dict[str, Any], data: PreparedData, model: nn.Module, device: torch.device,
                 output_dir: Path, dist_info: DistInfo) -> None:
        self.cfg, self.data, self.model, self.device = cfg, data, model, device
        self.tcfg = cfg["trainer"]
        self.output_dir, self.dist = output_dir, dist_info
        self.ckpt_dir = output_dir / "checkpoints"
        self.amp_dtype = amp_dtype(self.tcfg["precision"], device)
        self.class_names = [data.info.labels[i] for i in range(1, data.info.num_classes)]
        params = [p for p in model.parameters() if p.requires_grad]
        if self.tcfg["optimizer"] == "sgd":
            self.optimizer: torch.optim.Optimizer = torch.optim.SGD(
                params, lr=self.tcfg["lr"], momentum=self.tcfg["momentum"], nesterov=True,
                weight_decay=self.tcfg["weight_decay"])
        else:
            self.optimizer = torch.optim.AdamW(params, lr=self.tcfg["lr"], weight_decay=self.tcfg["weight_decay"])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda e: lr_factor(
            self.tcfg["scheduler"], e, self.tcfg["max_epochs"], self.tcfg["warmup_epochs"]))
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
        loss = DiceCELoss(to_onehot_y=True, softmax=True)
        self.loss_fn = DeepSupervisionLoss(loss) if data.model_cfg.get("deep_supervision") else loss
        self.epoch, self.start_step = 0, 0
        self.best_dice, self.best_epoch, self.best_per_class = -1.0, -1, {}
        self.history: list[dict[str, Any]] = []
        self.nonfinite_total = 0
        self.train_seconds = 0.0
        self._stop_signal: int | None = None
        self._signals_received = 0
        self._resume_rng: dict[str, torch.Tensor | None] | None = None
        self._epoch_losses: list[float] = []  # finite losses of the current epoch so far
        self._nonfinite_streak = 0  # non-finite steps in a row
        self.tb = TensorBoardLogger(output_dir / "tensorboard") if dist_info.is_main else None

    # --- checkpoints -------------------------------------------------------------------------
    def state(self, step: int = 0) -> dict[str, Any]:
        """Everything needed to resume; ``step`` > 0 marks a checkpoint written mid-epoch."""
        return {
            "model": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "step": step,
            "epoch_losses": list(self._epoch_losses) if step else [],
            "nonfinite_streak": self._nonfinite_streak if step else 0,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "best_metric": self.best_dice,
            "best_epoch": self.best_epoch,
            "best_per_class": self.best_per_class,
            "history": self.history,
            "nonfinite_total": self.nonfinite_total,
            "train_seconds": self.train_seconds,
            "config": self.cfg,
            "dataset": {"labels": {str(k): v for k, v in self.data.info.labels.items()},
                        "channel_names": self.data.info.channel_names, "slice_axis": self.data.slice_axis,
                        "roi_size": self.data.roi_size},
        }

    def save(self, name: str, step: int = 0) -> Path | None:
        if not self.dist.is_main:
            return None
        return save_checkpoint(self.ckpt_dir / name, self.state(step))

    def resume(self, path: Path) -> None:
        """Restore model, optimizer, scheduler, scaler, epoch/step, best metric and history from ``path``."""
        state = load_checkpoint(path, map_location=self.device)
        load_model_state(self.model, state["model"], path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.start_step = state["epoch"], state["step"]
        self.best_dice, self.best_epoch = state["best_metric"], state["best_epoch"]
        self.best_per_class, self.history = state["best_per_class"], state["history"]
        self.nonfinite_total, self.train_seconds = state["nonfinite_total"], state["train_seconds"]
        # .get: checkpoints written before these keys existed resume too (only the epoch's mean loss differs)
        self._epoch_losses, self._nonfinite_streak = state.get("epoch_losses", []), state.get("nonfinite_streak", 0)
        self._resume_rng = {"torch": state["torch_rng"], "cuda": state.get("cuda_rng")} if self.start_step else None
        if self.dist.is_main:
            self._remove_stale_temp_files()
            where = f"epoch {self.epoch}" + (f", step {self.start_step}" if self.start_step else "")
            log.info("resumed from %s at %s (best val Dice %.4f)", path, where, self.best_dice)

    def _remove_stale_temp_files(self) -> None:
        """Delete temp files of checkpoint writes that a killed run left unfinished (the targets are intact)."""
        for tmp in self.ckpt_dir.glob(".*.pt.*.tmp"):
            log.info("removing %s, an unfinished checkpoint write of a killed run", tmp)
            tmp.unlink(missing_ok=True)

    def _restore_rng(self) -> None:
        """Put back the torch (and CUDA) RNG of a mid-epoch checkpoint."""
        assert self._resume_rng is not None
        torch.set_rng_state(self._resume_rng["torch"].cpu())
        if self._resume_rng["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(self._resume_rng["cuda"].cpu(), self.device)

    # --- signals -----------------------------------------------------------------------------
    def _request_stop(self, signum: int, _frame: Any) -> None:
        """First SIGINT/SIGTERM: stop after the current step. A second one: stop at once, without saving."""
        name = signal.Signals(signum).name
        self._signals_received += 1
        if self._signals_received > 1:
            log.warning("received %s again: stopping now without saving; %s keeps the last saved state",
                        name, self.ckpt_dir / "last.pt")
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._stop_signal = signum
        if self.dist.is_main:
            log.warning("received %s: finishing the current step, then saving last.pt (send it again to stop "
                        "at once without saving)", name)

    def _stop_requested(self) -> bool:
        """Whether any rank got SIGINT/SIGTERM; under DDP all ranks then stop at the same step."""
        signum = int(reduce_max(float(self._stop_signal or 0), self.dist, self.device))
        if signum:
            self._stop_signal = signum
        return bool(signum)

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Route SIGINT/SIGTERM to a graceful stop; returns the previous handlers (none off the main thread)."""
        if threading.current_thread() is not threading.main_thread():  # Python only lets the main thread do this
            log.warning("training outside the main thread: SIGINT/SIGTERM will not stop it gracefully")
            return {}
        return {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    # --- training ----------------------------------------------------------------------------
    def _seed_epoch(self) -> None:
        seed = epoch_seed(self.tcfg["seed"], self.epoch)
        seed_everything(seed)
        set_rnd(self.data.train_dataset, seed)
        if self.dist.enabled:  # different augmentations per rank, still a function of (seed, epoch)
            set_rnd(self.data.train_dataset, seed + self.dist.rank)

    def _train_step(self, batch: dict[str, torch.Tensor]) -> float | None:
        """One optimisation step; returns its loss, or None when the loss or the gradients are non-finite.

        A non-finite step changes nothing: no weight, optimizer or scaler update.
        """
        image = batch["image"].to(self.device, non_blocking=True)
        label = batch["label"].to(self.device, non_blocking=True)
        with autocast_context(self.device, self.amp_dtype):
            output = self.model(image)
        loss = self.loss_fn([o.float() for o in output] if isinstance(output, list) else output.float(), label)
        self.optimizer.zero_grad(set_to_none=True)
        # under DDP every rank skips together: a lone skipped backward would leave the others in its all-reduce
        if any_rank(not bool(torch.isfinite(loss)), self.dist, self.device):
            return None
        self.scaler.scale(loss).backward()
        if not self._clip_gradients() and not self.scaler.is_enabled():  # fp16's scaler skips such steps itself
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.item()

    def _clip_gradients(self) -> bool:
        """Clip the gradient norm to ``trainer.grad_clip`` (null: no clipping); returns whether the norm is finite.

        Under DDP the gradients, hence the norm and the decision to skip, are the same on every rank.
        """
        self.scaler.unscale_(self.optimizer)
        if self.tcfg["grad_clip"]:
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.tcfg["grad_clip"])
        else:
            norm = nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
        return bool(torch.isfinite(norm))

    def _last_good_checkpoint(self) -> str:
        last = self.ckpt_dir / "last.pt"
        return str(last) if last.is_file() else "none yet (no epoch completed)"

    def train_epoch(self) -> float:
        """One pass over the training loader (from ``start_step`` after a mid-epoch resume); returns its mean loss."""
        self.model.train()
        self._seed_epoch()
        if not self.start_step:
            self._epoch_losses, self._nonfinite_streak = [], 0
        bar = tqdm(self.data.train_loader, desc=f"epoch {self.epoch + 1}/{self.tcfg['max_epochs']}",
                   disable=not (self.tcfg["progress"] and self.dist.is_main), leave=False, dynamic_ncols=True)
        for step, batch in enumerate(bar):
            if step < self.start_step:  # fast-forward through a mid-epoch resume, replaying the data RNG
                if step == self.start_step - 1 and self._resume_rng is not None:
                    self._restore_rng()
                continue
            loss = self._train_step(batch)
            if loss is None:
                self._skip_nonfinite(step)
            else:
                self._nonfinite_streak = 0
                self._epoch_losses.append(loss)
                bar.set_postfix(loss=f"{loss:.4f}")
            if self._stop_requested():
                self._interrupt(step + 1)
        self.start_step, self._resume_rng = 0, None
        mean = float(np.mean(self._epoch_losses)) if self._epoch_losses else float("nan")
        return float(np.mean([m for m in gather_objects(mean, self.dist) if not math.isnan(m)] or [mean]))

    def _skip_nonfinite(self, step: int) -> None:
        """Count a skipped non-finite step; too many in a row stop training with :class:`TrainingError`."""
        self._nonfinite_streak += 1
        self.nonfinite_total += 1
        log.warning("non-finite loss or gradient at epoch %d step %d: step skipped (%d in a row)",
                    self.epoch + 1, step, self._nonfinite_streak)
        if self._nonfinite_streak >= self.tcfg["max_nonfinite_steps"]:
            raise TrainingError(
                f"the loss or gradient was non-finite for {self._nonfinite_streak} steps in a row at epoch "
                f"{self.epoch + 1}; stopping. Last good checkpoint: {self._last_good_checkpoint()}. Lower trainer.lr, "
                f"set trainer.grad_clip, or check the data (scripts/check_data.py)."
            )

    def _interrupt(self, step: int) -> None:
        path = self.save("last.pt", step=step)
        name = signal.Signals(self._stop_signal).name
        raise TrainingInterrupted(
            f"stopped by {name} at epoch {self.epoch + 1}, step {step}; saved {path or 'last.pt (rank 0)'}. "
            f"Resume with the same overrides plus: hydra.run.dir={self.output_dir} trainer.resume=true",
            128 + int(self._stop_signal),
        )

    # --- validation --------------------------------------------------------------------------
    def validate(self) -> tuple[float, dict[str, float]]:
        """Sliding-window Dice per foreground class over this rank's validation cases, gathered over ranks."""
        self.model.eval()
        # The convention of evaluate.py (medseg.engine.metrics): a class absent from both label and prediction
        # scores 1, any prediction of a class the label lacks scores 0; so validation and evaluation agree.
        metric = DiceMetric(include_background=False, reduction="none", ignore_empty=False)
        rows, first = [], None
        for index in range(len(self.data.val_dataset)):
            item = self.data.val_dataset[index]
            image = item["image"].unsqueeze(0).to(self.device)
            probs = predict_volume(
                self.model, image, self.data.roi_size, self.data.model_cfg["spatial_dims"], self.data.slice_axis,
                sw_batch_size=self.tcfg["sw_batch_size"], overlap=self.tcfg["sw_overlap"], device=self.device,
                amp_dtype=self.amp_dtype)
            pred = probs.argmax(1, keepdim=True)
            label = item["label"].unsqueeze(0).to(pred.device).round().long()
            num_classes = self.data.info.num_classes
            rows.append(metric(one_hot(pred, num_classes), one_hot(label, num_classes))[0].tolist())
            if first is None:
                first = (image[0, 0].cpu(), label[0, 0].cpu(), pred[0, 0].cpu())
        all_rows = [r for part in gather_objects(rows, self.dist) for r in part]
        per_class = np.nanmean(np.asarray(all_rows, dtype=float), axis=0) if all_rows else []
        named = {name: float(v) for name, v in zip(self.class_names, per_class)}
        mean = float(np.nanmean(list(named.values()))) if named else float("nan")
        if self.tb is not None and first is not None and self.tcfg["log_images"]:
            self.tb.overlay("val/overlay", *first, axis=self.data.slice_axis, step=self.epoch)
        return mean, named

    # --- the loop ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``max_epochs`` (from a resumed epoch if any); returns the metrics written to metrics.json."""
        previous = self._install_signal_handlers()
        reset_peak_memory(self.device)
        max_epochs, val_every = self.tcfg["max_epochs"], self.tcfg["val_every"]
        try:
            while self.epoch < max_epochs:
                started = time.perf_counter()
                loss = self.train_epoch()
                self.scheduler.step()
                self.epoch += 1  # from here on, the number of completed epochs
                record: dict[str, Any] = {"epoch": self.epoch, "loss": loss,
                                          "lr": self.optimizer.param_groups[0]["lr"]}
                if self.epoch % val_every == 0 or self.epoch == max_epochs:
                    dice, per_class = self.validate()
                    record.update(val_dice=dice, val_dice_per_class=per_class)
                    if dice > self.best_dice:  # never replace best.pt with a worse model
                        self.best_dice, self.best_epoch, self.best_per_class = dice, self.epoch, per_class
                        self.save("best.pt")
                self.train_seconds += time.perf_counter() - started
                self.history.append(record)
                self.save("last.pt")
                self._log_epoch(record)
                if self._stop_requested():
                    self._interrupt(0)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.tb is not None:
                self.tb.close()
        return self.metrics()

    def _log_epoch(self, record: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        msg = f"epoch {record['epoch']}/{self.tcfg['max_epochs']}  loss {record['loss']:.4f}"
        if "val_dice" in record:
            msg += f"  val Dice {record['val_dice']:.4f} (best {self.best_dice:.4f} @ {self.best_epoch})"
        log.info(msg)
        assert self.tb is not None
        self.tb.scalars(record, nonfinite_steps=self.nonfinite_total)

    def metrics(self) -> dict[str, Any]:
        """The run's results, as written to ``metrics.json``."""
        return {
            "status": "completed",
            "best_val_dice": self.best_dice,
            "best_epoch": self.best_epoch,
            "epochs": self.epoch,
            "val_dice_per_class": self.best_per_class,
            "train_seconds": round(self.train_seconds, 2),
            "params": sum(p.numel() for p in unwrap_model(self.model).parameters()),
            "peak_memory_mb": round(peak_memory_mb(self.device), 1),
            "nonfinite_steps": self.nonfinite_total,
            "history": self.history,
        }

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        if self.dist.is_main:
            atomic_write_json(self.output_dir / "metrics.json", metrics)

    def summary(self, metrics: dict[str, Any]) -> str:
        """The end-of-run table printed to the terminal."""
        rows = [["best val Dice (mean fg)", metrics["best_val_dice"]], ["best epoch", metrics["best_epoch"]]]
        rows += [[f"  Dice {name}", value] for name, value in metrics["val_dice_per_class"].items()]
        rows += [["epochs", metrics["epochs"]], ["train time (s)", f"{metrics['train_seconds']:.1f}"],
                 ["parameters", f"{metrics['params']:,}"], ["peak memory (MB)", f"{metrics['peak_memory_mb']:.0f}"],
                 ["checkpoints", str(self.ckpt_dir)]]
        return text_table(["result", "value"], rows)
