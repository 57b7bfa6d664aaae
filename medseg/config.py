"""The config contract: every key users type, with its type, default and meaning, written once.

The dataclasses below are both the schema and the defaults; :data:`SCHEMAS` names each entry point's. The docstring
under each field documents that key, and a numeric key's :class:`Range` (given with :func:`ranged`, or
:func:`unconstrained` with the reason) says which values it takes; :mod:`medseg.config_docs` turns both into
``--help`` and :mod:`medseg.config_reference` into ``docs/configuration.md``, and :func:`medseg.typed_config.to_typed`
checks every value against its range.

Importing this module has no side effect: the entry points register the schemas with Hydra
(:func:`medseg.hydra_config.register`) before Hydra composes a config. It imports no other medseg module and no torch,
so ``--help`` and config errors are fast; the checks of values against the registries they select from live in the
stage that owns each entry point (:mod:`medseg.training.checks`, :mod:`medseg.inference.checks`,
:mod:`medseg.evaluation.evaluate`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import MISSING as MISSING_DEFAULT
from dataclasses import Field, dataclass, field, fields, is_dataclass, make_dataclass
from functools import cache
from typing import Any

from omegaconf import MISSING

# --------------------------------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric key, or of each number of a list key (``model.channels``, ``model.strides``).

    Bounds are inclusive unless ``low_open`` / ``high_open``; ``odd`` asks for an odd integer. A range without bounds
    marks a key whose every number is valid, ``reason`` saying why. ``null`` and text values (``data.fold=all``)
    are not numbers and pass; their own checks are the stage's.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    odd: bool = False
    reason: str = ""

    @property
    def unconstrained(self) -> bool:
        return self.low is None and self.high is None and not self.odd

    def admits(self, number: float) -> bool:
        """Whether one number lies in the range (NaN lies in none with a bound)."""
        if self.unconstrained:
            return True
        above = self.low is None or (number > self.low if self.low_open else number >= self.low)
        below = self.high is None or (number < self.high if self.high_open else number <= self.high)
        return above and below and (not self.odd or number % 2 == 1)

    def first_outside(self, value: Any) -> Any:
        """The first number of ``value`` (a number, or nested lists of them) outside the range; None when none is."""
        if isinstance(value, list | tuple):
            return next((bad for bad in map(self.first_outside, value) if bad is not None), None)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return value if number and not self.admits(value) else None

    def text(self) -> str:
        """The range as ``--help`` and the error messages write it: ``>= 1``, ``> 0``, ``in [0, 1)``, ``odd, >= 1``."""
        if self.unconstrained:
            return "any"
        low = None if self.low is None else str(self.low)
        high = None if self.high is None else str(self.high)
        if low is not None and high is not None:
            bounds = f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        elif low is not None:
            bounds = f"{'>' if self.low_open else '>='} {low}"
        else:
            bounds = f"{'<' if self.high_open else '<='} {high}"
        return f"odd, {bounds}" if self.odd else bounds


def ranged(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None, odd: bool = False) -> Any:
    """A schema field with ``default`` whose numbers must lie in a :class:`Range`: ``>= ge`` or ``> gt``, ``<= le`` or
    ``< lt`` (a list default becomes a factory of copies)."""
    valid = Range(low=gt if gt is not None else ge, high=lt if lt is not None else le, low_open=gt is not None,
                  high_open=lt is not None, odd=odd)
    return _field(default, valid)


def unconstrained(default: Any, reason: str) -> Any:
    """A numeric schema field whose every number is valid, for ``reason``."""
    return _field(default, Range(reason=reason))


def _field(default: Any, valid: Range) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"range": valid})
    return field(default=default, metadata={"range": valid})


def key_range(item: Field) -> Range | None:
    """The :class:`Range` of a schema field; None for a key that has none (not a number)."""
    return item.metadata.get("range")


def value_ranges(schema: type) -> tuple[tuple[str, Range], ...]:
    """``(key, range)`` for every constrained leaf key of ``schema``, in declaration order (nested nodes walked)."""
    return _value_ranges(schema, attention_schema())


@cache
def _value_ranges(schema: type, attention: type) -> tuple[tuple[str, Range], ...]:
    """:func:`value_ranges` while ``attention`` is the ``model.attention`` node (a block registering changes it)."""
    return tuple((key, valid) for key, item, _ in leaves(schema)
                 if (valid := key_range(item)) is not None and not valid.unconstrained)


def leaves(schema: type, prefix: str = "") -> Iterator[tuple[str, Field, type]]:
    """``(key, field, the dataclass whose fields hold it)`` for every leaf key of ``schema``, in declaration order
    (nested nodes walked); an inherited field's dataclass is the subclass, whose bases declare it."""
    for item in fields(schema):
        key = f"{prefix}{item.name}"
        nested = node_schema(item)
        if nested is not None:
            yield from leaves(nested, f"{key}.")
        else:
            yield key, item, schema


def value_text(value: Any) -> str:
    """``value`` as a user types it in an override (YAML): ``null``, ``true``, ``[16, 32]``, ``0.003``."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list):
        return "[" + ", ".join(value_text(entry) for entry in value) + "]"
    return str(value)


@dataclass
class AttentionConfig:
    """The keys of the ``model.attention`` node that every slot's transformer block reads, whatever its attention.

    The node holds these and every registered block's own keys (:func:`attention_schema`), so a single node serves
    every slot and a sweep over ``model.attention.gamma`` needs no other change.
    """

    num_heads: int = ranged(4, ge=1)
    """Attention heads; must divide the channel width of every slot."""
    max_bias_gb: float | None = ranged(2.0, gt=0)
    """Model build fails when a slot's dense N x N attention bias (masa; mha with pe=relative, plus its gradient)
    would need more GB (2^30 bytes) than this in float32 at the training patch; null disables the check."""
    mlp_ratio: float = ranged(4.0, gt=0)
    """Hidden width of the transformer block's FFN as a multiple of the channel width."""
    ffn: str = "mlp"
    """Transformer block FFN: mlp (Linear-GELU-Linear) or dwconv (RMT's: a depthwise conv inside the hidden layer)."""
    drop_path: float = ranged(0.0, ge=0, lt=1)
    """Stochastic-depth rate of the transformer block's residual branches."""
    layer_scale: float | None = ranged(None, gt=0)
    """Initial value of the per-channel layer scale; null disables it."""

    def __reduce__(self) -> tuple[Any, tuple[()], dict[str, Any]]:
        """Pickled as its values, unpickled as the node of the blocks registered then: the node's class is made at run
        time (:func:`attention_schema`), so no module holds it by name."""
        return attention_config, (), {item.name: getattr(self, item.name) for item in fields(self)}


@dataclass
class KernelKey:
    """The ``model.attention.kernel_size`` key of the blocks with a depthwise conv on v (masa, focused_linear)."""

    kernel_size: int = ranged(5, ge=1, odd=True)
    """Depthwise-conv kernel of MaSA's LCE and of focused linear attention's rank restoration."""


@dataclass
class RopeKey:
    """The ``model.attention.rope`` key of the blocks that can rotate q and k (masa, masa_decomposed, mha)."""

    rope: str = "none"
    """masa, masa_decomposed, mha: none, or axial (rotary encoding of q and k, head dim split over the axes)."""


@dataclass
class MaSAKeys(KernelKey, RopeKey):
    """MaSA's own ``model.attention`` keys (masa and masa_decomposed), besides ``kernel_size`` and ``rope``."""

    gamma: float = ranged(0.9, ge=0, le=1)
    """MaSA decay base in [0, 1]; the weight between tokens n and m is gamma ** manhattan(n, m) (0: each token
    attends to itself alone)."""
    heads_range: float = ranged(0.0, ge=0)
    """MaSA: 0 for one gamma for all heads; > 0 for per-head 1 - (1 - gamma) * 2 ** (-heads_range * h / num_heads)."""
    spacing: list[float] | None = ranged(None, gt=0)
    """Voxel spacing in mm per spatial axis at the network input; MaSA distances become physical. null: voxels."""


@dataclass
class FocusedLinearKeys(KernelKey):
    """Focused linear attention's own ``model.attention`` keys, besides ``kernel_size``."""

    focusing_factor: float = ranged(3.0, gt=0)
    """Focused linear attention: the power p of the focusing function."""
    positional_size: int = ranged(8, ge=0)
    """Focused linear attention: side of the grid its zero-initialised positional term on k is stored on
    (interpolated to the actual grid); 0 = one value per token of the slot's training grid (official FLatten)."""


@dataclass
class CSWinKeys:
    """CSWin's own ``model.attention`` keys."""

    split_size: int = ranged(2, ge=1)
    """CSWin stripe width in tokens."""
    lepe: str = "map"
    """CSWin LePE: map (one 3x3(x3) depthwise conv over the whole map) or stripe (official: inside each stripe)."""


@dataclass
class MHAKeys(RopeKey):
    """Multi-head attention's own ``model.attention`` keys, besides ``rope``."""

    pe: str = "sincos"
    """MHA position encoding: sincos, relative or none."""
    max_relative_size: int = ranged(0, ge=0)
    """MHA relative bias: tokens per axis its table covers exactly; 0 means 16 (grids above it interpolate it)."""


BLOCK_KEYS: dict[str, type] = {"masa": MaSAKeys, "masa_decomposed": MaSAKeys, "focused_linear": FocusedLinearKeys,
                               "cswin": CSWinKeys, "mha": MHAKeys}
"""Block name -> the dataclass of its own ``model.attention`` keys (its hyperparameters): medseg's blocks', and those
of other packages' blocks as they register (:func:`medseg.attention.registry.register_attention`)."""

BLOCK_ENTRY_POINTS = "medseg.attention_blocks"
"""The entry-point group of installed packages' blocks: each entry point names a module that registers blocks."""


def add_block_keys(block: str, keys: type) -> None:
    """Add block ``block``'s own keys (dataclass ``keys``, every field with a default, documented by the docstring
    under it and range-checked by its :class:`Range`) to the ``model.attention`` node.

    Raises:
        ValueError: ``keys`` is no dataclass or a field has no default, or a key another block or
            :class:`AttentionConfig` already declares with another type or default (blocks may share a key, e.g.
            ``kernel_size``, only where they agree on it).
    """
    if BLOCK_KEYS.get(block) is keys:
        return
    if not is_dataclass(keys):
        raise ValueError(f"attention block {block!r}: its keys must be a dataclass, got {keys!r}")
    declared = {item.name: (item, owner) for owner, cls in [("every block", AttentionConfig), *BLOCK_KEYS.items()]
                for item in fields(cls)}
    for item in fields(keys):
        if item.default is MISSING_DEFAULT and item.default_factory is MISSING_DEFAULT:
            raise ValueError(f"attention block {block!r}: key {item.name!r} needs a default")
        if item.name in declared and _declaration(item) != _declaration(declared[item.name][0]):
            raise ValueError(f"attention block {block!r}: key model.attention.{item.name} is already declared by "
                             f"{declared[item.name][1]} with another type or default")
    BLOCK_KEYS[block] = keys


def _declaration(item: Field) -> tuple[str, Any, Any]:
    """What two blocks sharing a key must agree on: its type, default and range."""
    return type_text(item), item.default, key_range(item)


def type_text(item: Field) -> str:
    """A schema field's type as its annotation reads (``float``, ``list[int] | None``), whether or not its module
    postpones annotations."""
    return item.type if isinstance(item.type, str) else getattr(item.type, "__name__", str(item.type))


def attention_schema() -> type:
    """The ``model.attention`` node's dataclass: :class:`AttentionConfig`'s keys, then each registered block's."""
    return _attention_schema(tuple(dict.fromkeys(BLOCK_KEYS.values())))


@cache
def _attention_schema(block_keys: tuple[type, ...]) -> type:
    schema = make_dataclass("AttentionConfig", [], bases=(*reversed(block_keys), AttentionConfig))
    schema.__module__, schema.__doc__ = __name__, AttentionConfig.__doc__
    return schema


def attention_config(**values: Any) -> Any:
    """A ``model.attention`` node with ``values`` set and every other key at its default: an instance of
    :func:`attention_schema`, the keys of :class:`AttentionConfig` and of every registered block."""
    return attention_schema()(**values)


def node_schema(item: Field) -> type | None:
    """The dataclass of a schema field that is a nested node (``model``, ``model.attention``, ...); None for a leaf."""
    if "schema" in item.metadata:
        return item.metadata["schema"]()
    return item.default_factory if is_dataclass(item.default_factory) else None  # type: ignore[return-value]


@dataclass
class ModelConfig:
    """The network (the ``model`` node)."""

    name: str = "unet"
    """unet (medseg's slotted U-Net), or MONAI's monai_unet, monai_swinunetr, monai_unetr for comparisons."""
    spatial_dims: int = ranged(3, ge=2, le=3)
    """3, or 2 for slices across the thickest axis of the same volumes."""
    channels: list[int] | None = ranged(None, ge=1)
    """Feature width per level; len(channels) - 1 down-samplings. null = planned with the patch (nnU-Net's rule: a
    level per pooling step until every axis is down to about 4 voxels; widths 32, 64, ... up to 320 in 3D, 512 in
    2D). The demo sets its small network, [16, 32, 64, 128]."""
    strides: list[Any] | None = ranged(None, ge=1)
    """One per down-sampling: an int, or one int per axis (anisotropic pooling), 1 or 2 for unet; null = planned from
    the data."""
    kernel_size: Any = ranged(3, ge=1, odd=True)
    """Convolution kernel of the U-Net's conv stages: an odd int for every level, or a list with one entry per level
    of model.channels (the full-resolution level first), each an odd int or one per axis in RAS order, e.g.
    [[3,3,1],[3,3,1],3,3,3] for thick slices along S. A level's kernel serves its encoder stage and the decoder stage
    that outputs its width (nnU-Net's conv_kernel_sizes); an nnU-Net plan (plan.file) sets it."""
    encoder_blocks: Any = ranged(1, ge=1)
    """Blocks per encoder level: residual blocks of two convs (conv_stages medseg), conv layers (nnunet_plain,
    nnU-Net's n_conv_per_stage) or BasicBlockD blocks (nnunet_resenc, its n_blocks_per_stage). An int for every level,
    or a list per level from the full-resolution one down; a longer list is cut to the network's levels, so one list
    serves any planned depth. experiment=resenc_m / resenc_l: [1, 3, 4, 6, 6, 6, ...] (nnU-Net's ResEnc presets)."""
    decoder_convs: int = ranged(2, ge=1)
    """Conv layers per decoder stage after the up-sampling and the skip: 2, or 1 as in nnU-Net's ResEnc presets
    (conv_stages medseg builds 1 or 2)."""
    conv_stages: str = "medseg"
    """The conv stages: medseg (residual blocks of MONAI's UnetResBlock, no conv bias); nnunet_plain (nnU-Net's
    PlainConvUNet: conv, norm, LeakyReLU layers with conv bias, He initialisation); nnunet_resenc (nnU-Net's
    ResidualEncoderUNet: a stem conv, then BasicBlockD blocks); nnunet (recipe=nnunet's: the network of an nnU-Net
    plan, its class and blocks, and without one PlainConvUNet). An nnU-Net plan (plan.file) sets its network where
    this key keeps its default."""
    norm: str = "instance"
    """Normalisation of the conv stages: instance, batch, or group (8 groups, fewer for narrower levels)."""
    dropout: float = ranged(0.0, ge=0, lt=1)
    """Dropout rate in the conv stages."""
    deep_supervision: bool = False
    """nnU-Net-style deep supervision: losses on the lower decoder stages too."""
    checkpointing: bool = False
    """Activation checkpointing in the transformer blocks (less memory, same gradients)."""
    channels_last: bool = True
    """3D only: weights and activations in the channels-last 3D memory format (faster convolutions)."""
    bottleneck: str = "none"
    """Attention block in the bottleneck slot: none, or a registered block name (masa, cswin, ...)."""
    bottleneck_depth: int = ranged(2, ge=1)
    """Transformer blocks stacked in the bottleneck."""
    decoder: str = "none"
    """Attention block after each of the lowest-resolution decoder stages: none, or a block name."""
    decoder_levels: int = ranged(1, ge=0)
    """How many of the lowest-resolution decoder stages get the decoder block."""
    attention: AttentionConfig = field(default_factory=attention_config, metadata={"schema": attention_schema})
    """Hyperparameters of the attention slots: the keys every block reads, and each registered block's own."""
    block_modules: list[str] = field(default_factory=list)
    """Python modules to import before the slots' blocks are looked up, e.g. [my_lab.blocks]: each registers its
    blocks (medseg.attention.register_attention), which model.bottleneck and model.decoder can then name. Blocks of
    an installed package's medseg.attention_blocks entry points need no entry here."""


@dataclass
class DataConfig:
    """The dataset and its preprocessing (the ``data`` node); null values are planned from the data."""

    format: str = "msd"
    """demo (generated on first use), msd (Medical Segmentation Decathlon folder) or nnunet (nnU-Net v2 raw)."""
    root: str = MISSING
    """Dataset folder, the one holding dataset.json."""
    num_cases: int = ranged(40, ge=1)
    """demo only: how many volumes to generate."""
    fold: Any = ranged(0, ge=0)
    """0..num_folds-1, or all (train and validate on every case)."""
    num_folds: int = ranged(5, ge=2)
    """Folds of the cross-validation split."""
    split_seed: int = unconstrained(12345, "any integer seeds Python's random shuffle")
    """Seed of the fold split (stored once per dataset and reused)."""
    splits: str | None = None
    """A splits file whose fold k is data.fold=k, case for case: nnU-Net's splits_final.json (a list of {train, val}
    per fold), medseg's splits_seed*_k*.json of the cache folder (the same), or a run's splits.json (its fold only).
    data.num_folds must equal the file's number of folds. It wins over data.split_seed and a dataset.json
    validation list; null = medseg's own split."""
    spacing: list[float] | None = ranged(None, gt=0)
    """Target spacing in mm in RAS axis order (three entries, also in 2D); null = planned."""
    patch_size: list[int] | None = ranged(None, ge=1)
    """Training patch in voxels; in 2D the two in-plane sizes (or three, the slice axis dropped); null = planned."""
    normalization: Any = None
    """zscore (per image and channel), ct (planned clip and statistics), none; null = planned from the modality."""
    resampling: str = "linear"
    """How the image reaches data.spacing: linear, or nnunet (nnU-Net's: a third-order spline, and where a case is
    anisotropic, more than 3 times thicker along one axis, the spline across that axis and nearest neighbour along
    it). Labels: nearest neighbour."""
    regions: Any = None
    """Region-based training (nnU-Net v2's), a mapping region name -> the dataset's label values it unites, e.g.
    {whole_tumor:[1,2,4],tumor_core:[2,4],enhancing:[4]}; one sigmoid output per region. null: softmax classes, or
    the regions of an nnU-Net dataset.json."""
    regions_class_order: list[int] | None = ranged(None, ge=1)
    """With data.regions: the label value each region writes into predicted label maps, later regions overwriting
    earlier ones (needed when regions overlap); null: each region's lowest value."""
    pos_fraction: float = ranged(0.33, ge=0, le=1)
    """Share of patches centred on foreground: with data.augment light or none, each patch on a foreground voxel
    with this chance; with nnunet (nnU-Net's oversample_foreground_percent), the last n - round(n * (1 - share)) of a
    batch's n patches, each on a voxel of a class drawn uniformly among those its case holds."""
    samples_per_volume: int | None = ranged(None, ge=1)
    """Patches drawn from each volume per epoch; null = 2 in 3D, 16 slices in 2D."""
    augment: str = "light"
    """Training augmentation: light (random flips, 90-degree rotations, intensity jitter: the demo's), nnunet (nnU-Net
    v2's default chain: rotation and scaling from an enlarged patch, noise, blur, brightness, contrast, low resolution,
    gamma, mirroring; recipe=nnunet) or none."""
    augment_on: str = "auto"
    """Where data.augment=nnunet's random transforms run: workers (each patch in the loader's worker processes, as
    nnU-Net does), device (the workers only crop the enlarged patch and draw each patch's random parameters; the
    training device applies them to the whole batch at once, the same patches to float tolerance, so a GPU needs few
    CPU cores) or auto (device when training on CUDA, else workers). light and none always run on the workers."""
    cache: str = "auto"
    """auto (memory when training's estimated peak RAM with the cases in memory is below 80% of the available RAM,
    else disk), memory, disk or none."""
    cache_dir: str | None = None
    """Fingerprint, splits and disk cache; null = <root>/.medseg_cache, or the user cache when root is read-only."""
    plan_from: str = "data"
    """data: plan the null keys among spacing, patch_size, normalization, model.strides and model.channels from this
    dataset; init: take all five from the checkpoint the run starts from (trainer.init_from, or the one it resumes)."""
    num_workers: int = ranged(2, ge=0)
    """Data-loading worker processes."""


@dataclass
class TrainerConfig:
    """The training loop (the ``trainer`` node)."""

    max_epochs: int = ranged(6, ge=1)
    """Epochs; sized for the demo on a laptop CPU, real data needs hundreds."""
    max_minutes: float | None = ranged(None, gt=0)
    """Wall-clock budget of training, validation included: the first epoch is timed (and validated), the schedule is
    set to span the epochs that fit, and training ends when another epoch would not fit (max_epochs still caps it)."""
    batch_size: int = ranged(1, ge=1)
    """Volumes per step, each giving data.samples_per_volume patches (1 x 2 in 3D: nnU-Net's batch of 2 patches); per
    process under DDP. The demo sets 2."""
    lr: float = ranged(3e-3, ge=0)
    """Peak learning rate (0 keeps the weights as they start: a check of what initialisation or trainer.init_from
    made)."""
    weight_decay: float = ranged(3e-5, ge=0)
    """Weight decay."""
    loss: str = "dice_ce"
    """dice_ce, dice_focal, dice, ce or nnunet: Dice plus cross-entropy, Dice plus focal (gamma 2), Dice alone,
    cross-entropy alone (MONAI's), or nnU-Net's Dice plus cross-entropy (its Dice without the background, summed over
    the batch in 2D; recipe=nnunet). Softmax over the classes, or sigmoid per region (binary cross-entropy) on
    region-based data; ignore-label voxels take no part."""
    class_weights: Any = ranged(None, gt=0)
    """null (unweighted); auto (from the fingerprint's voxels per output n_c: min(sqrt(n_max / n_c), 10), normalised
    to average 1); or [w0, w1, ...], one positive weight per network output (background first, or one per region).
    They scale the Dice and the cross-entropy or focal term of each output."""
    optimizer: str = "adamw"
    """adamw, or sgd (nesterov, trainer.momentum)."""
    momentum: float = ranged(0.99, gt=0, lt=1)
    """SGD momentum."""
    scheduler: str = "cosine"
    """Learning-rate schedule per epoch after the warm-up: cosine, poly (power 0.9) or none."""
    warmup_epochs: int = ranged(0, ge=0)
    """Epochs of linear warm-up before the schedule."""
    iterations_per_epoch: int | None = ranged(None, ge=1)
    """Training steps per epoch, each on trainer.batch_size cases drawn at random with replacement (nnU-Net's 250);
    null = one pass over the training cases in a shuffled order."""
    val_iterations: int = ranged(0, ge=0)
    """The cheap validation of every epoch (nnU-Net's 50): the pseudo-Dice of this many batches of validation patches
    (true and false positives summed over them, no augmentation), smoothed by an exponential moving average
    (0.9 old + 0.1 new) that chooses best.pt, as nnU-Net chooses checkpoint_best; 0 = none, best.pt chosen by the
    full validation."""
    val_every: int | None = ranged(2, ge=1)
    """Full validation (sliding-window prediction of every validation volume) every this many epochs; the last epoch
    always validates (with trainer.val_iterations, best.pt's weights); null = the last epoch only."""
    device: str = "auto"
    """auto (CUDA when present), cpu, cuda or cuda:N."""
    precision: str = "auto"
    """auto (bf16 autocast on CUDA, fp32 on the CPU), bf16, fp16 (with loss scaling) or fp32."""
    seed: int = ranged(0, ge=0, le=2**32 - 1)
    """Seed of the weights, the sampling and the augmentation."""
    deterministic: bool = False
    """Deterministic algorithms (slower); ops without one warn."""
    compile: bool = False
    """torch.compile the model."""
    grad_clip: float | None = ranged(12.0, gt=0)
    """Max gradient norm; null disables clipping."""
    max_nonfinite_steps: int = ranged(20, ge=1)
    """Stop after this many non-finite losses or gradients in a row."""
    resume: bool = False
    """Resume from last.pt in the run directory."""
    init_from: str | None = None
    """Fine-tune: start a new run from these weights only (fresh optimizer, schedule and epochs): a medseg checkpoint
    or a plain state dict of medseg's network, whose model config must match the run's but for the attention blocks
    it lacks (they start as the identity); or a trained nnU-Net v2 model
    (its trained-model folder, data.fold choosing fold_<k>; a fold_<k> folder; or a checkpoint in one), whose plan
    the run trains on (plan.file or data.plan_from=init), its attention slots started as the identity. Layers whose
    shape differs (other classes or input channels) are re-initialised. Not with trainer.resume or ckpt_path."""
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
    """What planning sizes the patch for (the ``plan`` node): the machine that will train, not always this one."""

    device: str = "auto"
    """The device the plan is for: cuda, cpu, or auto (trainer.device on this machine: the one that trains). cuda
    plans on a machine without a GPU too, for plan.memory_gb or plan.reference_gb."""
    precision: str | None = None
    """The training precision the plan is for (auto, bf16, fp16 or fp32, as trainer.precision); null =
    trainer.precision, whose auto is bf16 on CUDA and fp32 on the CPU."""
    memory_gb: float | None = ranged(None, gt=0)
    """Training memory (GB, 2^30 bytes) a planned patch may need, estimated for the network, trainer.batch_size x
    data.samples_per_volume patches, the precision and trainer.optimizer. null = for CUDA the GPU's memory, at most
    plan.reference_gb (plan.reference_gb itself where this machine has no GPU); for a CPU the voxel budget instead
    (48^3 voxels in 3D, 256^2 in 2D, for 32 first-level channels)."""
    reference_gb: float = ranged(8.0, gt=0)
    """With plan.memory_gb null for CUDA: the most of the GPU's memory a planned patch may need (nnU-Net's memory
    target: 8 GB; experiment=resenc_l 24)."""
    file: str | None = None
    """A plan file (JSON, like nnU-Net's plans.json): scripts/plan.py writes the plan into it, scripts/train.py
    takes its spacing, patch, normalization, strides and channels from it (keys set in the config win) after checking
    that it was planned for the same dataset. scripts/train.py also takes nnU-Net's plans (nnUNetPlans.json,
    nnUNetResEncUNetMPlans.json, ...): plan.nnunet_configuration's spacing, patch, normalization, strides, widths,
    kernel sizes of each stage, encoder blocks and decoder convs, in RAS order, warning of what medseg builds
    otherwise. null = plan when training."""
    nnunet_configuration: str | None = None
    """With plan.file an nnU-Net plans file: the configuration to train from (3d_fullres, 3d_lowres, 2d, or another
    of the file's; scripts/plan.py compares nnunet_plans' with it); null = 3d_fullres for model.spatial_dims=3, 2d
    for 2."""


SLAB_SLICES = 2
"""``inference.slab_slices``'s default: each slice of a slab costs classes x the file's cross-section x 4 bytes
several times over (the resampling's output and its copies), so a thinner slab holds less; the result is the same
for any slab."""


@dataclass
class InferenceConfig:
    """How a network predicts whole cases (the ``inference`` node): the device, the arithmetic, the backend and the
    sliding window. predict, evaluate, crossval and visualize predict with it, and training's validation reads its
    sliding window (overlap, sw_batch_size, sw_device, tta, skip_constant) on trainer.device in trainer.precision."""

    device: str = "auto"
    """auto (CUDA when present), cpu, cuda or cuda:N; training validates on trainer.device."""
    sw_device: str | None = None
    """Where windows are stitched (cpu saves GPU memory); null = the device that runs the network."""
    precision: str = "auto"
    """auto (bf16 on CUDA, fp32 on the CPU), fp32, bf16, or int8 (inference.backend=openvino only): the network's
    arithmetic; training validates in trainer.precision. bf16 on the CPU is faster than fp32 only where the CPU has
    native bf16 (AMX or AVX512-BF16). int8: the network quantised after training by
    NNCF, calibrated on inference.calibration_windows windows of the checkpoint's training cases and cached beside the
    checkpoint (openvino_int8/); its Dice against fp32 is to be checked on your data."""
    backend: str = "torch"
    """torch, or openvino (the CPU only; pip install "medseg[openvino]"): the network exported and compiled by
    OpenVINO for this CPU, in the arithmetic of inference.precision; windows, mirroring and blending stay medseg's.
    Training validates with torch."""
    overlap: float = ranged(0.5, ge=0, lt=1)
    """Sliding-window overlap (gaussian blending)."""
    sw_batch_size: int = ranged(4, ge=1)
    """Windows per forward pass."""
    tta: bool | None = None
    """Mirroring test-time augmentation, nnU-Net's: the identity and every combination of the mirrored axes (3D: all
    three, 8 passes; 2D: the in-plane two, 4 passes), averaged; null: as the checkpoint's training validated
    (recipe=nnunet: on, as nnU-Net predicts; recipe=light: off)."""
    skip_constant: bool = True
    """Answer the windows that hold one value per channel (air, padding) from one run of the network on such a
    window; false runs the network on every window (the dense result)."""
    slab_slices: int | None = ranged(SLAB_SLICES, ge=1)
    """Prediction blends, resamples back and decides the image file's slices this many at a time (its last axis), so
    it holds the probabilities of a slab plus a window's depth, not of the whole scan; null: the whole scan at once
    (the same result). Training validates whole volumes."""
    calibration_windows: int = ranged(32, ge=1)
    """inference.precision=int8: the windows of the network's input size that calibrate its quantisation, drawn at
    random (a fixed seed) around the body of the checkpoint's training cases, up to 4 per case."""
    calibration_root: str | None = None
    """inference.precision=int8: the dataset folder (dataset.json, imagesTr/) holding the checkpoint's training
    cases, where they no longer lie at the checkpoint's data.root; null: data.root."""
    progress: bool = True
    """Progress bars of prediction: over the cases (x models), and over the windows for a single model; training
    shows its own (trainer.progress)."""


@dataclass
class ValidationConfig(InferenceConfig):
    """Training's ``inference`` node: validation's sliding window."""

    overlap: float = ranged(0.25, ge=0, lt=1)
    """Sliding-window overlap of validation (gaussian blending): less than prediction's 0.5, faster, as validation's
    Dice only chooses best.pt."""
    tta: bool = False
    """Mirroring of the validation volumes, nnU-Net's passes (recipe=nnunet: on); prediction with the checkpoint
    mirrors likewise unless its inference.tta says otherwise."""


@dataclass
class TrainConfig:
    """``scripts/train.py``: everything a training run reads."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    plan: PlanningConfig = field(default_factory=PlanningConfig)
    """What the planned patch and network are sized for."""
    inference: ValidationConfig = field(default_factory=ValidationConfig)
    """Validation's sliding window."""
    task_name: str = "train"
    """Names the output folder outputs/<task_name>/<date>/<time>."""
    output_dir: str = "outputs/train"
    """The run directory (Hydra's run directory when launched from the command line)."""
    ckpt_path: str | None = None
    """Resume from this checkpoint file (wins over trainer.resume)."""


@dataclass
class PredictConfig:
    """``scripts/predict.py``: segment every case of ``input`` with a checkpoint or an ensemble; no labels needed."""

    ckpt: Any = MISSING
    """A medseg checkpoint (outputs/train/<date>/<time>/checkpoints/best.pt); a list [a.pt,b.pt] (an ensemble: their
    probabilities averaged: softmax, or sigmoid per region); or a multirun folder (the ensemble of its finished folds'
    best.pt)."""
    input: str = MISSING
    """A folder of images or DICOM series (in the folder itself or its sub-folders at any depth, DICOMDIR exports
    included), a folder with imagesTs/ (+ labelsTs/), or a dataset.json (or its folder)."""
    output: str = "predictions"
    """Folder for the predictions and summary.json."""
    output_format: str = "nifti"
    """nifti (<case>.nii.gz label maps on the input's grid) or dicom_seg (<case>.seg.dcm: a DICOM-SEG on the input
    series, one segment per class or region; DICOM series inputs of one-channel models; pip install
    "medseg[dicom]")."""
    split: str = "test"
    """dataset.json input only: test, training or validation (the checkpoint's fold without a validation list)."""
    save_probabilities: bool = False
    """Also write <case>.npz with float16 probabilities (C, X, Y, Z): softmax per class, or sigmoid per region."""
    postprocessing: str = "auto"
    """auto (the postprocessing.json that scripts/crossval.py decided for exactly these checkpoints, found in their
    multirun's crossval/; none when there is none, e.g. for a single fold), none, or a postprocessing.json file."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """How the network predicts: device, precision, backend, sliding window, mirroring."""


@dataclass
class EvaluateConfig(PredictConfig):
    """``scripts/evaluate.py``: score segmentations against their labels: the predictions of ``ckpt`` (a checkpoint or
    an ensemble, predicted as ``scripts/predict.py`` does), or a folder of predictions made by any tool (``pred``)."""

    ckpt: Any = None
    """A medseg checkpoint, a list of them (an ensemble) or a multirun folder, as scripts/predict.py takes it; null
    with pred (then only its classes are read, when given)."""
    pred: str | None = None
    """A folder of label maps (<case>.nii.gz, in the dataset's label values, on the references' grids) made by any
    tool: scored against the labels of input, matched by case name, instead of predicting; null = predict with
    ckpt."""
    output: str | None = None
    """Folder for metrics.csv and summary.json (and the predictions of ckpt); null = predictions, or with pred the
    pred folder itself."""
    tolerance_mm: float = ranged(1.0, ge=0)
    """Normalised surface Dice tolerance in mm."""


@dataclass
class CrossvalConfig:
    """``scripts/crossval.py DIR``: score a multirun of folds on its out-of-fold predictions, decide the postprocessing.

    The surface-Dice tolerance is evaluate's default.
    """

    dir: str = MISSING
    """The multirun folder of the folds (python scripts/train.py -m data.fold=0,1,2,3,4); also the first argument.
    The results go to DIR/crossval (DIR/crossval/<setting> for each setting of a wider sweep)."""
    postprocessing: bool = True
    """Decide the postprocessing on the out-of-fold predictions (postprocessing.json)."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """How the folds predict their validation cases (inference.progress: the bar over the cases)."""


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
    """One volume file (.nii.gz, .nii, .nrrd, .mha) or DICOM series folder, read and preprocessed as
    scripts/evaluate.py reads it."""
    voxel: list[int] | None = ranged(None, ge=0)
    """The query voxel as indices [i,j,k] of the input file; null (and no world) = the predicted foreground voxel
    nearest the foreground's centre of mass."""
    world: list[float] | None = unconstrained(None, "a point anywhere in the world coordinates")
    """The query point [x,y,z] in mm in the input file's world coordinates (RAS, as its affine maps voxels); instead
    of voxel."""
    output: str = "attention"
    """Folder for attention.json, the PNG montages and the NIfTI maps (one 4D file per slot and block)."""
    slot: str | None = None
    """Only this attention slot (e.g. bottleneck); null = every slot."""
    block: int | None = ranged(None, ge=0)
    """Only this block of the slot(s), 0 the first; null = every block."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """The device, and how the foreground that places the default query is predicted."""


@dataclass
class PlanCommandConfig:
    """``scripts/plan.py``: the fingerprint and plan of ``data`` for ``model``, as ``scripts/train.py`` plans them."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The training the plan is for: its batch size, precision, optimizer and device size the patch (the other keys
    are not read here)."""
    plan: PlanningConfig = field(default_factory=PlanningConfig)
    """What the planned patch and network are sized for."""
    inference: Any = None
    """Not read here: what a data preset sets for training's validation (recipe=nnunet's mirroring)."""
    nnunet_plans: str | None = None
    """An nnU-Net v2 plans file (nnUNetPlans.json) of the same dataset: the report compares its 3d_fullres (or 2d, or
    plan.nnunet_configuration) patch and depth with this plan's."""
    progress: bool = True
    """Progress bar while fingerprinting."""


@dataclass
class CheckDataConfig:
    """``scripts/check_data.py``: verify every case of ``data``."""

    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None
    """Not read here: what a data preset sets for training (demo3d's small network)."""
    trainer: Any = None
    """Not read here: what a data preset sets for training (demo3d's batch)."""
    inference: Any = None
    """Not read here: what a data preset sets for training's validation (recipe=nnunet's mirroring)."""
    progress: bool = True
    """Progress bar over the cases."""


SCHEMAS: dict[str, type] = {"train": TrainConfig, "predict": PredictConfig, "evaluate": EvaluateConfig,
                            "crossval": CrossvalConfig, "export": ExportConfig, "visualize": VisualizeConfig,
                            "plan": PlanCommandConfig, "check_data": CheckDataConfig}
"""Each entry point's schema, registered in Hydra's ConfigStore as ``<name>_schema``."""

