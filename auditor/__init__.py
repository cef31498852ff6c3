"""gpu-fence node auditor: compares what each container can see and use on the GPUs with its allocation."""
