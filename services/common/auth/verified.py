"""An ingest node's memory of the passwords it has verified, so that a client connecting
again with the same MQTT_BASIC credential and password does not cost another argon2id
verification (about 20 ms of a core: :mod:`.passwords`).

What is kept, per credential id: an HMAC-SHA-256, under a random 256-bit key made when the
process starts (never written or logged), of the credential's stored argon2id hash and the
password that matched it; never the password. A later CONNECT matches an entry when the
HMAC of *its* password and the hash the node holds now for the credential is the same
(compared with :func:`hmac.compare_digest`). So:

- a password that does not match is never taken from memory: only a successful argon2id
  verification writes an entry, and a wrong password's HMAC differs;
- a changed password (a new hash, with a new salt even for the same password) can never
  match an entry made for the old one, and the entry is also forgotten when PostgreSQL
  announces any change of the credential (update, disable, delete: :meth:`forget`) and all
  entries when the announcements were not followed for a while (:meth:`clear`), on every
  node, as the credential cache is (:mod:`.cache`);
- an entry lives at most ``ttl_seconds`` after its verification, however often it
  matches, and at most ``max_entries`` are kept (the least recently used go first).

Why this does not weaken argon2id: argon2id's cost is there for an attacker who has the
stored hashes (a copy of the database or a backup) and guesses passwords offline; the
cost stays in every hash PostgreSQL holds, and nothing here is stored or leaves the
process. What it trades: while an entry lives, the node's memory holds a fast keyed hash
of the password, so an attacker who can read that memory (and with it the key) could test
guesses for that credential at HMAC speed instead of argon2id's. Such an attacker can
also read the passwords of the CONNECTs the process decodes while they watch (they arrive
in clear in the packets); what the memory adds is the clients that connected up to
``ttl_seconds`` earlier. ``auth_verified_cache_entries=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

KEY_BYTES = 32
"""Length of the per-process HMAC key (256 bits, the output size of SHA-256)."""


class VerifiedPasswords:
    """Verified (credential, password) pairs of this process (see the module).

    ``max_entries``: entries kept at most (0: none are, :meth:`matches` is always False);
    ``ttl_seconds``: how long after its verification an entry may match; ``clock``:
    seconds of a monotonic clock (the real one unless a test gives its own).
    """

    def __init__(
        self,
        max_entries: int,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._key = secrets.token_bytes(KEY_BYTES)
        self._max_entries = max_entries if ttl_seconds > 0 else 0
        self._ttl = ttl_seconds
        self._clock = clock
        self._entries: OrderedDict[uuid.UUID, tuple[bytes, float]] = OrderedDict()
        self._generation = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def generation(self) -> int:
        """Grows with every :meth:`forget` and :meth:`clear`: taken before a verification
        and given to :meth:`remember`, it keeps a verification that raced with a change of
        the credential from being remembered."""
        return self._generation

    def digest(self, password_hash: str, password: bytes) -> bytes:
        """HMAC-SHA-256 (32 bytes) under this process's key of the stored argon2id hash
        ``password_hash`` (PHC string) and ``password``, each length-prefixed."""
        encoded = password_hash.encode()
        message = struct.pack("!I", len(encoded)) + encoded + password
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def matches(self, credential_id: uuid.UUID, digest: bytes) -> bool:
        """Whether ``digest`` (:meth:`digest` of the credential's current hash and the
        password given) is the one remembered for ``credential_id``, within its time to
        live. An expired entry is dropped."""
        entry = self._entries.get(credential_id)
        if entry is None:
            return False
        remembered, expires = entry
        if self._clock() >= expires:
            del self._entries[credential_id]
            return False
        if not hmac.compare_digest(remembered, digest):
            return False
        self._entries.move_to_end(credential_id)
        return True

    def remember(self, credential_id: uuid.UUID, digest: bytes, generation: int) -> None:
        """An argon2id verification of the password whose :meth:`digest` is ``digest``
        succeeded for ``credential_id``; ``generation`` is :attr:`generation` as it was
        when the verification started (nothing is remembered if a change came since)."""
        if generation != self._generation or not self._max_entries:
            return
        self._entries[credential_id] = (digest, self._clock() + self._ttl)
        self._entries.move_to_end(credential_id)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def forget(self, credential_id: uuid.UUID) -> None:
        """The credential changed (its password, its state, or it was deleted)."""
        self._generation += 1
        self._entries.pop(credential_id, None)

    def clear(self) -> None:
        """Forget every entry (changes may have been missed)."""
        self._generation += 1
        self._entries.clear()
