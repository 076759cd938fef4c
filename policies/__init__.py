"""Pure decisions: admission and preemption, replica placement and migration pacing, node
health, demand autoscaling, checkpoint interval.

Nothing in this package imports Ray, does I/O, or reads a clock: time arrives as `now_s` in
the inputs, and every function returns its decision and its new state. The import-linter
contract in pyproject.toml enforces this in the test command.
"""
