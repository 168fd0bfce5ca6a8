"""A measured V(n) that can be trusted: what breaks physics is measured again, then refused; what
is kept says when, how noisy and under what load; a kept file that breaks physics is not used."""

from __future__ import annotations

import json

import pytest

from app.tabs.theory import cached_verify
from decoding.errors import SpecLensError
from decoding.models.loading import pick_device, pick_dtype
from decoding.tools import probe


def result(steps: dict[int, float], limit_ms: float = 29.5, spread: float | None = 0.04) -> dict:
    """A probe's result with these median step times (ms), every n at the same limit (the weights
    streamed once, as a small model's few rows are), as `probe` and `measure` write it."""
    found = {
        "target": "smollm2-135m",
        "dtype": "float32",
        "device": "cpu",
        "passes": 15,
        "measured_at": "2026-05-02T09:14:03+00:00",
        "load": {"before": 2.4, "after": 2.9, "cores": 2},
    }
    for n, ms in steps.items():
        found[str(n)] = {
            "step_ms": ms,
            "verify_ratio": round(ms / steps[1], 3),
            "limit_ms": limit_ms,
            "step_over_limit": round(ms / limit_ms, 3),
        } | (
            {"spread": spread, "step_min_ms": ms * 0.95, "step_max_ms": ms * 1.1}
            if spread is not None
            else {}
        )
    return found


# The cached probe on a busy machine: V(1) = 66.7 ms (2.26× its limit) and V(2) = 30.9 ms.
BUSY = result({1: 66.7, 2: 30.9, 3: 31.4, 5: 33.0, 9: 38.2, 17: 52.6})
QUIET = result({1: 30.1, 2: 30.8, 3: 31.0, 5: 32.2, 9: 36.9, 17: 50.3})


def test_the_busy_machines_v_breaks_physics_and_a_quiet_one_does_not():
    problems = probe.physics_problems(BUSY)
    assert "V(2) = 30.9 ms, below V(1) = 66.7 ms" in problems[0]
    assert any("V(1) is 2.26× its limit while V(2) is 1.05×" in p for p in problems)
    assert probe.physics_problems(QUIET) == []
    # Within its noise, V(2) a little under V(1) is jitter, not physics broken.
    assert probe.physics_problems(result({1: 30.1, 2: 29.0}, spread=0.1)) == []
    assert probe.physics_problems(result({1: 30.1, 2: 30.8}, spread=0.6)) == []  # noisy, said, kept
    scattered = result({1: 30.1, 2: 30.8}, spread=1.2)
    assert any("scattered by 120% of their median" in p for p in probe.physics_problems(scattered))


def test_a_result_that_breaks_physics_is_measured_again_then_refused():
    taken = iter([BUSY, QUIET])
    assert probe.first_plausible(lambda: next(taken), tries=3) == QUIET | {"tries": 2}
    with pytest.raises(SpecLensError, match=r"measured 2 times and broke physics each time \(V\(2\)"):
        probe.first_plausible(lambda: BUSY, tries=2)


def test_what_is_kept_names_when_how_noisy_and_under_what_load():
    said = probe.provenance(QUIET)
    assert said == (
        "measured 2026-05-02 at 09:14 UTC over 15 interleaved passes, each V(n) within ±2% (the middle "
        "half of its passes), load 2.4 → 2.9 on 2 cores"
    )
    assert probe.provenance(QUIET, day=False).startswith("timed at 09:14 UTC over 15")
    older = result({1: 30.1, 2: 30.8}, spread=None)  # a file from before the spread was kept
    assert (
        probe.provenance(older)
        == "measured 2026-05-02 at 09:14 UTC by an older probe, which kept no spread or load"
    )


def keep(found: dict) -> None:
    """Write `found` where the probe keeps smollm2-135m's figures for the device and dtype it loads with."""
    device = pick_device(None)
    path = probe.cache_file("smollm2-135m", device, pick_dtype(device, None))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found))


def test_a_kept_file_that_breaks_physics_is_not_used_and_theory_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path))
    keep(BUSY)
    found, why = probe.kept("smollm2-135m")
    assert found is None and "breaks physics (V(2) = 30.9 ms, below V(1) = 66.7 ms" in why
    assert probe.cached("smollm2-135m") is None and probe.measured_verify_ratio("smollm2-135m") is None
    ratios, text = cached_verify("smollm2-135m")
    assert (
        ratios is None and "timed on a busy machine, so it is not used" in text and "*Measure V(n)*" in text
    )


def test_a_kept_file_is_named_with_its_provenance_in_every_view(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path))
    keep(QUIET)
    ratio, said = probe.measured_verify_ratio("smollm2-135m")
    assert said == probe.provenance(QUIET) and ratio(2) == pytest.approx(30.8 / 30.1, abs=1e-3)
    ratios, text = cached_verify("smollm2-135m")
    assert ratios[17] == QUIET["17"]["verify_ratio"]
    assert "on 2026-05-02:" in text and "(timed at 09:14 UTC over 15 interleaved passes" in text
    assert "load 2.4 → 2.9 on 2 cores" in text
    assert "under V(1)" not in text
    keep(result({1: 30.1, 2: 29.2, 3: 29.9, 5: 31.0}, spread=0.05))  # within the noise: used, and said so
    text = cached_verify("smollm2-135m")[1]
    assert "V(2), V(3) under V(1) lie within the passes' noise: the predictions count V(1) there" in text
    keep(result({1: 30.1, 2: 30.8}, spread=None))  # an older probe's file is still read, and said so
    assert "by an older probe, which kept no spread or load" in cached_verify("smollm2-135m")[1]
