"""Persistence: the registry of orgs, API keys and executions (SQLAlchemy 2; SQLite or PostgreSQL)."""
