"""pytest configuration. Shared test helpers live in tests/helpers.py (`import helpers`); the package itself is
pip-installed (`pip install -e .`), so nothing here touches sys.path."""
