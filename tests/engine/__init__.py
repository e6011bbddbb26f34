"""Tests of the C transfer engine (automdt.transfer_engine)."""
