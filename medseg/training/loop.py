"""Pieces of the training loop that are not training: graceful stops on signals (and loader workers that leave them
to the training process), and mid-epoch replay."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType, TracebackType
from typing import ClassVar, TypeVar

import torch
from monai.data.utils import worker_init_fn

from medseg.runtime.distributed import reduce_max
from medseg.runtime.launch import DistInfo

log = logging.getLogger("medseg")

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """While active, the first SIGINT/SIGTERM asks training to stop after the current step; a second one stops at
    once, without saving. Previous handlers are restored on exit.

    Outside Python's main thread signals cannot be routed (a warning says so) and :meth:`requested` stays false.
    """

    latest_signal: ClassVar[int] = 0
    """The stop signal the latest ``GracefulStop`` of this process received (0: none), set by the handler and kept
    after the block: however the training ended, a multirun's task reads it to stop the sweep
    (:func:`medseg.training.run.train_cli`)."""

    def __init__(self, dist: DistInfo, device: torch.device, saved_state: str) -> None:
        self.dist, self.device, self.saved_state = dist, device, saved_state
        self.signum = 0
        self._received = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulStop:
        GracefulStop.latest_signal = 0
        if threading.current_thread() is not threading.main_thread():
            log.warning("training outside the main thread: SIGINT/SIGTERM will not stop it gracefully")
        else:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self._received += 1
        if self._received > 1:
            log.warning("received %s again: stopping now without saving; %s keeps the last saved state",
                        name, self.saved_state)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = GracefulStop.latest_signal = signum
        if self.dist.is_main:
            log.warning("received %s: finishing the current step, then saving %s (send it again to stop at once "
                        "without saving)", name, self.saved_state)

    def requested(self) -> bool:
        """Whether any rank got a signal; under DDP every rank then stops at the same step."""
        self.signum = int(reduce_max(float(self.signum), self.dist, self.device))
        return bool(self.signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def loader_worker_init(worker_id: int) -> None:
    """A training loader worker's start: MONAI's (each worker's own random stream), then SIGINT and SIGTERM ignored.

    A stop signal sent to the whole process group (Ctrl-C, ``kill -- -PGID``, ``timeout``, ``systemctl stop``) also
    reaches the workers; left to its default, it would kill them and fail the step the training process is finishing
    (in a multirun: a failed job, then the next one). The training process stops gracefully (:class:`GracefulStop`)
    and ends its workers as its loader closes; a worker whose parent died exits by itself (torch's watchdog).
    """
    worker_init_fn(worker_id)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def replay(batches: Iterable[T], start_step: int, before_start: Callable[[], None]) -> Iterator[tuple[int, T]]:
    """``enumerate(batches)`` from ``start_step`` on, for a run resumed mid-epoch.

    The batches before ``start_step`` are loaded and dropped, so the transforms' random streams advance exactly
    as in the interrupted run; ``before_start()`` (restoring the RNG) runs just before the first yielded step.
    """
    for step, batch in enumerate(batches):
        if step < start_step:
            if step == start_step - 1:
                before_start()
            continue
        yield step, batch
