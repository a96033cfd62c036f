"""tito from other RL engines: one module per framework (verl, AReaL, OpenEnv, slime), each importing its
framework only when used, and needing nothing of tito beyond the client (`pip install .`). docs/integrations.md
says how each is installed and configured."""
