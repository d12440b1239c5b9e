"""A job from spec to status: checks and resolution, model catalog, uploaded files, stored verifiers, the
runner a worker calls, warnings from step records, response models."""
