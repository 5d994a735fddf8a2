"""rosbag2 files (MCAP storage) for LRTrace, written and read with `rosbags`.

- `BagWriter`: an incremental, thread-safe writer. Every message goes to the file as it is
  written (the pending MCAP chunk is flushed at least every `flush_interval_s`), and `close()`
  writes the MCAP summary and `metadata.yaml`, which is what makes the bag readable.
- `read_messages`: a strict reader; a corrupt or truncated bag raises `BagError` naming the file,
  the byte offset or message, and the reason. `salvage=True` instead keeps every message before
  the damage (a recorder killed with SIGKILL leaves such a file).

The message types, their conversion from and to rclpy, CDR serialisation and QoS profiles are
in `lrtrace.message_types`.

Nothing here imports rclpy at module level: reading bags, building tables and fitting work
without ROS.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from timelyllm_ros.lrtrace.message_types import (default_qos, msgtype_of, serialize,
                                                 standard_store_id, typestore)

# rosbag2 metadata version written (rosbag2 in Jazzy and Kilted writes and reads 9).
BAG_VERSION = 9
# The pending MCAP chunk is written to the file at least this often, so a recorder that is
# killed hard (SIGKILL, power loss) loses at most this much; see read_messages(salvage=True).
FLUSH_INTERVAL_S = 0.5


class BagError(ValueError):
    """A bag that cannot be written or read; the message names the file, where, and why."""

    def __init__(self, path: str | os.PathLike, where: str, reason: str):
        super().__init__(f"{path}: {where}: {reason}" if where else f"{path}: {reason}")
        self.path = str(path)
        self.where = where
        self.reason = reason


# --- writing ------------------------------------------------------------------------------------

def bag_output_paths(output: str | os.PathLike) -> tuple[Path, Path]:
    """(bag directory, .mcap file) for `-o`: `run.mcap` -> run/run.mcap; `run` -> run/run.mcap.

    rosbag2 bags are directories (the storage file plus metadata.yaml); `-o run.mcap` names the
    recording the way people say it and the directory drops the suffix.
    """
    out = Path(output)
    bag_dir = out.with_suffix("") if out.suffix == ".mcap" else out
    return bag_dir, bag_dir / f"{bag_dir.name}.mcap"


class BagWriter:
    """rosbag2 (MCAP) writer that is safe to call from several threads and never loses what it
    accepted: `write` returns only once the message is in the writer, the pending chunk is
    flushed to the file at least every `flush_interval_s`, and `close` (idempotent) writes the
    summary and metadata.yaml."""

    def __init__(self, output: str | os.PathLike, *, store=None,
                 flush_interval_s: float = FLUSH_INTERVAL_S):
        from rosbags.rosbag2 import StoragePlugin, Writer, WriterError

        self.store = store or typestore()
        self.bag_dir, self.mcap_path = bag_output_paths(output)
        if self.bag_dir.exists():
            raise BagError(self.bag_dir, "", "already exists; choose another output or remove it")
        self.bag_dir.parent.mkdir(parents=True, exist_ok=True)
        self._writer = Writer(self.bag_dir, version=BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
        try:
            self._writer.open()
        except (WriterError, OSError) as err:
            raise BagError(self.bag_dir, "", f"cannot create bag: {err}") from None
        self._lock = threading.Lock()
        self._connections: dict[str, Any] = {}
        self._msgtypes: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._flush_interval = flush_interval_s
        self._last_flush = time.monotonic()
        self._dirty = False
        self.closed = False

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def add_topic(self, topic: str, msgtype: str, qos: Any | Sequence[Any] | None = None) -> None:
        """Register a topic (idempotent). `qos`: rosbags Qos profile(s) offered on the topic."""
        with self._lock:
            self._add_topic_locked(topic, msgtype, qos)

    def _add_topic_locked(self, topic: str, msgtype: str, qos: Any) -> None:
        if self.closed:
            raise BagError(self.bag_dir, topic, "bag is closed")
        if topic in self._connections:
            if self._msgtypes[topic] != msgtype:
                raise BagError(self.bag_dir, topic,
                               f"already recorded as {self._msgtypes[topic]}, not {msgtype}")
            return
        if qos is None:
            qos = default_qos(msgtype)
        profiles = list(qos) if isinstance(qos, (list, tuple)) and qos and not hasattr(qos, "depth") else [qos]
        self._connections[topic] = self._writer.add_connection(
            topic, msgtype, typestore=self.store, offered_qos_profiles=profiles)
        self._msgtypes[topic] = msgtype
        self.counts[topic] = 0

    def write(self, topic: str, msg: Any, timestamp_ns: int | None = None, *,
              msgtype: str | None = None) -> int:
        """Serialize and write one message (rclpy message or typestore dataclass); returns the
        total number of messages written so far."""
        msgtype = msgtype or msgtype_of(msg)
        raw = serialize(msg, msgtype, self.store)
        return self.write_raw(topic, msgtype, raw, timestamp_ns)

    def write_raw(self, topic: str, msgtype: str, raw: bytes, timestamp_ns: int | None = None) -> int:
        ts = time.time_ns() if timestamp_ns is None else int(timestamp_ns)
        with self._lock:
            if topic not in self._connections:
                self._add_topic_locked(topic, msgtype, None)
            elif self._msgtypes[topic] != msgtype:
                raise BagError(self.bag_dir, topic, f"recorded as {self._msgtypes[topic]}, got {msgtype}")
            if self.closed:
                raise BagError(self.bag_dir, topic, "bag is closed")
            self._writer.write(self._connections[topic], ts, raw)
            self.counts[topic] += 1
            self._dirty = True
            if time.monotonic() - self._last_flush >= self._flush_interval:
                self._flush_locked()
            return sum(self.counts.values())

    def flush(self) -> None:
        """Put the pending chunk (every message written so far) into the file."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self._last_flush = time.monotonic()
        if self.closed or not self._dirty:
            return
        storage = self._writer.storage
        # rosbags' MCAP storage keeps messages in an in-memory chunk until it reaches 1 MiB;
        # closing it early only makes chunks smaller, the file layout stays standard.
        close_chunk = getattr(storage, "close_chunk", None)
        if close_chunk is not None and storage.chunk.bio.tell():
            close_chunk()
        bio = getattr(storage, "bio", None)
        if bio is not None:
            bio.flush()
        self._dirty = False

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._writer.close()

    def __enter__(self) -> "BagWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- reading ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BagMessage:
    index: int  # position in the bag, in log-time order
    topic: str
    msgtype: str
    timestamp_ns: int
    msg: Any  # typestore dataclass


@dataclass
class BagContents:
    path: Path
    messages: list[BagMessage]
    topics: dict[str, tuple[str, int]]  # topic -> (msgtype, message count)
    salvaged_error: str | None = None  # set when salvage=True stopped at damage


def resolve_bag(path: str | os.PathLike) -> Path:
    """A bag directory (with metadata.yaml), a .mcap file, or the `-o` name given to `record`."""
    p = Path(path)
    if p.is_dir():
        if (p / "metadata.yaml").is_file():
            return p
        mcaps = sorted(p.glob("*.mcap"))
        if len(mcaps) == 1:
            return mcaps[0]
        raise BagError(p, "", "not a rosbag2 directory (no metadata.yaml"
                       + (f", {len(mcaps)} .mcap files)" if mcaps else ", no .mcap file)"))
    if p.is_file():
        if p.parent.is_dir() and (p.parent / "metadata.yaml").is_file() and p.suffix == ".mcap":
            return p.parent
        return p
    bag_dir, _ = bag_output_paths(p)
    if bag_dir != p and bag_dir.is_dir():
        return resolve_bag(bag_dir)
    raise BagError(p, "", "no such bag (file or directory)")


def _storage_file(resolved: Path) -> Path:
    if resolved.is_dir():
        mcaps = sorted(resolved.glob("*.mcap"))
        if not mcaps:
            raise BagError(resolved, "", "no .mcap storage file in the bag directory")
        return mcaps[0]
    return resolved


def read_messages(path: str | os.PathLike, topics: Iterable[str] | None = None, *,
                  salvage: bool = False) -> BagContents:
    """Every message of a bag, deserialized with the definitions stored in the bag.

    Strict by default: any damage raises BagError with the byte offset / message and a hint.
    `salvage=True` reads the MCAP records in file order and keeps what precedes the damage.
    """
    resolved = resolve_bag(path)
    wanted = set(topics) if topics is not None else None
    if salvage:
        return _salvage(resolved, wanted)
    from rosbags.highlevel import AnyReader, AnyReaderError
    from rosbags.rosbag2 import ReaderError
    from rosbags.serde import SerdeError

    storage = _storage_file(resolved)
    _check_magic(storage)
    hint = "the bag is corrupt or truncated (a recorder that was killed?); " \
           "--salvage keeps the messages before the damage"
    messages: list[BagMessage] = []
    try:
        with AnyReader([resolved], default_typestore=typestore()) as reader:
            conns = [c for c in reader.connections if wanted is None or c.topic in wanted]
            topic_info = {c.topic: (c.msgtype, 0) for c in reader.connections}
            counts: dict[str, int] = {}
            stream = reader.messages(connections=conns) if conns else iter(())
            for i, (conn, ts, raw) in enumerate(stream):
                try:
                    msg = reader.deserialize(raw, conn.msgtype)
                except (AnyReaderError, SerdeError, struct.error, ValueError, UnicodeDecodeError) as err:
                    raise BagError(storage, f"message {i} on {conn.topic} at t={ts / 1e9:.6f}",
                                   f"cannot deserialize as {conn.msgtype}: {err}") from None
                messages.append(BagMessage(i, conn.topic, conn.msgtype, ts, msg))
                counts[conn.topic] = counts.get(conn.topic, 0) + 1
            for t, (mt, _) in topic_info.items():
                topic_info[t] = (mt, counts.get(t, 0))
    except BagError:
        raise
    except (AnyReaderError, ReaderError, SerdeError, struct.error, KeyError, ValueError, EOFError,
            OSError, UnicodeDecodeError, AssertionError) as err:
        where, detail = _locate_damage(storage, err)
        raise BagError(resolved if where == "metadata.yaml" else storage, where,
                       f"{detail}; {hint}") from None
    return BagContents(resolved, messages, topic_info)


def _locate_damage(storage: Path, err: Exception) -> tuple[str, str]:
    """Where a bag that rosbags refused is damaged: scan its records in file order."""
    import re

    reason = (str(err) or type(err).__name__).rstrip(".")
    if "metadata" in reason.lower() and "yaml" in reason.lower():
        return "metadata.yaml", reason
    size = storage.stat().st_size if storage.exists() else 0
    scanned = _scan_records(storage)
    if scanned is not None:
        offset, n_messages, scan_error = scanned
        return (f"byte {offset}",
                f"{reason} ({scan_error}; file is {size} bytes, {n_messages} messages readable before the damage)")
    m = re.search(r"offset (\d+)", reason)
    if m:
        return f"byte {m.group(1)}", reason
    if "end magic" in reason:
        return f"byte {max(size - 8, 0)}", f"{reason} (file is {size} bytes: the MCAP footer is missing)"
    return "reading", reason


def _scan_records(storage: Path) -> tuple[int, int, str] | None:
    """(offset of the first bad record, messages before it, what is wrong), or None if the
    records scan cleanly."""
    from mcap.records import Message
    from mcap.stream_reader import StreamReader

    n = 0
    with storage.open("rb") as fh:
        reader = StreamReader(fh, record_size_limit=1 << 30)
        good = 8  # end of the last record read completely (after the magic)
        try:
            for record in reader.records:
                if isinstance(record, Message):
                    n += 1
                good = _stream_offset(reader, fh)
        except Exception as scan_err:  # noqa: BLE001 - any damage is reported with its offset
            return good, n, _describe_scan_error(scan_err)
    return None


def _stream_offset(reader: Any, fh: Any) -> int:
    stream = getattr(reader, "_stream", None)
    count = getattr(stream, "count", None)
    return int(count) if isinstance(count, int) else fh.tell()


def _describe_scan_error(err: Exception) -> str:
    if type(err).__name__ == "EndOfFile" or isinstance(err, struct.error):
        return "truncated: the record starting here runs past the end of the file"
    return f"{type(err).__name__}: {err}".rstrip(": ")


def _check_magic(storage: Path) -> None:
    try:
        with storage.open("rb") as fh:
            head = fh.read(8)
    except OSError as err:
        raise BagError(storage, "", f"cannot read: {err}") from None
    if storage.suffix == ".mcap" and head != b"\x89MCAP0\r\n":
        raise BagError(storage, "byte 0", f"not an MCAP file (magic is {head[:8]!r}, "
                       "expected b'\\x89MCAP0\\r\\n')")


def _salvage(resolved: Path, wanted: set[str] | None) -> BagContents:
    from mcap.records import Channel, Message, Schema
    from mcap.stream_reader import StreamReader
    from rosbags.typesys import get_types_from_msg, get_typestore

    storage = _storage_file(resolved)
    _check_magic(storage)
    schemas: dict[int, Any] = {}
    channels: dict[int, Any] = {}
    raw_msgs: list[tuple[int, int, bytes]] = []
    error = None
    with storage.open("rb") as fh:
        reader = StreamReader(fh, record_size_limit=1 << 30)
        good = 8
        try:
            for record in reader.records:
                if isinstance(record, Schema):
                    schemas[record.id] = record
                elif isinstance(record, Channel):
                    channels[record.id] = record
                elif isinstance(record, Message):
                    raw_msgs.append((record.log_time, record.channel_id, record.data))
                good = _stream_offset(reader, fh)
        except Exception as err:  # noqa: BLE001 - any damage ends the salvage; the rest is kept
            error = f"byte {good}: {_describe_scan_error(err)}"
    store = get_typestore(standard_store_id())
    types: dict = {}
    for s in schemas.values():
        if s.encoding == "ros2msg":
            types.update(get_types_from_msg(s.data.decode("utf-8"), s.name))
    try:
        store.register(types)
    except Exception:
        store = typestore()
    topic_info: dict[str, tuple[str, int]] = {}
    messages: list[BagMessage] = []
    for ts, cid, data in sorted(raw_msgs, key=lambda m: m[0]):
        ch = channels.get(cid)
        if ch is None:
            continue
        mt = schemas[ch.schema_id].name if ch.schema_id in schemas else "?"
        if wanted is not None and ch.topic not in wanted:
            continue
        try:
            msg = store.deserialize_cdr(data, mt)
        except Exception as err:
            error = error or f"message at t={ts / 1e9:.6f} on {ch.topic}: {err}"
            continue
        messages.append(BagMessage(len(messages), ch.topic, mt, ts, msg))
        count = topic_info.get(ch.topic, (mt, 0))[1]
        topic_info[ch.topic] = (mt, count + 1)
    for ch in channels.values():
        topic_info.setdefault(ch.topic, (schemas[ch.schema_id].name if ch.schema_id in schemas else "?", 0))
    return BagContents(resolved, messages, topic_info, salvaged_error=error)
