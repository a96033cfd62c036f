"""tito: the client side of token-in, token-out tool environments (what trainers import).

`tito.types` is the typed vocabulary and `tito.wire` its only protobuf conversion; `tito.client`
talks to an env server (one, several replicas, blocking or asyncio); `tito.rollout` is a rollout's
state, the generation-backend protocol and the one turn rule; `tito.trl` plugs tito into TRL;
`tito.conformance` checks any server against the contract. `tito.v1` holds the gRPC stubs generated
from `protos/` (scripts/gen_protos.sh). Nothing here imports the server or the trainer.
"""
