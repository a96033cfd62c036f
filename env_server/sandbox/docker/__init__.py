"""The Docker backend (backend.py) and its parts: containers, labels, start-up steps, the socket channel."""
