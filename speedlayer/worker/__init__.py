"""The worker data plane (seed §3.6): the control agent and the loader into DuckDB."""
