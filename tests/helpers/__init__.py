"""What several test modules share besides fixtures (those are in tests/conftest.py): builders of tiny models and
stores, a service to talk to, waits on conditions, reference implementations. A test module imports from here,
never from another test module (tests/test_structure.py checks it)."""
