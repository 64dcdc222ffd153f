"""Launching distributed work: the driver-side checks that run before a barrier stage."""

from __future__ import annotations

from sparkdist.launch.preflight import check_num_workers, configured_slots, task_slots

__all__ = ["check_num_workers", "configured_slots", "task_slots"]
