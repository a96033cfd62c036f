"""tito.v1 protocol stubs, generated from protos/tito/v1/environment.proto."""
