"""Client of the kubelet PodResources API (v1) and its wire-compatible proto."""
