"""The config contract: every key users type, with its type, default and meaning, written once.

The dataclasses below are both the schema and the defaults. Importing this module registers them in Hydra's
ConfigStore, so ``configs/*.yaml`` hold only presets (``data=msd``, ``experiment=...``) and Hydra settings
on top of them. The docstring under each field documents that key; ``python scripts/train.py --help``
prints them (:func:`key_docs`).

:func:`validate_config` turns a composed config into a typed :class:`TrainConfig`, or raises
:class:`~medseg.errors.ConfigError` with one line that names the key and what is valid. Choice lists (block
names, models, norms, optimizers, ...) come from the registries they describe, imported only then: this
module imports no torch, so ``--help`` and config errors are fast.
"""

from __future__ import annotations

import ast
import difflib
import inspect
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from functools import cache
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError

from medseg.errors import ConfigError

Schema = TypeVar("Schema")


@dataclass
class AttentionConfig:
    """Hyperparameters shared by all attention blocks (the ``model.attention`` node).

    Each block takes the keys its ``__init__`` names and ignores the rest, so a single node serves every
    slot and a sweep over ``model.attention.gamma`` needs no other change.
    """

    num_heads: int = 4
    """Attention heads; must divide the channel width of every slot."""
    gamma: float = 0.9
    """MaSA decay base in (0, 1]; the weight between tokens n and m is gamma ** manhattan(n, m)."""
    heads_range: float = 0.0
    """MaSA: 0 for one gamma for all heads; > 0 for per-head 1 - (1 - gamma) * 2 ** (-heads_range * h / num_heads)."""
    spacing: list[float] | None = None
    """Voxel spacing in mm per spatial axis at the network input; MaSA distances become physical. null: voxels."""
    rope: str = "none"
    """masa, masa_decomposed, mha: none, or axial (rotary encoding of q and k, head dim split over the axes)."""
    focusing_factor: float = 3.0
    """Focused linear attention: the power p of the focusing function."""
    positional_size: int = 8
    """Focused linear attention: side of the grid its zero-initialised positional term on k is stored on
    (interpolated to the actual grid); 0 = one value per token of the slot's training grid (official FLatten)."""
    kernel_size: int = 5
    """Depthwise-conv kernel of MaSA's LCE and of focused linear attention's rank restoration."""
    split_size: int = 2
    """CSWin stripe width in tokens."""
    lepe: str = "map"
    """CSWin LePE: map (one 3x3(x3) depthwise conv over the whole map) or stripe (official: inside each stripe)."""
    pe: str = "sincos"
    """MHA position encoding: sincos, relative or none."""
    max_relative_size: int = 0
    """MHA relative bias: tokens per axis its table covers exactly; 0 means 16 (grids above it interpolate it)."""
    max_bias_gb: float | None = 2.0
    """Model build fails when a slot's dense N x N attention bias (masa; mha with pe=relative, plus its gradient)
    would need more GB (2^30 bytes) than this in float32 at the training patch; null disables the check."""
    mlp_ratio: float = 4.0
    """Hidden width of the transformer block's FFN as a multiple of the channel width."""
    ffn: str = "mlp"
    """Transformer block FFN: mlp (Linear-GELU-Linear) or dwconv (RMT's: a depthwise conv inside the hidden layer)."""
    drop_path: float = 0.0
    """Stochastic-depth rate of the transformer block's residual branches."""
    layer_scale: float | None = None
    """Initial value of the per-channel layer scale; null disables it."""


@dataclass
class ModelConfig:
    """The network (the ``model`` node)."""

    name: str = "unet"
    """unet (medseg's slotted U-Net), or MONAI's monai_unet, monai_swinunetr, monai_unetr for comparisons."""
    spatial_dims: int = 3
    """3, or 2 for slices across the thickest axis of the same volumes."""
    channels: list[int] | None = field(default_factory=lambda: [16, 32, 64, 128])
    """Feature width per level; len(channels) - 1 down-samplings. null = planned with the patch (nnU-Net's rule: a
    level per pooling step until every axis is down to about 4 voxels; widths 32, 64, ... up to 320 in 3D, 512 in
    2D)."""
    strides: list[Any] | None = None
    """One per down-sampling: an int, or one int per axis (anisotropic pooling); null = planned from the data."""
    kernel_size: int = 3
    """Convolution kernel of the U-Net's stages."""
    norm: str = "instance"
    """Normalisation of the conv stages: instance, batch, or group (8 groups, fewer for narrower levels)."""
    dropout: float = 0.0
    """Dropout rate in the conv stages."""
    deep_supervision: bool = False
    """nnU-Net-style deep supervision: losses on the lower decoder stages too."""
    checkpointing: bool = False
    """Activation checkpointing in the transformer blocks (less memory, same gradients)."""
    channels_last: bool = True
    """3D only: weights and activations in the channels-last 3D memory format (faster convolutions)."""
    bottleneck: str = "none"
    """Attention block in the bottleneck slot: none, or a registered block name (masa, cswin, ...)."""
    bottleneck_depth: int = 2
    """Transformer blocks stacked in the bottleneck."""
    decoder: str = "none"
    """Attention block after each of the lowest-resolution decoder stages: none, or a block name."""
    decoder_levels: int = 1
    """How many of the lowest-resolution decoder stages get the decoder block."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """Hyperparameters shared by every attention slot."""


@dataclass
class DataConfig:
    """The dataset and its preprocessing (the ``data`` node); null values are planned from the data."""

    format: str = "msd"
    """demo (generated on first use), msd (Medical Segmentation Decathlon folder) or nnunet (nnU-Net v2 raw)."""
    root: str = MISSING
    """Dataset folder, the one holding dataset.json."""
    num_cases: int = 40
    """demo only: how many volumes to generate."""
    fold: Any = 0
    """0..num_folds-1, or all (train and validate on every case)."""
    num_folds: int = 5
    """Folds of the cross-validation split."""
    split_seed: int = 12345
    """Seed of the fold split (stored once per dataset and reused)."""
    spacing: list[float] | None = None
    """Target spacing in mm in RAS axis order (three entries, also in 2D); null = planned."""
    patch_size: list[int] | None = None
    """Training patch in voxels; in 2D the two in-plane sizes (or three, the slice axis dropped); null = planned."""
    normalization: Any = None
    """zscore (per image and channel), ct (planned clip and statistics), none; null = planned from the modality."""
    regions: Any = None
    """Region-based training (nnU-Net v2's), a mapping region name -> the dataset's label values it unites, e.g.
    {whole_tumor:[1,2,4],tumor_core:[2,4],enhancing:[4]}; one sigmoid output per region. null: softmax classes, or
    the regions of an nnU-Net dataset.json."""
    regions_class_order: list[int] | None = None
    """With data.regions: the label value each region writes into predicted label maps, later regions overwriting
    earlier ones (needed when regions overlap); null: each region's lowest value."""
    pos_fraction: float = 0.33
    """Share of patches centred on foreground."""
    samples_per_volume: int | None = None
    """Patches drawn from each volume per epoch; null = 2 in 3D, 16 slices in 2D."""
    augment: bool = True
    """Random flips, 90-degree rotations and intensity jitter in training."""
    cache: str = "auto"
    """auto (memory when training's estimated peak RAM with the cases in memory is below 80% of the available RAM,
    else disk), memory, disk or none."""
    cache_dir: str | None = None
    """Fingerprint, splits and disk cache; null = <root>/.medseg_cache, or the user cache when root is read-only."""
    plan_from: str = "data"
    """data: plan the null keys among spacing, patch_size, normalization, model.strides and model.channels from this
    dataset; init: take all five from the checkpoint the run starts from (trainer.init_from, or the one it resumes)."""
    num_workers: int = 2
    """Data-loading worker processes."""


@dataclass
class TrainerConfig:
    """The training loop (the ``trainer`` node)."""

    max_epochs: int = 6
    """Epochs; sized for the demo on a laptop CPU, real data needs hundreds."""
    max_minutes: float | None = None
    """Wall-clock budget of training, validation included: the first epoch is timed (and validated), the schedule is
    set to span the epochs that fit, and training ends when another epoch would not fit (max_epochs still caps it)."""
    batch_size: int = 2
    """Volumes per step, each giving data.samples_per_volume patches; per process under DDP."""
    lr: float = 3e-3
    """Peak learning rate."""
    weight_decay: float = 3e-5
    """Weight decay."""
    loss: str = "dice_ce"
    """dice_ce, dice_focal, dice or ce: Dice plus cross-entropy, Dice plus focal (gamma 2), Dice alone, cross-entropy
    alone (MONAI's). Softmax over the classes, or sigmoid per region (binary cross-entropy) on region-based data;
    ignore-label voxels take no part."""
    class_weights: Any = None
    """null (unweighted); auto (from the fingerprint's voxels per output n_c: min(sqrt(n_max / n_c), 10), normalised
    to average 1); or [w0, w1, ...], one positive weight per network output (background first, or one per region).
    They scale the Dice and the cross-entropy or focal term of each output."""
    optimizer: str = "adamw"
    """adamw, or sgd (nesterov, trainer.momentum)."""
    momentum: float = 0.99
    """SGD momentum."""
    scheduler: str = "cosine"
    """Learning-rate schedule per epoch after the warm-up: cosine, poly (power 0.9) or none."""
    warmup_epochs: int = 0
    """Epochs of linear warm-up before the schedule."""
    val_every: int = 2
    """Validation interval in epochs (the last epoch always validates)."""
    sw_batch_size: int = 4
    """Sliding windows per forward pass in validation."""
    sw_overlap: float = 0.25
    """Sliding-window overlap in validation."""
    device: str = "auto"
    """auto (CUDA when present), cpu, cuda or cuda:N."""
    precision: str = "auto"
    """auto (bf16 autocast on CUDA, fp32 on the CPU), bf16, fp16 (with loss scaling) or fp32."""
    seed: int = 0
    """Seed of the weights, the sampling and the augmentation."""
    deterministic: bool = False
    """Deterministic algorithms (slower); ops without one warn."""
    compile: bool = False
    """torch.compile the model."""
    grad_clip: float | None = 12.0
    """Max gradient norm; null disables clipping."""
    max_nonfinite_steps: int = 20
    """Stop after this many non-finite losses or gradients in a row."""
    resume: bool = False
    """Resume from last.pt in the run directory."""
    init_from: str | None = None
    """Fine-tune: start a new run from this checkpoint's weights only (fresh optimizer, schedule and epochs). The model
    config must match the checkpoint's; layers whose shape differs (other classes or input channels) are
    re-initialised. Not with trainer.resume or ckpt_path."""
    progress: bool = True
    """Progress bars."""
    log_images: bool = True
    """TensorBoard overlays of image, label and prediction at each validation."""
    attention_maps: bool = False
    """At each validation, log the attention maps of one foreground voxel of the first validation case to TensorBoard
    (montages, and each head's mean attention distance in mm) and record each slot's mean distance in metrics.json."""
    check_data: bool = True
    """Verify every case of the dataset before training."""


@dataclass
class PlanningConfig:
    """What planning sizes the patch for (the ``plan`` node)."""

    memory_gb: float | None = None
    """Training memory (GB, 2^30 bytes) a planned patch may need, estimated for the network, trainer.batch_size x
    data.samples_per_volume patches, trainer.precision and trainer.optimizer. null = on CUDA the GPU's memory, at most
    nnU-Net's 8 GB; on a CPU the voxel budget instead (48^3 voxels in 3D, 256^2 in 2D, for 32 first-level channels)."""


def check_planning(planning: PlanningConfig) -> None:
    """Raise :class:`ConfigError` for a ``plan`` node that cannot be planned with (a memory budget of 0 or less)."""
    if planning.memory_gb is not None and not planning.memory_gb > 0:
        raise ConfigError(f"plan.memory_gb={planning.memory_gb:g}: expected a positive number of GB, or null for the "
                          "default (the GPU's memory up to 8 GB; the voxel budget on a CPU)")


@dataclass
class TrainConfig:
    """``scripts/train.py``: everything a training run reads."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    plan: PlanningConfig = field(default_factory=PlanningConfig)
    """What the planned patch and network are sized for."""
    task_name: str = "train"
    """Names the output folder outputs/<task_name>/<date>/<time>."""
    output_dir: str = "outputs/train"
    """The run directory (Hydra's run directory when launched from the command line)."""
    ckpt_path: str | None = None
    """Resume from this checkpoint file (wins over trainer.resume)."""


@dataclass
class EvaluateConfig:
    """``scripts/evaluate.py``: predict (and score) every case of ``input`` with a checkpoint or an ensemble."""

    ckpt: Any = MISSING
    """A medseg checkpoint (outputs/train/<date>/<time>/checkpoints/best.pt); a list [a.pt,b.pt] (an ensemble: their
    probabilities averaged: softmax, or sigmoid per region); or a multirun folder (the ensemble of its finished folds'
    best.pt)."""
    input: str = MISSING
    """A folder of images, a folder with imagesTs/ (+ labelsTs/), or a dataset.json (or its folder)."""
    output: str = "predictions"
    """Folder for the predictions, metrics.csv and summary.json."""
    split: str = "test"
    """dataset.json input only: test, training or validation (the checkpoint's fold without a validation list)."""
    overlap: float = 0.5
    """Sliding-window overlap (gaussian blending)."""
    sw_batch_size: int = 4
    """Windows per forward pass."""
    tta: bool = False
    """Mirroring test-time augmentation (3D: all axes; 2D: the in-plane axes)."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    sw_device: str | None = None
    """Where windows are stitched (cpu saves GPU memory); null = device."""
    save_probabilities: bool = False
    """Also write <case>.npz with float16 probabilities (C, X, Y, Z): softmax per class, or sigmoid per region."""
    postprocessing: str = "auto"
    """auto (the postprocessing.json that scripts/crossval.py decided for exactly these checkpoints, found in their
    multirun's crossval/; none when there is none, e.g. for a single fold), none, or a postprocessing.json file."""
    tolerance_mm: float = 1.0
    """Normalised surface Dice tolerance in mm."""
    progress: bool = True
    """Progress bars (cases x models, and windows within a case for a single model)."""


@dataclass
class CrossvalConfig:
    """``scripts/crossval.py DIR``: score a multirun of folds on its out-of-fold predictions, decide the postprocessing.

    Sliding-window overlap, windows per pass and the surface-Dice tolerance are evaluate's defaults.
    """

    dir: str = MISSING
    """The multirun folder of the folds (python scripts/train.py -m data.fold=0,1,2,3,4); also the first argument.
    The results go to DIR/crossval (DIR/crossval/<setting> for each setting of a wider sweep)."""
    tta: bool = False
    """Mirroring test-time augmentation for the out-of-fold predictions."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    postprocessing: bool = True
    """Decide the postprocessing on the out-of-fold predictions (postprocessing.json)."""
    progress: bool = True
    """Progress bar over the cases."""


@dataclass
class ExportConfig:
    """``scripts/export.py``: a checkpoint's network (ONNX or TorchScript) and its preprocessing.json in a folder."""

    ckpt: str = MISSING
    """A medseg checkpoint, e.g. outputs/train/<date>/<time>/checkpoints/best.pt."""
    format: str = "onnx"
    """onnx (model.onnx, for onnxruntime; needs pip install 'medseg[export]') or torchscript (model.pt, torch.jit.load
    in Python or C++)."""
    output: str = "export"
    """The folder for the network and preprocessing.json: a new or empty one, or an earlier export (replaced)."""
    postprocessing: str | None = None
    """A postprocessing.json of scripts/crossval.py to copy into the export (preprocessing.json names it); or null."""


@dataclass
class VisualizeConfig:
    """``scripts/visualize.py``: the attention maps of one voxel of a volume in every attention slot of a checkpoint."""

    ckpt: str = MISSING
    """A medseg checkpoint whose network has attention slots, e.g. outputs/train/<date>/<time>/checkpoints/best.pt."""
    input: str = MISSING
    """One volume file (.nii.gz, .nii, .nrrd, .mha), read and preprocessed as scripts/evaluate.py reads it."""
    voxel: list[int] | None = None
    """The query voxel as indices [i,j,k] of the input file; null (and no world) = the predicted foreground voxel
    nearest the foreground's centre of mass."""
    world: list[float] | None = None
    """The query point [x,y,z] in mm in the input file's world coordinates (RAS, as its affine maps voxels); instead
    of voxel."""
    output: str = "attention"
    """Folder for attention.json, the PNG montages and the NIfTI maps (one 4D file per slot and block)."""
    slot: str | None = None
    """Only this attention slot (e.g. bottleneck); null = every slot."""
    block: int | None = None
    """Only this block of the slot(s), 0 the first; null = every block."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""


@dataclass
class PlanConfig:
    """``scripts/plan.py``: the fingerprint and plan of ``data`` for ``model``, as ``scripts/train.py`` plans them."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The training the plan is for: its batch size, precision, optimizer and device size the patch (the other keys
    are not read here)."""
    plan: PlanningConfig = field(default_factory=PlanningConfig)
    """What the planned patch and network are sized for."""
    progress: bool = True
    """Progress bar while fingerprinting."""


@dataclass
class CheckDataConfig:
    """``scripts/check_data.py``: verify every case of ``data``."""

    data: DataConfig = field(default_factory=DataConfig)
    progress: bool = True
    """Progress bar over the cases."""


SCHEMAS: dict[str, type] = {"train": TrainConfig, "evaluate": EvaluateConfig, "crossval": CrossvalConfig,
                            "export": ExportConfig, "visualize": VisualizeConfig, "plan": PlanConfig,
                            "check_data": CheckDataConfig}
"""Each entry point's schema, registered in Hydra's ConfigStore as ``<name>_schema``."""


# --------------------------------------------------------------------------------------------- docs


@cache
def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (its source read once)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def key_docs(schema: type, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """``(key, type, meaning)`` for every leaf key of ``schema``, in declaration order."""
    docs = _field_docs(schema)
    for item in fields(schema):
        key = f"{prefix}{item.name}"
        nested = item.default_factory if is_dataclass(item.default_factory) else None  # type: ignore[misc]
        if nested is not None:
            yield from key_docs(nested, f"{key}.")
        else:
            yield key, str(item.type), docs.get(item.name, "")


def help_template(name: str) -> str:
    """Hydra's ``--help`` text for entry point ``name``: config groups, every key with its meaning, the config."""
    keys = "\n".join(f"  {key} ({kind}): {doc}" for key, kind, doc in key_docs(SCHEMAS[name]))
    return (f"medseg {name}: key=value overrides (Hydra); -m sweeps comma-separated values.\n\n"
            "== Config groups ==\n$APP_CONFIG_GROUPS\n\n"
            f"== Keys ==\n{keys}\n\n"
            "== Composed config (--cfg job prints it alone) ==\n$CONFIG\n\n"
            "Hydra's own options: --hydra-help")


def _register() -> None:
    """The schemas and their ``--help`` texts in Hydra's ConfigStore; ``${medseg_blocks:}`` for sweep presets."""
    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(name=f"{name}_schema", node=schema)
        store.store(group="hydra/help", name=f"medseg_{name}", node={"template": help_template(name)})
    OmegaConf.register_new_resolver("medseg_blocks", lambda: ",".join(block_choices()), replace=True)


_register()


# ---------------------------------------------------------------------------------------- validation


def _valid_keys(schema: type, path: str) -> list[str]:
    """The keys of the schema node at ``path`` ("" for the root); [] where the path leaves the schema."""
    node: Any = schema
    for part in [p for p in path.split(".") if p]:
        match = next((f for f in fields(node) if f.name == part), None) if is_dataclass(node) else None
        if match is None or not is_dataclass(match.default_factory):  # type: ignore[arg-type]
            return []
        node = match.default_factory
    return [f.name for f in fields(node)] if is_dataclass(node) else []


def unknown_key_message(schema: type, key: str) -> str:
    """One line for a key the schema lacks: the nearest valid keys first, then every key at that level."""
    parent, _, leaf = key.rpartition(".")
    valid = _valid_keys(schema, parent)
    near = difflib.get_close_matches(leaf, valid, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(f'{parent}.{n}' if parent else n for n in near)}?" if near else "."
    where = f" under {parent!r}" if parent else ""
    return f"unknown config key {key!r}{hint} Valid keys{where}: {', '.join(valid)}"


def check_override_keys(argv: Sequence[str], schema: type, groups: Collection[str] = ()) -> None:
    """Refuse command-line overrides whose key is not in ``schema``, naming the nearest valid keys.

    Hydra would refuse them too, but only with a hint to add the key with ``+``. Arguments that are not
    overrides (Hydra's flags and their values), config-group choices (``data=msd``; ``groups`` are the top-level
    group names), Hydra's own keys and keys inside free-form nodes are left to Hydra.

    Raises:
        ConfigError: the first unknown key.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for argument in argv:
        try:
            (override,) = parser.parse_overrides([argument])
        except OverrideParseException:
            continue
        key = override.key_or_group
        if "/" in key or override.package or key.split(".")[0] in ("hydra", *groups):
            continue
        parts = key.split(".")
        for depth in range(len(parts)):  # the first segment the schema lacks; free-form nodes end the walk
            valid = _valid_keys(schema, ".".join(parts[:depth]))
            if not valid:
                break
            if parts[depth] not in valid:
                raise ConfigError(unknown_key_message(schema, ".".join(parts[:depth + 1])))


def _unknown_keys(node: DictConfig, schema: type, prefix: str = "") -> Iterator[str]:
    """The keys of ``node`` that dataclass ``schema`` lacks, depth first, as full dotted keys."""
    known = {f.name: f for f in fields(schema)}
    for key in node:
        if key not in known:
            yield f"{prefix}{key}"
            continue
        nested = known[key].default_factory
        if is_dataclass(nested) and not OmegaConf.is_missing(node, key) and isinstance(node[key], DictConfig):
            yield from _unknown_keys(node[key], nested, f"{prefix}{key}.")  # type: ignore[arg-type]


def to_typed(schema: type[Schema], cfg: Schema | Mapping[str, Any] | DictConfig, context: str = "") -> Schema:
    """``cfg`` merged onto ``schema``'s defaults and checked against its types; returns a ``schema`` instance.

    Raises:
        ConfigError: an unknown key (with the nearest valid ones), a wrong type, or a required value
            (``???``) left unset. ``context`` (e.g. ``" for data=msd"``) ends the required-value message.
    """
    if isinstance(cfg, schema):
        return cfg
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))  # type: ignore[arg-type]
    unknown = next(_unknown_keys(node, schema), None)  # Hydra's "+key=value" adds keys even to a typed node
    if unknown is not None:
        raise ConfigError(unknown_key_message(schema, unknown))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"{missing[0]} is required{context} (set {missing[0]}=...)")
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except ConfigKeyError as err:
        raise ConfigError(unknown_key_message(schema, str(err.full_key))) from None
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is required{context} (set {err.full_key}=...)") from None
    except ValidationError as err:
        raise ConfigError(f"{err.full_key}: {str(err.msg).splitlines()[0]}") from None


def as_dict(cfg: Any) -> dict[str, Any]:
    """A config dataclass as plain Python types (for checkpoints and JSON)."""
    return asdict(cfg)


def block_choices() -> list[str]:
    """Valid values of ``model.bottleneck`` and ``model.decoder``: ``none`` and the registered blocks."""
    from medseg.attention import available_blocks

    return ["none", *available_blocks()]


def _choices() -> dict[str, Sequence[str]]:
    """Every key with a fixed set of values, and that set, read from the registry it selects from."""
    from medseg.attention.block import FFN_KINDS
    from medseg.attention.cswin import LEPE_MODES
    from medseg.attention.mha import POSITION_ENCODINGS
    from medseg.attention.position import ROTARY_ENCODINGS
    from medseg.data.datalist import DATASET_FORMATS
    from medseg.engine.data import CACHE_MODES, PLAN_SOURCES
    from medseg.engine.device import PRECISIONS
    from medseg.engine.losses import LOSSES
    from medseg.engine.optim import OPTIMIZERS, SCHEDULES
    from medseg.models import MODELS, NORMS

    return {
        "model.name": list(MODELS), "model.norm": list(NORMS), "model.bottleneck": block_choices(),
        "model.decoder": block_choices(), "model.attention.pe": list(POSITION_ENCODINGS),
        "model.attention.rope": list(ROTARY_ENCODINGS), "model.attention.lepe": list(LEPE_MODES),
        "model.attention.ffn": list(FFN_KINDS),
        "data.format": list(DATASET_FORMATS), "data.cache": list(CACHE_MODES), "data.plan_from": list(PLAN_SOURCES),
        "trainer.loss": list(LOSSES), "trainer.optimizer": list(OPTIMIZERS), "trainer.scheduler": list(SCHEDULES),
        "trainer.precision": list(PRECISIONS),
    }


def _select(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_choices(cfg: Any, keys: Mapping[str, Sequence[str]]) -> None:
    """Raise :class:`ConfigError` for the first key of ``keys`` whose value in ``cfg`` is not a valid choice."""
    for key, choices in keys.items():
        value = _select(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not valid. Valid values: {', '.join(choices)}")


def _check_block_names(cfg: DictConfig) -> None:
    """The Hydra trap of design.md: a block given as a mapping (a config group) instead of a name."""
    for key in ("bottleneck", "decoder"):
        value = OmegaConf.select(cfg, f"model.{key}")
        if isinstance(value, DictConfig):
            raise ConfigError(
                f"model.{key} must be a block name (a string), got a mapping {OmegaConf.to_container(value)}. "
                f"Write model.{key}=<name>; block hyperparameters go in model.attention.*. "
                f"Valid names: {', '.join(block_choices())}")


def _check_start(cfg: TrainConfig) -> None:
    """How the run starts: ``trainer.init_from`` begins a new run from another run's weights, ``trainer.resume`` and
    ``ckpt_path`` continue one, so they exclude each other; ``data.plan_from=init`` needs a checkpoint to start from."""
    continues = [key for key, value in (("trainer.resume", cfg.trainer.resume), ("ckpt_path", cfg.ckpt_path)) if value]
    if cfg.trainer.init_from and continues:
        raise ConfigError(f"trainer.init_from (a new run from another run's weights) cannot be combined with "
                          f"{' or '.join(continues)} (continuing a run): set only one of them")
    if cfg.data.plan_from == "init" and not (cfg.trainer.init_from or continues):
        raise ConfigError("data.plan_from=init takes the plan from the checkpoint the run starts from: set "
                          "trainer.init_from=<checkpoint>, or data.plan_from=data")


def _check_values(cfg: TrainConfig) -> None:
    from medseg.data.transforms import NORMALIZATIONS

    check_choices(cfg, _choices())
    model, data = cfg.model, cfg.data
    if model.spatial_dims not in (2, 3):
        raise ConfigError(f"model.spatial_dims={model.spatial_dims}: expected 2 or 3")
    if model.channels is not None and len(model.channels) < 2:
        raise ConfigError(f"model.channels={model.channels}: need at least two levels")
    if model.channels is not None and model.strides is not None and len(model.strides) != len(model.channels) - 1:
        raise ConfigError(f"model.strides has {len(model.strides)} entries; model.channels has {len(model.channels)} "
                          f"levels, so expected {len(model.channels) - 1} strides")
    levels = (len(model.channels) if model.channels is not None
              else len(model.strides) + 1 if model.strides is not None else None)  # None: the depth is planned
    if model.decoder_levels < 0 or (levels is not None and model.decoder_levels > levels - 1):
        raise ConfigError(f"model.decoder_levels={model.decoder_levels}: expected "
                          f"{'0 or more' if levels is None else f'0..{levels - 1}'}")
    check_planning(cfg.plan)
    if not 0.0 < model.attention.gamma <= 1.0:
        raise ConfigError(f"model.attention.gamma={model.attention.gamma}: expected a decay in (0, 1]")
    if isinstance(data.normalization, str) and data.normalization not in NORMALIZATIONS:
        raise ConfigError(f"data.normalization={data.normalization!r}: expected one of {', '.join(NORMALIZATIONS)}")
    if data.spacing is not None and len(data.spacing) != 3:
        raise ConfigError(f"data.spacing={data.spacing}: expected 3 entries (mm along R, A, S), also in 2D")
    if data.patch_size is not None and len(data.patch_size) not in (2, 3):
        raise ConfigError(f"data.patch_size={data.patch_size}: expected 2 or 3 sizes")
    if not 0.0 <= data.pos_fraction <= 1.0:
        raise ConfigError(f"data.pos_fraction={data.pos_fraction}: expected a fraction in [0, 1]")
    if data.regions is not None and not (isinstance(data.regions, Mapping) and all(
            isinstance(v, list) and all(isinstance(i, int) for i in v) for v in data.regions.values())):
        raise ConfigError(f"data.regions={data.regions!r}: expected a mapping region name -> list of label values, "
                          f"e.g. {{whole_tumor:[1,2,4],tumor_core:[2,4],enhancing:[4]}}")
    if cfg.trainer.max_minutes is not None and not cfg.trainer.max_minutes > 0:
        raise ConfigError(f"trainer.max_minutes={cfg.trainer.max_minutes}: expected a positive budget, or null")
    _check_start(cfg)
    if data.fold != "all" and not (isinstance(data.fold, int) and 0 <= data.fold < data.num_folds):
        raise ConfigError(f"data.fold={data.fold!r}: expected 0..{data.num_folds - 1} or all")


def validate_config(cfg: TrainConfig | Mapping[str, Any] | DictConfig) -> TrainConfig:
    """Check ``cfg`` against the schema and the registries; return it as a typed :class:`TrainConfig`.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, a required value left unset, an unknown
            block or choice, or inconsistent shapes. The message names the key and lists what is valid.
    """
    if isinstance(cfg, TrainConfig):
        cfg = OmegaConf.structured(cfg)
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    _check_block_names(node)
    data_format = OmegaConf.select(node, "data.format", default=None) or DataConfig.format
    typed = to_typed(TrainConfig, node, context=f" for data={data_format}")
    _check_values(typed)
    return typed
