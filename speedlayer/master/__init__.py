"""The master's business logic (seed §11 `internal/master`): admission, quotas, placement, leadership."""
