"""The XSpace protobuf messages, declared from their field numbers (docs/formats.md, section 2).

No TensorFlow or generated code: the descriptors are built here as data and the
message classes come from protobuf's runtime (the upb C decoder). Only the fields
tracelake reads are declared; protobuf skips the rest. An ``XPlane`` is decoded in
two steps so that a large plane is never held whole as Python objects:
:class:`XPlaneHeader` declares every field but ``lines``, and each line is decoded
on its own from its bytes (see :mod:`tracelake.ingest.xplane`).

``HloProto`` is declared down to instruction names and opcodes, enough to classify
ops whose events carry no ``hlo_category``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {
    "int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64, "double": _F.TYPE_DOUBLE,
    "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "message": _F.TYPE_MESSAGE,
}

#: message -> (field name, number, type, repeated, message type); maps are repeated entry messages.
MESSAGES: dict[str, list[tuple[str, int, str, bool, str | None]]] = {
    "XSpace": [
        ("planes", 1, "bytes", True, None),  # decoded one at a time, see XPlaneHeader
        ("errors", 2, "string", True, None),
        ("warnings", 3, "string", True, None),
        ("hostnames", 4, "string", True, None),
    ],
    "XPlaneHeader": [
        ("id", 1, "int64", False, None),
        ("name", 2, "string", False, None),
        ("event_metadata", 4, "message", True, "XPlaneHeader.EventMetadataEntry"),
        ("stat_metadata", 5, "message", True, "XPlaneHeader.StatMetadataEntry"),
        ("stats", 6, "message", True, "XStat"),
    ],
    "XPlane": [  # the whole plane, for tools that want it in one piece (tracelake itself never does)
        ("id", 1, "int64", False, None),
        ("name", 2, "string", False, None),
        ("lines", 3, "message", True, "XLine"),
        ("event_metadata", 4, "message", True, "XPlane.EventMetadataEntry"),
        ("stat_metadata", 5, "message", True, "XPlane.StatMetadataEntry"),
        ("stats", 6, "message", True, "XStat"),
    ],
    "XPlane.EventMetadataEntry": [("key", 1, "int64", False, None), ("value", 2, "message", False, "XEventMetadata")],
    "XPlane.StatMetadataEntry": [("key", 1, "int64", False, None), ("value", 2, "message", False, "XStatMetadata")],
    "XSpaceWhole": [("planes", 1, "message", True, "XPlane"), ("hostnames", 4, "string", True, None)],
    "XPlaneHeader.EventMetadataEntry": [("key", 1, "int64", False, None), ("value", 2, "message", False, "XEventMetadata")],
    "XPlaneHeader.StatMetadataEntry": [("key", 1, "int64", False, None), ("value", 2, "message", False, "XStatMetadata")],
    "XLine": [
        ("id", 1, "int64", False, None),
        ("name", 2, "string", False, None),
        ("timestamp_ns", 3, "int64", False, None),
        ("events", 4, "message", True, "XEvent"),
        ("duration_ps", 9, "int64", False, None),
        ("display_id", 10, "int64", False, None),
        ("display_name", 11, "string", False, None),
    ],
    "XEvent": [
        ("metadata_id", 1, "int64", False, None),
        ("offset_ps", 2, "int64", False, None),
        ("duration_ps", 3, "int64", False, None),
        ("stats", 4, "message", True, "XStat"),
        ("num_occurrences", 5, "int64", False, None),
    ],
    "XStat": [
        ("metadata_id", 1, "int64", False, None),
        ("double_value", 2, "double", False, None),
        ("uint64_value", 3, "uint64", False, None),
        ("int64_value", 4, "int64", False, None),
        ("str_value", 5, "string", False, None),
        ("bytes_value", 6, "bytes", False, None),
        ("ref_value", 7, "uint64", False, None),
    ],
    "XEventMetadata": [
        ("id", 1, "int64", False, None),
        ("name", 2, "string", False, None),
        ("metadata", 3, "bytes", False, None),
        ("display_name", 4, "string", False, None),
        ("stats", 5, "message", True, "XStat"),
        ("child_id", 6, "int64", True, None),
    ],
    "XStatMetadata": [
        ("id", 1, "int64", False, None),
        ("name", 2, "string", False, None),
        ("description", 3, "string", False, None),
    ],
    "HloProto": [("hlo_module", 1, "message", False, "HloModuleProto")],
    "HloModuleProto": [
        ("name", 1, "string", False, None),
        ("computations", 3, "message", True, "HloComputationProto"),
    ],
    "HloComputationProto": [
        ("name", 1, "string", False, None),
        ("instructions", 2, "message", True, "HloInstructionProto"),
    ],
    "HloInstructionProto": [
        ("name", 1, "string", False, None),
        ("opcode", 2, "string", False, None),
    ],
}

# XStat's value is a oneof; keep it one so that HasField/WhichOneof work.
_ONEOFS: dict[str, tuple[str, set[str]]] = {"XStat": ("value", {"double_value", "uint64_value", "int64_value", "str_value", "bytes_value", "ref_value"}),
           "XEvent": ("data", {"offset_ps", "num_occurrences"})}
_PACKAGE = "tracelake.xplane"


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="tracelake/xplane.proto", package=_PACKAGE, syntax="proto3")
    declared: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name, fields in MESSAGES.items():
        outer, _, inner = full_name.partition(".")
        if inner:
            message = declared[outer].nested_type.add(name=inner)
            message.options.map_entry = True
        else:
            message = proto.message_type.add(name=outer)
        declared[full_name] = message
        oneof = _ONEOFS.get(full_name)
        if oneof:
            message.oneof_decl.add(name=oneof[0])
        for name, number, kind, repeated, type_name in fields:
            field = message.field.add(name=name, number=number, type=_TYPES[kind])
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if type_name is not None:
                field.type_name = f".{_PACKAGE}.{type_name}"
            if oneof and name in oneof[1]:
                field.oneof_index = 0
    return proto


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in MESSAGES if "." not in name}


# Message classes made at run time: typed Any (they have no stubs).
_CLASSES = _build()
XSpace: Any = _CLASSES["XSpace"]
XPlaneHeader: Any = _CLASSES["XPlaneHeader"]
XLine: Any = _CLASSES["XLine"]
XEvent: Any = _CLASSES["XEvent"]
XStat: Any = _CLASSES["XStat"]
XEventMetadata: Any = _CLASSES["XEventMetadata"]
XStatMetadata: Any = _CLASSES["XStatMetadata"]
HloProto: Any = _CLASSES["HloProto"]
#: The whole XSpace in one message (the naive way to read a profile; see benchmarks/ingest_xla.py).
XSpaceWhole: Any = _CLASSES["XSpaceWhole"]
