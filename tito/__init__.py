"""Generated gRPC stubs for the tito protocol (see protos/). Regenerate with scripts/gen_protos.sh."""
