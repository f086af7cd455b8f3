"""tune_gc: the services' garbage collector settings (services/common/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from services.common.gc_tuning import OLDER_THRESHOLDS, tune_gc
from services.common.settings import Settings


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_it_freezes_what_exists_and_raises_the_young_threshold(restored_gc: None) -> None:
    held = [object() for _ in range(10)]  # noqa: F841 (alive while frozen)
    tune_gc(50_000)
    assert gc.get_threshold() == (50_000, *OLDER_THRESHOLDS)
    assert gc.get_freeze_count() > 0


def test_a_threshold_below_one_is_refused(restored_gc: None) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        tune_gc(0)
    assert gc.get_freeze_count() == 0


def test_the_setting_defaults_to_50000_and_refuses_less_than_cpythons_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().gc_gen0_threshold == 50_000
    monkeypatch.setenv("CORMORANT_GC_GEN0_THRESHOLD", "100")
    with pytest.raises(ValidationError, match="gc_gen0_threshold"):
        Settings()
