"""Generated stubs of the kubelet PodResources v1 proto (``api.proto``); see ``auditor.podresources.regenerate``."""
