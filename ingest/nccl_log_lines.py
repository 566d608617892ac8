"""The line shapes of an NCCL debug log that :mod:`.nccl_log` reads (docs/formats.md, section 3, "NCCL debug log").

Each kind is a pair (marker, pattern): a literal that every line of the kind holds, by which
lines are picked before the pattern (a Rust regex, run by polars) matches them. The NCCL
versions that write each shape are listed in docs/formats.md.
"""

from __future__ import annotations

import re

#: What precedes every INFO message: an optional launcher prefix and timestamp, then ``host:pid:tid [cudaDev]``.
_LINE = (r"^(?:\[\d+,\d+\]<std(?:out|err)>:|[\w.-]+: )?(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)\] ?)?"
         r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO ")
#: Communicator init: ``[func ]comm 0x.. rank R nranks N cudaDev D [nvmlDev M] [busId B] [commId 0x..] - Init
#: COMPLETE`` (NCCL 2.4-2.6 print neither busId nor commId; 2.7-2.18 busId; 2.19+ commId too).
_INIT = ("Init COMPLETE",
         _LINE + r"(?:\w+ )?comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>\d+)"
         r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>\w+))?(?: commId (?P<commid>0x[0-9a-f]+))?")
_NODES = (" nNodes ",
          _LINE + r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nodes>\d+) "
          r"localRanks (?P<local_ranks>\d+) localRank (?P<local_rank>\d+)")
#: A connection: ``Ring 00 : 0 -> 1 [send] via NET/IB/0`` (2.4's NET: no device), ``Ring 00 : 0[1] -> 1[0] via
#: P2P/IPC`` (2.4), ``Channel 00 : 0[35000] -> 1[f5000] [receive] via NET/..`` (2.5-2.11: bus ids in hex),
#: ``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`` (2.12+: connection index, nvmlDev). The transport is the
#: rest of the line (``P2P/direct pointer/read``, ``NET/AWS Libfabric/0``).
_CHANNEL = (" via ",
            _LINE + r"(?:Channel|Ring) (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[(?P<srcdev>[0-9a-f]+)\])? -> "
            r"(?P<dst>\d+)(?:\[(?P<dstdev>[0-9a-f]+)\])? (?:\[(?P<direction>send|receive)\] )?"
            r"via (?P<transport>.*\S)")
#: Every COLL line holds it; no other kind's line does.
COLL_MARKER = " opCount "
_COLL = (COLL_MARKER,
         _LINE + r"(?P<op>\w+): opCount (?P<opcount>[0-9a-f]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
         r"datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>\d+) comm (?P<comm>0x[0-9a-f]+)"
         r"(?: \[nranks=(?P<nranks>\d+)\])? stream (?P<stream>0x[0-9a-f]+)")
_TUNING = (" Bytes -> Algo ",
           _LINE + r"(?P<op>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
           r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?")
#: The network devices NCCL will use: ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>``
#: (the link layer after the port: ``IB`` or ``RoCE``), ``NET/Socket : Using [0]eth0:10.0.0.1<0>``.
_NICS = ("NET/", _LINE + r"NET/(?P<net>\w[\w ]*?) ?: Using (?P<devices>\[\d+\].*)")
_WARN = ("NCCL WARN", r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] (?:\S+:\d+ )?(?:\(\w+\) )?NCCL WARN (?P<msg>.*)$")
_VERSION = re.compile(r"NCCL version (?P<version>[\w.+-]+)")

#: Init and topology lines read but not stored (each marker picks lines, ``_TOPOLOGY`` then checks them):
#: the ring order, trees, "Connected all ..", network choice, init start and timings, channel counts.
_TOPOLOGY_MARKERS = ("Channel ", "Ring ", "Trees ", "Connected all ", "Using ", "NET/", "Init START", "Init timings",
                     " coll channels", "Destroy COMPLETE", "Abort COMPLETE")
_TOPOLOGY = (_TOPOLOGY_MARKERS,
             _LINE + r"(?P<shape>(?:Channel|Ring) \d+(?:/\d+)? :(?:(?: ->)? +\d+)+ *$"
             r"|Trees(?: \[\d+\] [-\d/]+->\d+->[-\d/]+)+"
             r"|Connected all (?:rings|trees)"
             r"|Using network \S"
             r"|(?:\w+ )?comm 0x[0-9a-f]+ .*- (?:Init START|Destroy COMPLETE|Abort COMPLETE)"
             r"|Init timings"
             r"|\d+ coll channels)")

#: Every kind read, as (marker, pattern); a marker is a literal or a tuple of literals (any of them).
KINDS: dict[str, tuple[str | tuple[str, ...], str]] = {"init": _INIT, "nodes": _NODES, "channel": _CHANNEL, "coll": _COLL, "tuning": _TUNING, "nics": _NICS, "warn": _WARN,
         "topology": _TOPOLOGY}
#: Kinds only counted, never stored: their lines count as recognised.
COUNTED = frozenset({"topology"})
