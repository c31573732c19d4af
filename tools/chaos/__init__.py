"""Chaos runs: real workers under faults, and a checker that proves nothing is lost."""
