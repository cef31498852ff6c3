"""What both deployables share: the GPU vocabulary and the conventions of their command lines and logs.

The vocabulary modules (``vocabulary``, ``kai``, ``verdicts``, ``warning_text``) are pure: no I/O, and no import of
Flask, gRPC, NVML or the Kubernetes client. ``exit_status``, ``command_line``, ``version`` and ``logs`` hold the
command lines' exit statuses, their shared parser and ``main``, the package version, and the JSON-lines log shape;
``kubeconfig`` finds the Kubernetes client's configuration and imports the client inside its one function only.
``docs/layout.md`` says where everything else lives.
"""
