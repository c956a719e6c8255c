"""The web console: a live dashboard (Starlette, server-sent events) with users, roles and approvals."""
