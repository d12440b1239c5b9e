"""Rollout engines that need optional extras (imported lazily through ``trainer.rollout.ENGINES``)."""
