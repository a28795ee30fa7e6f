"""Live alerts (docs/alerts.md): rules and channels, the evaluation pass, delivery."""
