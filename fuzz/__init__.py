"""Fuzzing tracekit with mutated real runs: mutate.py makes cases, oracle.py judges them,
run.py runs thousands (tests/test_fuzz.py runs a few with hypothesis)."""
