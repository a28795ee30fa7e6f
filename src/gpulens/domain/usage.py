"""Fleet usage's unit: one UTC hour of an execution's receipt (shaping/usage.hourly makes it, the
registry stores it with the summary, the usage table sums it; docs/usage.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UsageSlice:
    """One UTC hour of an execution's receipt (the fleet usage table sums these): GPU-ms in all and by
    receipt line (whole milliseconds), useful GPU-seconds (utilization / 100 x GPUs, integrated) and
    GPU energy in joules (the power integral)."""

    hour_ms: int  # the hour's start (Unix ms, a multiple of an hour)
    start_ms: int  # the part of the hour the execution's window covers
    end_ms: int
    gpu_ms: int
    idle_ms: int
    idle_held_ms: int
    input_bound_ms: int
    throttled_ms: int
    useful_gpu_s: float
    energy_j: float
    cost: float | None = None  # the GPU time at the summary's GPU-hour price (None: unpriced)
