"""Lyceum Cloud dialect (`/api/v2/external/...`)."""
