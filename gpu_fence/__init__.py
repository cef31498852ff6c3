"""Shared GPU vocabulary of gpu-fence, imported by both the webhook and the auditor.

Nothing in this package performs I/O or imports Flask, gRPC, NVML or the Kubernetes client.
"""
