"""Front door 3, ``/api/v1``: the training primitives in the Tinker SDK's protocol — the router (routes), the
queue and leases of sessions (sessions), the protobuf wire format (codec), request models (schemas), which
models a session may use (models), the session worker (worker), doorbells between API and worker (bell),
and the reaper pass (reaper)."""
