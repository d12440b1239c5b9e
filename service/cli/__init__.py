"""The ``rlvr`` command (main), its ``models`` subcommands, the HTTP client, the demo, doctor and serve."""
