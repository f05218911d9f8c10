"""What every layer shares: the error type meant for people (common/errors.py)."""
