"""Autoscaling: the pure policy (how many executors for this lag and rate), its simulation, and the
controller that asks Spark for executors (draining first where the runtime must)."""
