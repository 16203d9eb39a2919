"""The gRPC transport: the KServe v2 GRPCInferenceService over the data plane."""
