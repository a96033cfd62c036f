"""The bubblewrap backend (backend.py): sandboxes as process trees over read-only root filesystems, no daemon."""
