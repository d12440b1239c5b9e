"""Who may see and do what: the auth gate, API keys and scopes, per-tenant fair share, path redaction."""
