"""Sequencing of the stages; the only layer that calls storage, planning, backends and shaping."""
