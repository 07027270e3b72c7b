"""Cross-cutting platform services (seed §11 `internal/platform/observability`): audit, metrics, logs."""
