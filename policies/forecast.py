"""Serving's daily demand profile, and the forecast admission reads from it (issue 28, item 4).

Owns: `ForecastConfig` (the ``forecast`` config section), `DailyProfile` (one model's memory:
the replicas its demand asked for at most in each slot of the day), `record` (fold one
tick's demand in), `profile_ahead` (the replicas the profile foresees per slot from now) and
`serving_forecast` (the `ServingForecast` admission gets: per slot from now, the cluster GPUs
serving's demand will need that the providers cannot host).

Must not: read a clock, do I/O or import Ray. Time arrives as ``now_s``; the profile is
stored by the caller (the loop keeps it in `ServingPolicyState`, which the store holds, so it
outlives a controller restart).

The rules
---------
Slots
    The day is cut into ``bin_s`` slots (15 minutes by default, 96 a day). A slot's figure is
    the most replicas demand asked for during it (the demand policy's decision, delays
    included: what serving actually held).
Memory over days
    When a slot ends its peak is folded into the slot of the day: a higher peak replaces the
    memory at once; a lower one pulls it down by ``fall_weight`` (0.3: a peak that fell by
    half is still foreseen at 85 % of the old one next day). Serving's demand is a guarantee,
    so the forecast rises fast and falls slowly. A slot never seen foresees nothing.
Jitter
    A slot's forecast is the most of itself and its neighbours: a daily peak that comes a
    quarter hour early or late is still foreseen.
Need
    Per slot from now, over ``horizon_s`` (two days by default, so a day-long gang can find a
    start): the GPUs serving's guaranteed models will need (forecast replicas x GPUs per
    replica, models that are ``on_shortfall: yield`` left out) less what the providers can
    host now (``external_cap_gpus``), never below the GPUs the models' cluster floors hold.
    No need beyond the floors anywhere: no forecast (None), and admission decides as before.

Worked example (bin 900 s, fall weight 0.3): a model asks for 4 replicas from 12:00 to 12:15
on Monday; Tuesday's 12:00 slot peaks at 2: the memory becomes 4 - 0.3 x (4 - 2) = 3.4. With
2 GPUs per replica and providers that can host 4 GPUs, Wednesday at 11:00 the forecast for the
12:00 slot (and, by jitter, 11:45 and 12:15) needs ceil(3.4) x 2 - 4 = 4 cluster GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DailyProfile",
    "ForecastConfig",
    "ForecastModel",
    "ServingForecast",
    "profile_ahead",
    "record",
    "duration",
    "serving_forecast",
    "validate_forecast",
]


@dataclass
class ForecastConfig:
    """The ``forecast`` config section (not frozen: omegaconf makes a frozen dataclass a
    read-only node); `validate_forecast` checks it (the config's validation calls it)."""

    enabled: bool = True
    """False: no profile is kept and admission ignores serving's future."""
    bin_s: float = 900.0
    """Length of a slot of the day; must divide the day."""
    fall_weight: float = 0.3
    """How far a lower day's peak pulls a slot's memory down (0: never; 1: at once)."""
    horizon_s: float = 172800.0
    """How far ahead admission looks (a gang's run is checked up to this far)."""
    idle_hold_s: float = 1800.0
    """A gang the forecast holds back still gets GPUs no shorter work wants when serving needs
    them back later than this: leaving them idle that long would cost more than the
    checkpoint, stop and restore the peak then asks of it (``serving-reclaims``). 0: never
    idle for the forecast; a horizon or more: always hold."""

    @property
    def slots_per_day(self) -> int:
        return round(DAY_S / self.bin_s)

    @property
    def horizon_slots(self) -> int:
        return max(1, math.ceil(self.horizon_s / self.bin_s))


DAY_S = 86400.0


def validate_forecast(cfg: ForecastConfig) -> None:
    """Raise ValueError naming the first invalid field of `cfg`."""
    for name in ("bin_s", "fall_weight", "horizon_s", "idle_hold_s"):
        value = getattr(cfg, name)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"forecast.{name}: must be a finite number, got {value!r}")
    if not 60 <= cfg.bin_s <= 3600 or (DAY_S / cfg.bin_s) != round(DAY_S / cfg.bin_s):
        raise ValueError(f"forecast.bin_s: must divide the day and be 60-3600 s, got {cfg.bin_s!r}")
    if not 0 <= cfg.fall_weight <= 1:
        raise ValueError(f"forecast.fall_weight: must be in [0, 1], got {cfg.fall_weight!r}")
    if not 0 <= cfg.idle_hold_s <= 7 * DAY_S:
        raise ValueError(f"forecast.idle_hold_s: must be from 0 to 7 days, got {cfg.idle_hold_s!r}")
    if not cfg.bin_s <= cfg.horizon_s <= 7 * DAY_S:
        raise ValueError(f"forecast.horizon_s: must be from bin_s to 7 days, got {cfg.horizon_s!r}")


@dataclass(frozen=True)
class DailyProfile:
    """One model's memory: per slot of the day, the peak replicas (None: never seen), and the
    slot being recorded now."""

    peaks: tuple[float | None, ...] = ()
    slot: int | None = None
    """The absolute slot (``floor(now_s / bin_s)``) being recorded; None: nothing yet."""
    slot_peak: float = 0.0
    """The most replicas asked for so far in `slot`."""

    def to_dict(self) -> dict[str, object]:
        return {"peaks": list(self.peaks), "slot": self.slot, "slot_peak": self.slot_peak}

    @classmethod
    def from_dict(cls, raw: object) -> DailyProfile:
        """The profile `raw` (what `to_dict` wrote) describes; an empty one if it is not a
        well-formed profile (a damaged store): a forecast is rebuilt from the load, never
        trusted from bad data. One recorded with another ``bin_s`` is reset by `record`."""
        if not isinstance(raw, Mapping):
            return cls()
        peaks, slot, slot_peak = raw.get("peaks"), raw.get("slot"), raw.get("slot_peak")
        if (
            not isinstance(peaks, list)
            or len(peaks) > MAX_SLOTS
            or not all(p is None or _count(p) for p in peaks)
            or not (slot is None or (isinstance(slot, int) and not isinstance(slot, bool)))
            or not _count(slot_peak)
        ):
            return cls()
        return cls(
            tuple(None if p is None else float(p) for p in peaks), slot, float(slot_peak or 0.0)
        )


MAX_SLOTS = round(DAY_S / 60)
"""The most slots a day has (``bin_s`` is at least a minute)."""


def _count(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= 1e9
    )


def record(
    profile: DailyProfile, now_s: float, replicas: float, config: ForecastConfig
) -> DailyProfile:
    """`profile` with this tick's demand (`replicas`, at `now_s`) folded in (see the rules).
    A non-finite or negative reading changes nothing."""
    if not _count(replicas) or not math.isfinite(now_s):
        return profile
    n = config.slots_per_day
    peaks = profile.peaks if len(profile.peaks) == n else (None,) * n
    slot = math.floor(now_s / config.bin_s)
    if profile.slot is None or len(profile.peaks) != n:
        return DailyProfile(peaks, slot, float(replicas))
    if slot <= profile.slot:  # the same slot (or the clock stepped back): keep its peak
        return DailyProfile(peaks, profile.slot, max(profile.slot_peak, float(replicas)))
    i = profile.slot % n
    old = peaks[i]
    seen = profile.slot_peak
    folded = seen if old is None or seen >= old else old - config.fall_weight * (old - seen)
    return DailyProfile(peaks[:i] + (folded,) + peaks[i + 1 :], slot, float(replicas))


def profile_ahead(profile: DailyProfile, now_s: float, config: ForecastConfig) -> tuple[float, ...]:
    """Replicas the profile foresees per slot from the one `now_s` falls in, over the horizon:
    each slot's memory and its neighbours' (jitter), the current slot at least what it has
    seen so far. A profile with nothing recorded foresees 0 everywhere."""
    n = config.slots_per_day
    if len(profile.peaks) != n:
        return (0.0,) * config.horizon_slots
    slot = math.floor(now_s / config.bin_s)
    day = [p or 0.0 for p in profile.peaks]
    out = []
    for k in range(config.horizon_slots):
        i = (slot + k) % n
        v = max(day[(i - 1) % n], day[i], day[(i + 1) % n])
        if k == 0 and profile.slot == slot:
            v = max(v, profile.slot_peak)
        out.append(v)
    return tuple(out)


@dataclass(frozen=True)
class ForecastModel:
    """What `serving_forecast` needs of one served model."""

    name: str
    profile: DailyProfile
    gpus_per_replica: int
    floor_gpus: int = 0
    """GPUs its cluster floor (``min_cluster_replicas``) holds whatever the providers host."""
    guaranteed: bool = True
    """False for ``on_shortfall: yield``: its forecast holds no GPU back from training."""


@dataclass(frozen=True)
class ServingForecast:
    """Per slot from ``start_s`` (the start of the current slot), the cluster GPUs serving's
    forecast demand needs that the providers cannot host, and which model foresees most."""

    start_s: float
    bin_s: float
    need_gpus: tuple[int, ...]
    peak_model: str = ""
    """The guaranteed model with the most forecast GPUs at the peak slot (for reasons)."""
    idle_hold_s: float = 1800.0
    """`ForecastConfig.idle_hold_s`: a held gang may take GPUs no shorter work wants when
    serving needs them back later than this."""

    def __post_init__(self) -> None:
        if self.bin_s <= 0 or not all(g >= 0 for g in self.need_gpus):
            raise ValueError("a forecast needs bin_s > 0 and no negative need")


def serving_forecast(
    models: Iterable[ForecastModel],
    now_s: float,
    external_cap_gpus: int,
    config: ForecastConfig,
) -> ServingForecast | None:
    """The forecast admission reads (see the rules); None when it is off or foresees no
    cluster GPU needed anywhere over the horizon."""
    if not config.enabled:
        return None
    models = [m for m in models if m.guaranteed]
    if not models:
        return None
    ahead: list[Sequence[float]] = [profile_ahead(m.profile, now_s, config) for m in models]
    floors = sum(m.floor_gpus for m in models)
    need: list[int] = []
    top: list[float] = [0.0] * len(models)
    for k in range(config.horizon_slots):
        gpus = [
            math.ceil(a[k] - 1e-9) * m.gpus_per_replica for a, m in zip(ahead, models, strict=True)
        ]
        for j, g in enumerate(gpus):
            top[j] = max(top[j], g)
        need.append(max(floors, sum(gpus) - max(0, external_cap_gpus)))
    if all(n <= floors for n in need):
        return None  # the floors' replicas hold their GPUs already: nothing to foresee
    start = math.floor(now_s / config.bin_s) * config.bin_s
    peak_model = models[max(range(len(models)), key=lambda j: (top[j], models[j].name))].name
    return ServingForecast(start, config.bin_s, tuple(need), peak_model, config.idle_hold_s)


def duration(seconds: float) -> str:
    """``3h05m``, ``45m``, ``30s``: a wait or a run for a reason."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    h, m = divmod(round(s / 60), 60)
    return f"{h}h{m:02d}m" if h else f"{m}m"
