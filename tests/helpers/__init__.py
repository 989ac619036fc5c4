"""The code the test modules share (no test module imports another test module or
`conftest.py`): one module per topic, named after what it builds or checks."""
