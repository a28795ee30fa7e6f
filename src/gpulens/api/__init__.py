"""HTTP layer: routes, wire schemas and error mapping for the Lyceum and Run:ai dialects."""
