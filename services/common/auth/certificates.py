"""The X509 lookup: which credential a verified TLS client certificate stands for.

The ingest node's TLS and WSS listeners verify the client's certificate chain against
``tls_client_ca_file`` (mutual TLS, :mod:`services.ingest.tls`); what the handshake verified
reaches the connection (``ConnectionState.certificate``) and authentication as a
:class:`CertificateIdentity`. :func:`match_certificate` is pure: given that identity and the
X509 credentials, it picks one.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any


@dataclass(frozen=True, slots=True)
class CertificateIdentity:
    """A client certificate a TLS listener verified (mutual TLS): its subject's
    ``common_name`` (the most specific CN; None if it has none), its ``subject_alt_names``
    (its DNS, e-mail, URI and IP address entries as ``(type, value)`` pairs, type one of
    :data:`SAN_TYPES`, in certificate order; other kinds are left out), ``fingerprint``, the
    SHA-256 of its DER encoding in lowercase hex (64 characters), and ``subject``, the whole
    subject as RFC 4514 text (most specific RDN first: ``CN=dev-7,O=Example``), for logs."""

    common_name: str | None
    subject_alt_names: tuple[tuple[str, str], ...]
    fingerprint: str
    subject: str

    @classmethod
    def from_peer_certificate(cls, decoded: Mapping[str, Any], der: bytes) -> CertificateIdentity:
        """The identity of a peer certificate as Python's :mod:`ssl` gives it:
        ``decoded`` = ``SSLObject.getpeercert()`` (a verified certificate's fields: its
        ``subject`` a sequence of RDNs, root first, each a sequence of ``(attribute,
        value)``; its ``subjectAltName`` ``(type, value)`` pairs) and ``der`` =
        ``SSLObject.getpeercert(binary_form=True)``."""
        rdns = [tuple(rdn) for rdn in decoded.get("subject", ())]
        common_names = [str(value) for rdn in rdns for key, value in rdn if key == "commonName"]
        subject = ",".join(
            "+".join(f"{_RFC4514_NAMES.get(key, key)}={value}" for key, value in rdn)
            for rdn in reversed(rdns)
        )
        sans = tuple(
            (_SSL_SAN_TYPES[kind], str(value).rstrip("\n"))
            for kind, value in decoded.get("subjectAltName", ())
            if kind in _SSL_SAN_TYPES
        )
        return cls(
            common_names[-1] if common_names else None,
            sans,
            hashlib.sha256(der).hexdigest(),
            subject,
        )


SAN_TYPES = ("dns", "uri", "email", "ip")
"""The Subject Alternative Name types a pattern names (RFC 5280 4.2.1.6: dNSName,
uniformResourceIdentifier, rfc822Name, iPAddress)."""

_SSL_SAN_TYPES = {"DNS": "dns", "URI": "uri", "email": "email", "IP Address": "ip"}
"""Python's :mod:`ssl` names of the SAN types (``getpeercert()['subjectAltName']``)."""


def parse_san_pattern(pattern: str) -> tuple[str, str]:
    """A typed SAN pattern as ``(type, pattern)``: ``dns:*.devices.example.com``,
    ``uri:spiffe://example.com/fleet/*``, ``email:*@example.com`` (shell-style, ``fnmatch``;
    DNS names compared in lowercase), ``ip:10.0.0.0/8`` (an address or a CIDR network).
    Raises ``ValueError`` (saying what is accepted) for a pattern without a known type, an
    empty one, or an ``ip:`` value that is not an address or network."""
    kind, sep, rest = pattern.partition(":")
    if not sep or kind.lower() not in SAN_TYPES:
        raise ValueError(
            f"SAN pattern {pattern!r} names no SAN type: write dns:<pattern>, uri:<pattern>, "
            "email:<pattern> or ip:<address or CIDR> (a pattern matches SANs of its type only)"
        )
    kind = kind.lower()
    if not rest:
        raise ValueError(f"SAN pattern {pattern!r} is empty after its type")
    if kind == "ip":
        try:
            ipaddress.ip_network(rest, strict=False)
        except ValueError:
            raise ValueError(f"SAN pattern {pattern!r}: not an IP address or CIDR") from None
    return kind, rest


def _san_matches(kind: str, pattern: str, san_kind: str, value: str) -> bool:
    """Whether the SAN ``value`` of type ``san_kind`` fits the typed ``pattern`` of type
    ``kind`` (DNS names without case, IP addresses by network, others ``fnmatch``)."""
    if san_kind != kind:
        return False
    if kind == "ip":
        try:
            return ipaddress.ip_address(value) in ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            return False
    if kind == "dns":
        return fnmatchcase(value.lower(), pattern.lower())
    return fnmatchcase(value, pattern)


_RFC4514_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
"""RFC 4514 short names of the attributes Python's ssl spells out (others keep its name)."""


@dataclass(frozen=True, slots=True)
class CertificateMatch:
    """How an X509 credential recognises its certificate: exactly one of ``fingerprint``
    (SHA-256 of the DER certificate, lowercase hex), ``common_name`` (a shell-style pattern,
    ``fnmatch``, case-sensitive, over the subject's CN) or ``san``, a typed pattern over the
    Subject Alternative Names of its type only (:func:`parse_san_pattern`:
    ``*.devices.example.com`` as ``dns:`` never matches a URI SAN). A ``san`` stored
    without a type (before types existed) is a ``dns:`` pattern."""

    fingerprint: str | None = None
    common_name: str | None = None
    san: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The match as the admin API and the credentials export show it: the one field
        that is set, by name (``{"common_name": "sensor-*"}``)."""
        fields = (("fingerprint", self.fingerprint), ("common_name", self.common_name),
                  ("san", self.san))  # fmt: skip
        return {name: value for name, value in fields if value is not None}

    def matched_san(self, identity: CertificateIdentity) -> str | None:
        """The first Subject Alternative Name of ``identity`` that the ``san`` pattern
        matches (None: none, or this match is not by SAN)."""
        if self.san is None:
            return None
        kind, pattern = self.san_pattern
        for san_kind, value in identity.subject_alt_names:
            if _san_matches(kind, pattern, san_kind, value):
                return value
        return None

    def matches(self, identity: CertificateIdentity) -> bool:
        """Whether ``identity`` is the certificate this match describes."""
        if self.fingerprint is not None:
            return self.fingerprint == identity.fingerprint
        if self.common_name is not None:
            return identity.common_name is not None and fnmatchcase(
                identity.common_name, self.common_name
            )
        return self.matched_san(identity) is not None

    @property
    def san_pattern(self) -> tuple[str, str]:
        """``san`` as ``(type, pattern)`` (an untyped one, stored before types existed:
        ``dns``). Raises ``ValueError`` for a typed one :func:`parse_san_pattern` refuses."""
        assert self.san is not None
        kind = self.san.partition(":")[0].lower()
        if kind not in SAN_TYPES:
            return "dns", self.san
        return parse_san_pattern(self.san)

    @property
    def specificity(self) -> tuple[int, int]:
        """Orders matches from most to least specific (higher first): a fingerprint, then
        patterns by how many literal (non-wildcard) characters they hold."""
        if self.fingerprint is not None:
            return (2, 0)
        pattern = self.common_name or (self.san_pattern[1] if self.san else "")
        return (1, sum(c not in "*?[]" for c in pattern))


def match_certificate(
    identity: CertificateIdentity, candidates: Iterable[tuple[str, CertificateMatch]]
) -> str | None:
    """The key (a credential's name) of the candidate whose :class:`CertificateMatch`
    recognises ``identity``: a fingerprint match first, then the pattern with the most
    literal characters, ties broken by the smaller key, so every node picks the same one.
    None when no candidate matches."""
    best: tuple[tuple[int, int], str] | None = None
    for key, match in candidates:
        if not match.matches(identity):
            continue
        rank = match.specificity
        if best is None or rank > best[0] or (rank == best[0] and key < best[1]):
            best = (rank, key)
    return None if best is None else best[1]
