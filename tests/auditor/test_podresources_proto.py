"""Our api.proto is wire-compatible with the kubelet's, and the committed stubs are generated from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from gpu_fence.auditor.podresources import regenerate
from gpu_fence.auditor.podresources.v1 import api_pb2

STRING, INT64, UINT64, MESSAGE = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_MESSAGE,
)

# Field numbers of the kubelet's own k8s.io/kubelet/pkg/apis/podresources/v1/api.proto.
KUBELET_FIELDS = [
    ("ListPodResourcesResponse", "pod_resources", 1, MESSAGE, True),
    ("PodResources", "name", 1, STRING, False),
    ("PodResources", "namespace", 2, STRING, False),
    ("PodResources", "containers", 3, MESSAGE, True),
    ("PodResources", "cpu_ids", 4, INT64, True),
    ("PodResources", "memory", 5, MESSAGE, True),
    ("ContainerResources", "name", 1, STRING, False),
    ("ContainerResources", "devices", 2, MESSAGE, True),
    ("ContainerResources", "cpu_ids", 3, INT64, True),
    ("ContainerResources", "memory", 4, MESSAGE, True),
    ("ContainerResources", "dynamic_resources", 5, MESSAGE, True),
    ("ContainerDevices", "resource_name", 1, STRING, False),
    ("ContainerDevices", "device_ids", 2, STRING, True),
    ("ContainerDevices", "topology", 3, MESSAGE, False),
    ("TopologyInfo", "nodes", 1, MESSAGE, True),
    ("NUMANode", "ID", 1, INT64, False),
    ("ContainerMemory", "memory_type", 1, STRING, False),
    ("ContainerMemory", "size", 2, UINT64, False),
    ("ContainerMemory", "topology", 3, MESSAGE, False),
    ("DynamicResource", "claim_name", 2, STRING, False),
    ("DynamicResource", "claim_namespace", 3, STRING, False),
    ("DynamicResource", "claim_resources", 4, MESSAGE, True),
    ("ClaimResource", "cdi_devices", 1, MESSAGE, True),
    ("ClaimResource", "driver_name", 2, STRING, False),
    ("ClaimResource", "pool_name", 3, STRING, False),
    ("ClaimResource", "device_name", 4, STRING, False),
    ("ClaimResource", "share_id", 5, STRING, False),
    ("CDIDevice", "name", 1, STRING, False),
    ("AllocatableResourcesResponse", "devices", 1, MESSAGE, True),
    ("AllocatableResourcesResponse", "cpu_ids", 2, INT64, True),
    ("AllocatableResourcesResponse", "memory", 3, MESSAGE, True),
    ("GetPodResourcesRequest", "pod_name", 1, STRING, False),
    ("GetPodResourcesRequest", "pod_namespace", 2, STRING, False),
    ("GetPodResourcesResponse", "pod_resources", 1, MESSAGE, False),
]


def _is_repeated(descriptor: FieldDescriptor) -> bool:
    if hasattr(descriptor, "is_repeated"):  # protobuf 6+; ``label`` is gone in 7
        return bool(descriptor.is_repeated)
    return descriptor.label == FieldDescriptor.LABEL_REPEATED


@pytest.mark.parametrize(("message", "field", "number", "kind", "repeated"), KUBELET_FIELDS)
def test_field_numbers_and_types_match_the_kubelet(
    message: str, field: str, number: int, kind: int, repeated: bool
) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert (descriptor.number, descriptor.type, _is_repeated(descriptor)) == (
        number,
        kind,
        repeated,
    )


def test_every_field_we_declare_is_in_the_kubelet_table() -> None:
    declared = {
        (message.name, field.name)
        for message in api_pb2.DESCRIPTOR.message_types_by_name.values()
        for field in message.fields
    }
    assert declared == {(message, field) for message, field, *_ in KUBELET_FIELDS}


def test_share_id_has_explicit_presence() -> None:
    resource = api_pb2.ClaimResource()
    assert not resource.HasField("share_id")
    resource.share_id = ""
    assert resource.HasField("share_id")


def test_service_and_method_paths() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert api_pb2.DESCRIPTOR.package == "v1"
    assert service.full_name == "v1.PodResourcesLister"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }


# --- the bytes themselves, read by a hand-written decoder that knows nothing of our descriptors ---------------


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field on the wire: varints as ints, length-delimited as bytes."""
    fields: list[tuple[int, int, int | bytes]] = []
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(data, position)
            fields.append((number, wire_type, value))
        elif wire_type == 2:
            length, position = _varint(data, position)
            fields.append((number, wire_type, data[position : position + length]))
            position += length
        else:
            raise AssertionError(f"unexpected wire type {wire_type}")
    return fields


def _payload(field: tuple[int, int, int | bytes]) -> bytes:
    value = field[2]
    assert isinstance(value, bytes), field
    return value


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _encode_varint(number << 3) + _encode_varint(payload)
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def test_serialized_list_response_uses_kubelet_tags() -> None:
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    api_pb2.ContainerResources(
                        name="c",
                        devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1::2"])],
                        cpu_ids=[3],
                        dynamic_resources=[
                            api_pb2.DynamicResource(
                                claim_name="claim",
                                claim_resources=[api_pb2.ClaimResource(pool_name="pool", device_name="gpu-0")],
                            )
                        ],
                    )
                ],
            )
        ]
    )
    top = _fields(response.SerializeToString())
    assert [(number, wire) for number, wire, _ in top] == [(1, 2)]
    pod = _fields(_payload(top[0]))
    assert pod[:2] == [(1, 2, b"p"), (2, 2, b"ns")]
    assert [(number, wire) for number, wire, _ in pod[2:]] == [(3, 2)]
    container = _fields(_payload(pod[2]))
    assert [(number, wire) for number, wire, _ in container] == [(1, 2), (2, 2), (3, 2), (5, 2)]
    assert container[0] == (1, 2, b"c")
    assert _fields(_payload(container[1])) == [(1, 2, b"nvidia.com/gpu"), (2, 2, b"GPU-1::2")]
    assert container[2] == (3, 2, b"\x03")  # packed repeated int64, proto3's default encoding
    dynamic = _fields(_payload(container[3]))
    assert dynamic[0] == (2, 2, b"claim")
    assert dynamic[1][0] == 4
    assert _fields(_payload(dynamic[1])) == [(3, 2, b"pool"), (4, 2, b"gpu-0")]


def test_kubelet_bytes_decode_including_unknown_and_removed_fields() -> None:
    """Bytes as a 1.27-1.30 kubelet writes them (DynamicResource field 1 = class_name) plus a field from the future."""
    claim_resource = _field(1, _field(1, b"nvidia.com/gpu=0")) + _field(2, b"gpu.nvidia.com") + _field(5, b"")
    dynamic = _field(1, b"gpu-class") + _field(2, b"claim") + _field(3, b"ns") + _field(4, claim_resource)
    devices = _field(1, b"nvidia.com/gpu") + _field(2, b"nvidia0/gi1/vgpu0") + _field(3, _field(1, _field(1, 1)))
    container = _field(1, b"main") + _field(2, devices) + _field(5, dynamic) + _field(99, b"future")
    wire = _field(1, _field(1, b"p") + _field(2, b"ns") + _field(3, container))

    decoded = api_pb2.ListPodResourcesResponse.FromString(wire)
    (got,) = decoded.pod_resources[0].containers
    assert got.name == "main"
    assert list(got.devices[0].device_ids) == ["nvidia0/gi1/vgpu0"]
    assert got.devices[0].topology.nodes[0].ID == 1
    claim = got.dynamic_resources[0]
    assert (claim.claim_name, claim.claim_namespace) == ("claim", "ns")
    assert claim.claim_resources[0].cdi_devices[0].name == "nvidia.com/gpu=0"
    assert claim.claim_resources[0].driver_name == "gpu.nvidia.com"
    assert claim.claim_resources[0].HasField("share_id")


# --- the committed stubs are what protoc makes of the committed proto ----------------------------------------------

_VERSION_LINES = re.compile(
    r"^# Protobuf Python Version:.*$|^GRPC_GENERATED_VERSION = .*$"
    r"|_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)",
    re.MULTILINE,
)


def _normalised(path: Path) -> str:
    return _VERSION_LINES.sub("<version>", path.read_text())


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    generated = regenerate.generate(tmp_path)
    assert [path.name for path in generated] == list(regenerate.GENERATED)
    for name in regenerate.GENERATED:
        assert _normalised(tmp_path / name) == _normalised(regenerate.STUB_DIR / name), (
            f"{name} is stale: run python -m gpu_fence.auditor.podresources.regenerate"
        )


def test_committed_descriptor_matches_the_proto(tmp_path: Path) -> None:
    """Independent of generator versions: the serialized descriptor protoc builds equals the one we load."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc  # a test dependency (grpcio-tools)

    out = tmp_path / "api.desc"
    root = regenerate.stage_proto(tmp_path / "src")
    status = protoc.main(
        [
            "protoc",
            f"--proto_path={root}",
            f"--proto_path={regenerate.well_known_types()}",
            f"--descriptor_set_out={out}",
            str(root / regenerate.PROTO),
        ]
    )
    assert status == 0
    built = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    for message in built.message_type:
        for field in message.field:
            field.ClearField("json_name")  # the Python generator leaves JSON names out of the embedded descriptor
    assert descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb) == built
