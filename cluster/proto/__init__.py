"""Generated gRPC stubs for deploy/eagle_cluster.proto (do not edit; tests check they are current)."""
