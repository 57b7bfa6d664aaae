"""What a training run and a multirun leave on disk, read back: a :class:`Run` folder and a :class:`Sweep` folder.

A sweep directory (``multirun/<date>/<time>/``) holds one run folder per Hydra job, each with the overrides Hydra
applied (``.hydra/overrides.yaml``) and, once the run ends, medseg's ``metrics.json``. The parameters whose values
differ between runs are the *swept* parameters. Runs that differ only in ``trainer.seed`` or ``data.fold`` are one
*setting*. Cross-validation (:mod:`medseg.evaluation.crossval`), ensembles of a multirun's folds
(:mod:`medseg.inference.ensemble`) and the sweep report (:mod:`medseg.sweeps.report`) all read runs through here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from medseg.runs.layout import OVERRIDES_FILE, RunLayout

SEED_KEY = "trainer.seed"

FOLD_KEY = "data.fold"

REPEAT_KEYS = {SEED_KEY: "seeds", FOLD_KEY: "folds"}
"""Keys whose runs repeat one setting (-> what the report calls them): never a setting or a plot axis of their own."""

BLOCK_KEY = "model.bottleneck"

FLOPS_KEY = "gflops_per_patch_forward"
"""The ``metrics.json`` key of the GFLOPs of one training-patch forward, when the run recorded them."""

COMPUTE_KEYS = ("train_seconds", "params", "peak_memory_mb", FLOPS_KEY, "seconds_per_step", "wall_seconds")
"""The ``metrics.json`` keys of a run's compute, in the order reports show them (each report shows those present):
training time (s), parameters, peak memory (MB), GFLOPs of one training patch's forward pass, seconds per training
step and the wall time of the whole run (s)."""

DEVICE_KEY = "device"
"""The ``metrics.json`` key of the device the run trained on (``cpu``, ``cuda:0``)."""

ATTENTION_KEY = "attention_distance_mm"
"""The epoch-record key (``trainer.attention_maps=true``) of each slot's mean attention distance in mm; a run's is
its best epoch's, one column per slot after the results (:func:`attention_column`)."""



@dataclass
class Run(RunLayout):
    """One training run's folder (a run of a sweep), read back: its overrides, and its metrics if it has finished; its
    paths are those of :class:`~medseg.runs.layout.RunLayout`."""

    name: str
    """The folder relative to the sweep directory (Hydra's job number by default)."""
    overrides: dict[str, str]
    """``key -> value`` of each override, read by Hydra's parser (:func:`parse_overrides`)."""
    metrics: dict[str, Any] | None
    """The parsed ``metrics.json``; None while the run goes on, or if it was killed."""
    block: str = "default"
    """The bottleneck block (``model.bottleneck``) the run trained, or "default" when unknown."""
    read_error: str | None = None
    """Why ``metrics.json`` could not be read, if it exists but is unreadable."""
    path: Path = Path()
    """The run folder."""

    @property
    def finished(self) -> bool:
        """The run has completed (its ``metrics.json`` says so) and left its best checkpoint."""
        return self.status == "completed" and self.best_checkpoint.is_file()

    @property
    def device(self) -> str:
        """The device the run trained on: ``metrics.json``'s, else its config's ``trainer.device`` unless that is
        ``auto``; ``""`` when unknown."""
        recorded = (self.metrics or {}).get(DEVICE_KEY)
        if isinstance(recorded, str):
            return recorded
        try:
            config = _read_yaml(self.hydra_config) or {}
        except yaml.YAMLError:
            return ""
        asked = (config.get("trainer") or {}).get("device") if isinstance(config, dict) else None
        return asked if isinstance(asked, str) and asked != "auto" else ""

    @property
    def status(self) -> str:
        """``completed`` or ``failed`` (from ``metrics.json``), else ``missing`` (running or killed)."""
        if self.metrics is None:
            return "missing"
        return str(self.metrics.get("status", "completed"))

    @property
    def reason(self) -> str:
        """Why the run did not complete; empty for completed runs."""
        if self.metrics is None:
            return self.read_error or "no metrics.json: still running, or killed"
        return str(self.metrics.get("reason", "")) if self.status != "completed" else ""

    def value(self, metric: str) -> float:
        """A numeric result of the run (``metrics.json`` key or ``dice_<class>``); NaN when absent."""
        if self.status != "completed":
            return math.nan
        value = self.metrics.get(metric) if self.metrics else None
        if value is None and metric.startswith("dice_"):
            value = self.dice_per_class().get(metric)
        if value is None and metric.startswith(ATTENTION_KEY):
            value = self.attention_distances().get(metric)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan

    @property
    def started_from(self) -> str | None:
        """The weights the run started from (``trainer.init_from``, in words, from ``metrics.json``); None for a run
        from scratch."""
        value = (self.metrics or {}).get("started_from")
        return value if isinstance(value, str) else None

    def dice_per_class(self) -> dict[str, float]:
        """Best-epoch validation Dice per class, keyed ``dice_<class name with underscores>``."""
        per_class = (self.metrics or {}).get("val_dice_per_class") or {}
        return {dice_column(name): float(value) for name, value in per_class.items()}

    def attention_distances(self) -> dict[str, float]:
        """Each slot's mean attention distance (mm) at the best epoch (else the last epoch that recorded one), keyed
        by :func:`attention_column`; empty for a run without ``trainer.attention_maps``."""
        metrics = self.metrics or {}
        records = [r for r in metrics.get("history") or [] if isinstance(r, dict) and r.get(ATTENTION_KEY)]
        best = [r for r in records if r.get("epoch") == metrics.get("best_epoch")]
        chosen = (best or records or [{}])[-1].get(ATTENTION_KEY) or {}
        return {attention_column(slot): float(value) for slot, value in chosen.items()}



def dice_column(class_name: str) -> str:
    """The report column of one class's Dice (``dim sphere`` -> ``dice_dim_sphere``, as in TensorBoard)."""
    return "dice_" + re.sub(r"\s+", "_", class_name.strip())



def attention_column(slot: str) -> str:
    """The report column of a slot's mean attention distance: ``bottleneck`` -> ``attention_distance_mm_bottleneck``."""
    return f"{ATTENTION_KEY}_" + re.sub(r"\s+", "_", slot.strip())



def parse_overrides(lines: Sequence[str]) -> dict[str, str]:
    """``["model.bottleneck=masa", "+x=1e-4", "~y"]`` -> ``{"model.bottleneck": "masa", "x": "0.0001", "y": "~"}``.

    Parsed by Hydra's own override parser: a string value as it reads (quotes and escapes removed), any other
    value in Hydra's notation (``[8,16]``, ``null``, ``True``), a deleted key as ``~``.

    Raises:
        hydra.errors.OverrideParseException: a line that is not a Hydra override.
    """
    out: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides([str(line) for line in lines]):
        value = override.value()
        text = value if isinstance(value, str) else override.get_value_element_as_str()
        out[override.key_or_group] = "~" if override.is_delete() else text
    return out



def _natural_key(name: str) -> list[Any]:
    """Sort ``2`` before ``10`` (Hydra numbers jobs without padding)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]



def _read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None



def _run_block(overrides: dict[str, str], layout: RunLayout) -> str:
    """The bottleneck block: the override, else the run's composed config, else "default"."""
    if BLOCK_KEY in overrides:
        return overrides[BLOCK_KEY]
    try:
        config = _read_yaml(layout.hydra_config) or {}
    except yaml.YAMLError:
        return "default"
    block = (config.get("model") or {}).get("bottleneck") if isinstance(config, dict) else None
    return str(block) if isinstance(block, str) else "default"



def read_run(run_dir: Path, sweep_dir: Path) -> Run:
    """Read one run folder (one that holds ``.hydra/overrides.yaml``)."""
    layout = RunLayout(run_dir)
    overrides = parse_overrides(_read_yaml(layout.overrides_file) or [])
    metrics, error = None, None
    if layout.metrics_file.is_file():
        try:
            metrics = json.loads(layout.metrics_file.read_text())
        except (OSError, ValueError) as err:
            error = f"{layout.metrics_file.name} unreadable: {err}"
    name = run_dir.relative_to(sweep_dir).as_posix()
    return Run(name=name, overrides=overrides, metrics=metrics, block=_run_block(overrides, layout), read_error=error,
               path=run_dir)



@dataclass
class Sweep:
    """A multirun folder (``multirun/<date>/<time>/``): its runs in Hydra's order."""

    path: Path
    runs: list[Run]

    @classmethod
    def read(cls, sweep_dir: str | Path) -> Sweep:
        """Every run of a sweep directory, in Hydra's order; raises FileNotFoundError when there is none."""
        sweep_dir = Path(sweep_dir)
        if not sweep_dir.is_dir():
            raise FileNotFoundError(f"sweep directory {sweep_dir} does not exist")
        depth = len(OVERRIDES_FILE.parts)
        run_dirs = {path.parents[depth - 1] for path in sweep_dir.glob(f"**/{OVERRIDES_FILE.as_posix()}")} - {sweep_dir}
        if not run_dirs:
            raise FileNotFoundError(f"{sweep_dir} holds no Hydra job folders (no */{OVERRIDES_FILE.as_posix()})")
        ordered = sorted(run_dirs, key=lambda path: _natural_key(path.relative_to(sweep_dir).as_posix()))
        return cls(sweep_dir, [read_run(path, sweep_dir) for path in ordered])

    @property
    def swept(self) -> list[str]:
        """The override keys whose value differs between the runs (:func:`swept_keys`)."""
        return swept_keys(self.runs)


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """The override keys whose value differs between runs (absent counts as a value), in first-seen order."""
    keys = list(dict.fromkeys(key for run in runs for key in run.overrides))
    return [key for key in keys if len({run.overrides.get(key) for run in runs}) > 1]



def setting_keys(swept: Sequence[str]) -> list[str]:
    """The swept keys that make a setting: all but the seeds and folds (:data:`REPEAT_KEYS`)."""
    return [key for key in swept if key not in REPEAT_KEYS]



def setting_of(run: Run, keys: Sequence[str]) -> tuple[str | None, ...]:
    """The run's values of ``keys``: runs with equal settings differ only in the other swept keys."""
    return tuple(run.overrides.get(key) for key in keys)



def group_runs(runs: Sequence[Run], key: Callable[[Run], Hashable]) -> dict[Any, list[Run]]:
    """Runs grouped by ``key(run)``, groups and runs in first-seen order."""
    groups: dict[Any, list[Run]] = {}
    for run in runs:
        groups.setdefault(key(run), []).append(run)
    return groups



def group_by_setting(runs: Sequence[Run], keys: Sequence[str]) -> dict[tuple[str | None, ...], list[Run]]:
    """Runs grouped by their values of ``keys``."""
    return group_runs(runs, lambda run: setting_of(run, keys))



def cross_validations(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs of each cross-validation in a sweep, those that differ only in ``data.fold``, by the label of their
    setting (:func:`setting_label`; ``""`` when the sweep is one cross-validation)."""
    keys = [key for key in swept_keys(runs) if key != FOLD_KEY]
    groups = group_by_setting(runs, keys)
    if len(groups) == 1:
        return {"": list(runs)}
    return {setting_label(setting, keys): group for setting, group in groups.items()}



def as_number(text: str | None) -> float | None:
    """The override value as a number, or None for anything else (names, lists, booleans, null)."""
    if text is None or text.strip().lower() in ("true", "false", "nan", "inf", "-inf"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def display_value(text: str | None) -> str:
    """An override value for people: long numbers (Optuna's samples) to 4 significant digits."""
    number = as_number(text)
    return f"{number:.4g}" if number is not None and len(str(text)) > 8 else str(text)


def setting_label(setting: Sequence[str | None], keys: Sequence[str], name: Callable[[str], str] = str) -> str:
    """``"model.bottleneck=masa model.attention.gamma=0.8"``, each key written as ``name(key)``.

    A key the setting's runs did not set (None: two multiruns of different keys in one folder) is left out;
    ``"(defaults)"`` when the runs set none of ``keys``, ``"(all runs)"`` when nothing is swept.
    """
    parts = [f"{name(key)}={display_value(value)}" for key, value in zip(keys, setting) if value is not None]
    return " ".join(parts) or ("(defaults)" if keys else "(all runs)")
