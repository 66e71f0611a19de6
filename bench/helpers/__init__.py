"""What study scripts share with each other and with the tests, being no study themselves: tiny checkpoints of every
MoE family, the reference greedy decode, checkpoints with routing ties, generated books and the German month-end.
The tests import them from here; nothing here imports the tests (tests/test_structure.py)."""
