"""Decisions and their execution: the policy engine, scheduler drivers, the audit log."""
