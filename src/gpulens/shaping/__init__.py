"""Pure shaping of backend results: merge, align, aggregate."""
