"""What the verdict says beyond its interval (``scripts/compare.py``): training noise (one seed said so in the table,
the seeds' spread and agreement), what the sweep could have seen, a swept numeric key as one tested curve, the
ranking's uncertainty, honest cells for unmeasurable metrics and unpredicted classes, and one report per reference.

The sweeps are fake (``tests/helpers/sweeps.py``), their expectations computed here from the formulas.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from medseg.commands import compare
from medseg.evaluation.compare import FILES, build_comparison
from medseg.evaluation.compare_report import ONE_SEED, compare_sweep
from medseg.evaluation.compare_settings import FOREGROUND
from medseg.scoring.paired import NO_EVIDENCE, NOT_MEASURABLE
from medseg.scoring.power import WILCOXON_EFFICIENCY, z_sum
from tests.helpers.sweeps import make_crossvalidated_sweep, metric_rows

CASES = [f"case_{i:02d}" for i in range(20)]
RESAMPLES = 999
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def dice_rows(values: np.ndarray, **columns: Any) -> list[dict[str, Any]]:
    """One class's metrics.csv rows of ``values`` (N,) over CASES, with ``columns`` set on every row."""
    return [{**row, **columns} for row in metric_rows(dict(zip(CASES, values.tolist())))]


def test_one_seed_is_said_in_the_table_and_no_evidence_says_what_could_have_been_seen(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(0.6, 0.9, len(CASES))
    values = {"none": base, "identity": base + rng.normal(0, 0.02, len(CASES)),
              "masa": base + rng.normal(0, 0.02, len(CASES))}
    sweep = make_crossvalidated_sweep(tmp_path / "multirun",
                                      {f"model.bottleneck={b}": [dice_rows(v)] for b, v in values.items()})
    assert compare([str(sweep), "detect=0.01"]) == 0
    assert "CI omits its training noise" in capsys.readouterr().out
    markdown = (sweep / "compare.md").read_text()
    assert f"| model.bottleneck=none | {ONE_SEED} | 20 |" in markdown
    assert "the intervals omit training noise" in markdown
    report = json.loads((sweep / "compare.json").read_text())
    row = next(r for r in report["comparisons"] if r["setting"] == "model.bottleneck=identity"
               and r["output"] == FOREGROUND and r["metric"] == "dice")
    differences = values["identity"] - base
    assert row["p"] == pytest.approx(stats.wilcoxon(differences).pvalue) and not row["training_noise"]
    assert row["verdict"] == NO_EVIDENCE
    se = differences.std(ddof=1) / math.sqrt(len(CASES))
    level = 0.05 / 2  # Holm's first step over the two settings compared
    assert row["detectable_difference"] == pytest.approx(z_sum(level) * se / math.sqrt(3 / math.pi))
    needed = math.ceil(z_sum(level) ** 2 * differences.var(ddof=1) / (WILCOXON_EFFICIENCY * 0.01**2))
    assert row["cases_needed"] == needed
    assert "cases for Δ=0.01" in markdown


def test_detect_must_be_a_positive_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("detect=-0.01", "detect=abc", "detect="):
        with pytest.raises(SystemExit) as exit_code:
            compare([str(tmp_path), bad])
        assert exit_code.value.code == 2 and "expected a positive difference" in capsys.readouterr().err


def test_seed_spread_and_agreement(tmp_path: Path) -> None:
    """Two seeds of masa: one +0.05 on every case, one -0.01; the seed sd is that of their means, 1 of 2 on the side
    of the mean difference, and the interval is wider than the seed-averaged one."""
    base = np.linspace(0.6, 0.9, len(CASES))
    noise = np.random.default_rng(2).normal(0, 0.005, len(CASES))
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", {
        "model.bottleneck=none": [dice_rows(base), dice_rows(base)],
        "model.bottleneck=masa": [dice_rows(base + 0.05 + noise), dice_rows(base - 0.01 - noise)]})
    comparison = build_comparison(sweep, resamples=RESAMPLES)
    masa = next(s for s in comparison.settings if s.label == "model.bottleneck=masa")
    assert masa.seed_spread((FOREGROUND, "dice")) == pytest.approx(np.std([0.05, -0.01], ddof=1), abs=1e-3)
    row = comparison.foreground()["model.bottleneck=masa"]
    assert row.difference.mean == pytest.approx(0.02) and row.difference.training_noise
    assert row.difference.seed_differences == pytest.approx((0.05 + noise.mean(), -0.01 - noise.mean()))
    assert not row.difference.holds_in_every_seed
    assert row.difference.low < 0 < row.difference.high and row.verdict == NO_EVIDENCE, "the seeds disagree"
    assert "| 1/2 |" in (compare_sweep(sweep, resamples=RESAMPLES) and (sweep / "compare.md").read_text())


def test_unpredicted_class_is_not_measurable_and_said_so(tmp_path: Path) -> None:
    """The user's sweep: no setting predicted a single lesion; the lesion HD95 has no finite pair."""
    rows = {}
    for block in ("none", "identity", "masa"):
        rows[f"model.bottleneck={block}"] = [dice_rows(np.full(len(CASES), 0.25), hd95_mm=math.inf, pred_ml=0.0)]
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", rows)
    comparison = compare_sweep(sweep, resamples=RESAMPLES)
    assert comparison.unpredicted == ["tumour"]
    tumour = [row for row in comparison.rows if row.output == "tumour"]
    assert {row.metric for row in tumour} == {"dice", "hd95_mm", "nsd"}
    assert {row.verdict for row in tumour} == {f"{NOT_MEASURABLE}: no tumour predicted"}, "Dice 0.25 = 0.25 is no test"
    assert all(math.isnan(row.p_holm) for row in tumour)
    markdown = (sweep / "compare.md").read_text()
    assert "**No setting predicted `tumour` in any case**" in markdown
    assert markdown.index("No setting predicted") < markdown.index("| setting |")


def test_a_second_reference_keeps_the_first_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(3)
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", {
        f"model.bottleneck={b}": [dice_rows(rng.uniform(0.6, 0.9, len(CASES)))] for b in ("none", "masa")})
    assert compare([str(sweep)]) == 0
    first = {name: (sweep / name).read_bytes() for name in FILES}
    assert compare([str(sweep), "reference=model.bottleneck=masa"]) == 0
    tagged = [f"compare.model.bottleneck=masa{suffix}" for suffix in (".md", ".csv", ".json", ".png")]
    assert f"{sweep}/{tagged[0]}" in capsys.readouterr().out
    assert all((sweep / name).read_bytes() == content for name, content in first.items())
    assert all((sweep / name).is_file() for name in tagged)
    assert json.loads((sweep / tagged[2]).read_text())["reference"] == "model.bottleneck=masa"
    assert f"![forest plot]({tagged[3]})" in (sweep / tagged[0]).read_text()


def gamma_sweep(tmp_path: Path, step: float) -> Path:
    """gamma 0.8, 0.85, 0.9, 0.95: every case's Dice grows by ``step`` per gamma step, plus noise."""
    rng = np.random.default_rng(4)
    base = rng.uniform(0.6, 0.85, len(CASES))
    return make_crossvalidated_sweep(tmp_path / "multirun", {
        f"model.attention.gamma={gamma}":
            [dice_rows(base + step * index + rng.normal(0, 0.01, len(CASES)))]
        for index, gamma in enumerate((0.8, 0.85, 0.9, 0.95))})


def test_a_swept_value_is_one_tested_curve(tmp_path: Path) -> None:
    sweep = gamma_sweep(tmp_path / "rising", 0.02)
    reference = "model.attention.gamma=0.8"
    comparison = compare_sweep(sweep, reference, resamples=RESAMPLES)
    curve = next(c for c in comparison.curves if c.metric == "dice")
    assert curve.key == "model.attention.gamma" and curve.values == [0.8, 0.85, 0.9, 0.95]
    assert curve.slope.low < 0.02 / 0.05 < curve.slope.high and curve.slope.p < 0.001  # 0.4 Dice per unit of gamma
    assert curve.best.startswith("model.attention.gamma=0.95 is best")
    name = "compare.model.attention.gamma=0.8.curve.png"
    assert comparison.files[-1] == name and (sweep / name).read_bytes().startswith(PNG_MAGIC)
    flat = compare_sweep(gamma_sweep(tmp_path / "flat", 0.0), reference, resamples=RESAMPLES)
    curve = next(c for c in flat.curves if c.metric == "dice")
    assert curve.slope.low < 0 < curve.slope.high
    assert curve.best.startswith("the data cannot tell which value of model.attention.gamma is best")


def test_a_swept_value_against_a_baseline_of_another_block(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    base = rng.uniform(0.6, 0.85, len(CASES))
    rows = {"model.bottleneck=none": [dice_rows(base)]}
    for index, gamma in enumerate((0.8, 0.85, 0.9)):
        rows[f"model.bottleneck=masa model.attention.gamma={gamma}"] = [
            dice_rows(base + 0.02 * index + rng.normal(0, 0.01, len(CASES)))]
    comparison = build_comparison(make_crossvalidated_sweep(tmp_path / "multirun", rows), resamples=RESAMPLES)
    curve = next(c for c in comparison.curves if c.metric == "dice")
    assert curve.key == "model.attention.gamma" and len(curve.settings) == 3 and comparison.reference.label not in \
        curve.settings


def test_the_ranking_shows_its_uncertainty(tmp_path: Path) -> None:
    """masa +0.05 on every case is first in (nearly) every resample; none and identity, the same distribution,
    share the second and third ranks."""
    rng = np.random.default_rng(5)
    base = rng.uniform(0.6, 0.85, len(CASES))
    shifts = {"none": 0.0, "identity": 0.0, "masa": 0.05}
    sweep = make_crossvalidated_sweep(tmp_path / "multirun", {
        f"model.bottleneck={b}": [dice_rows(base + shift + rng.normal(0, 0.01, len(CASES)))]
        for b, shift in shifts.items()})
    comparison = compare_sweep(sweep, resamples=RESAMPLES)
    ranking = next(r for r in comparison.rankings if r.metric == "dice")
    assert ranking.settings[ranking.first] == "model.bottleneck=masa" and ranking.first_is_first > 0.99
    assert np.allclose(ranking.distribution.sum(axis=1), 1)
    for label in ("model.bottleneck=none", "model.bottleneck=identity"):
        shares = ranking.distribution[ranking.settings.index(label)]
        assert shares[1] > 0.05 and shares[2] > 0.05, "two settings of one distribution trade ranks"
    assert "ranks first in" in (sweep / "compare.md").read_text()
    assert build_comparison(sweep, resamples=RESAMPLES).rankings[0].first_is_first == ranking.first_is_first
