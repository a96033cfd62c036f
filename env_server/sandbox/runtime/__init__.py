"""The code that runs inside every sandbox container (stdlib only, Python 3.9+), in one folder.

Every sandbox image bakes this folder in as /opt/tito (sandbox_images/python/Dockerfile; the other
images build on that one). `repl_server.py` is the container's main process; `repl_protocol.py`
declares every operation the server asks of it and is the one module the host imports too
(`env_server.sandbox.runtime.repl_protocol`); `repl_capture.py` caps output while it is produced and
routes each thread's writes; `repl_shell.py` is the session's persistent bash; `repl_files.py` the file
operations on the working directory; `repl_editor.py` the coding environment's editor; `repl_cells.py`
compiles a cell and formats its error; `repl_init.py` sets the rlimits and, where the REPL is pid 1 (bwrap),
forks it from its own init. Inside the
container the modules import each other as top-level modules.
"""
