"""Blocked clients and flapping detection: the decisions, sans-IO (no sockets, no database).

A :class:`Block` refuses every CONNECT it matches before its credentials are checked
(CONNACK 0x8A Banned, MQTT 5.0 3.2.2.2; v3.1.1: return code 0x05 Not authorized). It names
one of four things (:class:`BlockKind`):

- ``client_id``: a Client Identifier, exactly (MQTT 5.0 3.1.3.1);
- ``username``: a User Name, exactly (3.1.3.5);
- ``address``: a source IP address or a CIDR network (the PROXY header's source behind a
  load balancer), kept normalised (``10.1.2.3`` is ``10.1.2.3/32``);
- ``client_id_regex``: a regular expression the whole Client Identifier must match
  (``fullmatch``: ``sensor-.*`` blocks ``sensor-1`` but not ``my-sensor-1``).

Each has an optional expiry (Unix ms) and a reason. :class:`BlockList` answers "which
block, if any, refuses this CONNECT" in a few dictionary lookups (one per distinct CIDR
prefix length) plus one match per regular expression. Regular expressions come from the
operator but run over what the client sends, so each match is bounded by
:data:`REGEX_TIMEOUT_SECONDS` (the ``regex`` library's timeout); a match that times out
counts as blocked (refuse rather than guess).

:class:`FlapDetector` counts each Client Identifier's CONNECTs in a sliding window; a client
that connects more than ``max_connects`` times in ``window_seconds`` gets a block of its own
for ``block_seconds`` (:class:`ConnectGate`). The stores and the shells live elsewhere
(:mod:`.blocked_store`, :mod:`services.ingest.node`).
"""

from __future__ import annotations

import enum
import ipaddress
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import regex

MAX_VALUE_BYTES = 1024
"""The longest client id, user name, address or expression a block may name (UTF-8 bytes)."""

MAX_REASON_BYTES = 1024
"""The longest reason (UTF-8 bytes)."""

REGEX_TIMEOUT_SECONDS = 0.01
"""The longest one regular expression may run over one Client Identifier."""

MAX_TRACKED_CLIENTS = 100_000
"""Client ids whose recent CONNECTs the flapping detector remembers (oldest dropped first)."""

FLAPPING_CREATOR = "flapping detection"
"""``created_by`` of the blocks flapping detection makes."""


class BlockError(ValueError):
    """A block that cannot be: an unknown kind, an invalid address, network or regular
    expression, a value or reason too long, an expiry in the past."""


class BlockKind(enum.StrEnum):
    """What a block names (see the module)."""

    CLIENT_ID = "client_id"
    USERNAME = "username"
    ADDRESS = "address"
    CLIENT_ID_REGEX = "client_id_regex"


def normalize(kind: BlockKind, value: str) -> str:
    """``value`` as a block of ``kind`` keeps it: an address as its network
    (``10.1.2.3`` → ``10.1.2.3/32``, host bits cleared: ``10.1.2.3/8`` → ``10.0.0.0/8``),
    anything else as given.

    Raises :class:`BlockError` for an empty or too long value, an invalid address or
    network, or a regular expression that does not compile.
    """
    if not value:
        raise BlockError(f"a {kind.value} block needs a value")
    if "\x00" in value:
        raise BlockError("a block's value may not contain U+0000")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
        raise BlockError(f"a block's value is at most {MAX_VALUE_BYTES} bytes")
    if kind is BlockKind.ADDRESS:
        try:
            network = ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            raise BlockError(f"{value!r} is not an IP address or CIDR network") from None
        return str(_unmapped_network(network))
    if kind is BlockKind.CLIENT_ID_REGEX:
        try:
            regex.compile(value)
        except regex.error as exc:
            raise BlockError(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


def check_reason(reason: str) -> str:
    """``reason`` if it may be stored; raises :class:`BlockError` when too long."""
    if len(reason.encode("utf-8", "surrogatepass")) > MAX_REASON_BYTES:
        raise BlockError(f"a block's reason is at most {MAX_REASON_BYTES} bytes")
    return reason


def _unmapped_network(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An IPv4-mapped IPv6 network (``::ffff:10.0.0.0/104``) as the IPv4 one it maps."""
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.IPv4Network(f"{mapped}/{network.prefixlen - 96}")
    return network


def host_of(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address of a peer written ``host:port`` or ``[host]:port`` (an IPv4-mapped
    IPv6 address as its IPv4 one); None when there is none (``""``, a Unix socket)."""
    host = address
    if address.startswith("["):
        host = address[1 : address.find("]")]
    elif address.count(":") == 1:
        host = address.rsplit(":", 1)[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True, slots=True)
class Block:
    """One blocked client id, user name, address/network or client id expression.

    ``value`` is normalised (:func:`normalize`); ``expires_at_ms`` is Unix ms (None: until
    deleted); ``created_at_ms`` Unix ms; ``created_by`` the administrator (or
    :data:`FLAPPING_CREATOR`).
    """

    id: uuid.UUID
    kind: BlockKind
    value: str
    reason: str = ""
    expires_at_ms: int | None = None
    created_at_ms: int = 0
    created_by: str = ""

    def expired(self, now_ms: int) -> bool:
        """Whether the block no longer applies at ``now_ms`` (Unix ms)."""
        return self.expires_at_ms is not None and self.expires_at_ms <= now_ms

    def describe(self) -> str:
        """The block for the log: kind, value and reason (never shown to the client)."""
        reason = f" ({self.reason})" if self.reason else ""
        return f"blocked by {self.kind.value} {self.value!r}{reason}"


class BlockList:
    """The blocks in force, indexed for the CONNECT path (see the module). Immutable:
    a change of the blocks builds a new one."""

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        self._client_ids: dict[str, Block] = {}
        self._usernames: dict[str, Block] = {}
        # prefix length → network → block
        self._networks: dict[int, dict[ipaddress.IPv4Network | ipaddress.IPv6Network, Block]] = {}
        self._patterns: list[tuple[regex.Pattern[str], Block]] = []
        self._count = 0
        for block in blocks:
            self._count += 1
            if block.kind is BlockKind.CLIENT_ID:
                self._client_ids[block.value] = block
            elif block.kind is BlockKind.USERNAME:
                self._usernames[block.value] = block
            elif block.kind is BlockKind.ADDRESS:
                network = ipaddress.ip_network(block.value, strict=False)
                self._networks.setdefault(network.prefixlen, {})[network] = block
            else:
                self._patterns.append((regex.compile(block.value), block))

    def __len__(self) -> int:
        return self._count

    def blocks(self) -> list[Block]:
        """Every block of the list."""
        networks = [b for by_net in self._networks.values() for b in by_net.values()]
        patterns = [b for _, b in self._patterns]
        return [*self._client_ids.values(), *self._usernames.values(), *networks, *patterns]

    def match(
        self, client_id: str, username: str | None, address: str, now_ms: int
    ) -> Block | None:
        """The block that refuses a CONNECT with ``client_id``, ``username`` (None: the
        CONNECT has none) from peer ``address`` (``host:port``; see :func:`host_of`) at
        ``now_ms`` (Unix ms), or None. Expired blocks refuse nothing."""
        found = self._client_ids.get(client_id)
        if found is None and username is not None:
            found = self._usernames.get(username)
        if found is None and self._networks:
            found = self._address(address)
        if found is None:
            found = self._pattern(client_id)
        if found is not None and found.expired(now_ms):
            return self._unexpired(client_id, username, address, now_ms)
        return found

    def _unexpired(
        self, client_id: str, username: str | None, address: str, now_ms: int
    ) -> Block | None:
        # Rare (an expired block not yet dropped by a reload): check every block in force.
        live = [b for b in self.blocks() if not b.expired(now_ms)]
        return BlockList(live).match(client_id, username, address, now_ms)

    def _address(self, address: str) -> Block | None:
        host = host_of(address)
        if host is None:
            return None
        for prefix, networks in self._networks.items():
            if prefix > host.max_prefixlen:
                continue
            network = ipaddress.ip_network(f"{host}/{prefix}", strict=False)
            found = networks.get(network)
            if found is not None:
                return found
        return None

    def _pattern(self, client_id: str) -> Block | None:
        for pattern, block in self._patterns:
            try:
                if pattern.fullmatch(client_id, timeout=REGEX_TIMEOUT_SECONDS) is not None:
                    return block
            except TimeoutError:
                return block  # cannot tell in time: refused rather than let in
        return None


@dataclass(frozen=True, slots=True)
class FlappingSettings:
    """Flapping detection: more than ``max_connects`` CONNECTs of one Client Identifier
    within ``window_seconds`` block it for ``block_seconds``."""

    max_connects: int
    window_seconds: float
    block_seconds: float


class FlapDetector:
    """The recent CONNECTs of each Client Identifier (at most :data:`MAX_TRACKED_CLIENTS`
    client ids, the least recently seen dropped first), against ``settings``."""

    def __init__(self, settings: FlappingSettings, max_clients: int = MAX_TRACKED_CLIENTS) -> None:
        self.settings = settings
        self._max_clients = max_clients
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def connected(self, client_id: str, now: float) -> bool:
        """Note a CONNECT of ``client_id`` at ``now`` (seconds, monotonic); True when it is
        one too many: more than ``max_connects`` within the last ``window_seconds``
        (the window's history is then forgotten, so the next count starts afresh)."""
        settings = self.settings
        times = self._seen.get(client_id)
        if times is None:
            times = deque(maxlen=settings.max_connects + 1)
            self._seen[client_id] = times
            if len(self._seen) > self._max_clients:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(client_id)
        times.append(now)
        if len(times) > settings.max_connects and now - times[0] <= settings.window_seconds:
            del self._seen[client_id]
            return True
        return False


@dataclass(frozen=True, slots=True)
class Verdict:
    """A refused CONNECT: the ``block`` that refuses it, and whether it is ``new`` (made
    by flapping detection just now: the shell stores it so every node refuses the client)."""

    block: Block
    new: bool = False


class ConnectGate:
    """What an ingest node asks at each CONNECT, before the credentials: the blocks in
    force (:attr:`blocks`, replaced whenever the stored ones change) and, when
    ``flapping`` is given, flapping detection, whose blocks apply on this node at once
    (kept until they expire) and everywhere once stored."""

    def __init__(self, flapping: FlappingSettings | None = None) -> None:
        self._blocks = BlockList()
        self._flaps = None if flapping is None else FlapDetector(flapping)
        self._local: dict[str, Block] = {}

    @property
    def blocks(self) -> BlockList:
        """The stored blocks in force. Setting them forgets this node's own flapping blocks
        that are among them: from then on the stored one decides (an operator who deletes
        it lets the client in here too)."""
        return self._blocks

    @blocks.setter
    def blocks(self, blocks: BlockList) -> None:
        self._blocks = blocks
        if self._local:
            stored = {b.value for b in blocks.blocks() if b.kind is BlockKind.CLIENT_ID}
            for client_id in stored & self._local.keys():
                del self._local[client_id]

    def check(
        self, client_id: str, username: str | None, address: str, now_ms: int
    ) -> Verdict | None:
        """The verdict on a CONNECT (see :meth:`BlockList.match`; ``now_ms``: Unix ms),
        None when it may go on to authentication."""
        found = self._blocks.match(client_id, username, address, now_ms)
        if found is None:
            local = self._local.get(client_id)
            if local is not None and not local.expired(now_ms):
                found = local
        if found is not None:
            return Verdict(found)
        if self._flaps is None:
            return None
        if not self._flaps.connected(client_id, now_ms / 1000):
            return None
        settings = self._flaps.settings
        block = Block(
            uuid.uuid4(),
            BlockKind.CLIENT_ID,
            client_id,
            f"flapping: more than {settings.max_connects} connects in "
            f"{settings.window_seconds:g} s",
            now_ms + round(settings.block_seconds * 1000),
            now_ms,
            FLAPPING_CREATOR,
        )
        for stale in [k for k, b in self._local.items() if b.expired(now_ms)]:
            del self._local[stale]
        self._local[client_id] = block
        return Verdict(block, new=True)
