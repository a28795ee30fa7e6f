"""Domain types shared by every layer: stdlib only."""
