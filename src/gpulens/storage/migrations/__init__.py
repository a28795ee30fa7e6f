"""Alembic migrations of the registry schema (run by `Registry.migrate()`)."""
