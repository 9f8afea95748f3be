"""pytest configuration of tests/python: the flashattn package must be importable (CTest sets
PYTHONPATH to <build>/python; by hand: PYTHONPATH=build/release/python python3 -m pytest tests/python)."""
