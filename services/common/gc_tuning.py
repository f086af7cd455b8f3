"""The garbage collector's settings for a service process.

A service allocates a few dozen short-lived container objects per message (records,
headers, futures, dataclasses), so CPython's default young-generation threshold of 700
allocations triggers thousands of collections per second, and each older-generation
collection walks every object the process holds: Faust's, aiokafka's and the imported
modules' included. py-spy put ``gc_collect_main`` at a third of the ingest node's and the
router's CPU in the unpaced p2p benchmark (bench/NOTES.md, 2026-11-24). Raising the
threshold and freezing what exists at start-up (``gc.freeze``: never collected, never
walked again) removes most of that; reference counting still frees almost every object at
once, and cycles are still collected, only less often.
"""

from __future__ import annotations

import gc

#: CPython's default thresholds of the middle and oldest generations, kept as they are.
OLDER_THRESHOLDS = (10, 10)


def tune_gc(gen0_threshold: int) -> None:
    """Freeze every object the process holds now and collect the young generation every
    ``gen0_threshold`` container allocations (``Settings.gc_gen0_threshold``).

    Call once, when start-up (imports, the app's construction) is done and before the
    event loop runs: objects frozen then are left out of every later collection.
    Raises ``ValueError`` if ``gen0_threshold`` is below 1.
    """
    if gen0_threshold < 1:
        raise ValueError(f"gen0_threshold must be at least 1, got {gen0_threshold}")
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(gen0_threshold, *OLDER_THRESHOLDS)
