"""What a live run writes: the run-record tables, the in-memory recorder and dashboards."""
