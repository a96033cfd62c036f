"""The sandboxes' system-call filter: one allow-list (syscalls.py), compiled to BPF for bwrap (bpf.py) and
written as a seccomp profile for Docker (docker_profile.py)."""
