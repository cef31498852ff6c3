"""gpu-fence admission webhook: pins NVIDIA_VISIBLE_DEVICES=void and rejects unallocated paths to GPUs."""
