"""Training sessions behind the Tinker-compatible primitives (service/api/tinker.py): tables, the queue
and leases (sessions), the protobuf wire format (codec), which models a session may use (models), the
session worker (worker), doorbells between API and worker (bell), and the reaper pass (reaper)."""
