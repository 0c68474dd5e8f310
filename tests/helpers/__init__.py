"""What several test folders share: float64 references (reference.py), model and input builders,
and the pytest plugins scripts/ load by name (lsan.py, cuda_isolation.py)."""
