"""The study: its config (schema, overrides, typed views, cross-key checks), the one loader, its plan and cost, and
what its design can detect."""
