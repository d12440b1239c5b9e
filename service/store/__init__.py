"""The one source of truth: every table, the job store (status rules, leases, reaper), live rows, migrations."""
