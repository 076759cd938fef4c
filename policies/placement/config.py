"""Placement's config: the ``placement`` section's knobs (`MigrateBackConfig`) and the external
pool the caller derives from its pool config (`PlacementConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.providers import Provider


@dataclass(kw_only=True)
class MigrateBackConfig:
    """How replicas come back from the external pool (rule 5). The ``placement`` config
    section is this class, so each field and default is defined here only (not frozen for
    that reason: omegaconf makes a frozen dataclass a read-only node)."""

    migrate_back_idle_s: float = 60.0
    """The cluster pool must have room, with no queued training, this long before replicas
    come back from the external pool."""
    migrate_back_step: int = 1
    """Replicas that come back per step."""
    migrate_back_interval_s: float = 30.0
    """Seconds between steps back."""


@dataclass
class PlacementConfig(MigrateBackConfig):
    """The policy's whole config: the `MigrateBackConfig` knobs (keyword-only) and the
    external pool's size, which the caller derives from its pool config. Invalid values raise
    ValueError naming the field."""

    external_max_gpus: int
    """GPUs the external pool can have at most (the sum of its providers' max_gpus)."""
    external_deadline_s: float = 900.0
    """With no `providers`: the one implicit provider's delivery deadline (rule 6)."""
    external_backoff_s: float = 1800.0
    """With no `providers`: the one implicit provider's back-off (rule 6)."""
    providers: tuple[Provider, ...] = ()
    """Who rents the external pool's GPUs (`policies.providers`); none given: one provider,
    ``external``, of `external_max_gpus` at no price."""

    def __post_init__(self) -> None:
        if self.external_max_gpus < 0:
            raise ValueError("external_max_gpus must be >= 0")
        if not self.providers:
            self.providers = (
                Provider(
                    "external",
                    self.external_max_gpus,
                    0.0,
                    self.external_deadline_s,
                    self.external_backoff_s,
                ),
            )
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise ValueError(f"providers: names must be unique, got {names}")
        if sum(p.max_gpus for p in self.providers) != self.external_max_gpus:
            raise ValueError("external_max_gpus must be the sum of the providers' max_gpus")
        if self.migrate_back_step < 1:
            raise ValueError("migrate_back_step must be >= 1")
        if self.migrate_back_idle_s < 0 or self.migrate_back_interval_s < 0:
            raise ValueError("migrate_back_idle_s and migrate_back_interval_s must be >= 0")
