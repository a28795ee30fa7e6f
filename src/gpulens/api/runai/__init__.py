"""NVIDIA Run:ai dialect (`/api/v1/...`)."""
