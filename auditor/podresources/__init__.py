"""Client of the kubelet PodResources API (v1) and its wire-compatible proto."""

#: The kubelet's socket: ``<kubelet root-dir>/pod-resources/kubelet.sock`` with the default root directory.
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
