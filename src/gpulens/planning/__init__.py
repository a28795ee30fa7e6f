"""Pure planning: catalog + query + execution -> range queries."""
