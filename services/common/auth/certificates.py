"""The X509 lookup: which credential a verified TLS client certificate stands for.

The ingest node's TLS and WSS listeners verify the client's certificate chain against
``tls_client_ca_file`` (mutual TLS, :mod:`services.ingest.tls`); what the handshake verified
reaches the connection (``ConnectionState.certificate``) and authentication as a
:class:`CertificateIdentity`. :func:`match_certificate` is pure: given that identity and the
X509 credentials, it picks one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any


@dataclass(frozen=True, slots=True)
class CertificateIdentity:
    """A client certificate a TLS listener verified (mutual TLS): its subject's
    ``common_name`` (the most specific CN; None if it has none), its ``subject_alt_names``
    (the values of its DNS, e-mail, URI and IP address entries, as text, in certificate
    order), ``fingerprint``, the SHA-256 of its DER encoding in lowercase hex (64
    characters), and ``subject``, the whole subject as RFC 4514 text (most specific RDN
    first: ``CN=dev-7,O=Example``), for logs."""

    common_name: str | None
    subject_alt_names: tuple[str, ...]
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
        sans = tuple(str(value) for _kind, value in decoded.get("subjectAltName", ()))
        return cls(
            common_names[-1] if common_names else None,
            sans,
            hashlib.sha256(der).hexdigest(),
            subject,
        )


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
    ``fnmatch``, case-sensitive, over the subject's CN) or ``san`` (the same over each
    Subject Alternative Name)."""

    fingerprint: str | None = None
    common_name: str | None = None
    san: str | None = None

    def matches(self, identity: CertificateIdentity) -> bool:
        """Whether ``identity`` is the certificate this match describes."""
        if self.fingerprint is not None:
            return self.fingerprint == identity.fingerprint
        if self.common_name is not None:
            return identity.common_name is not None and fnmatchcase(
                identity.common_name, self.common_name
            )
        assert self.san is not None
        return any(fnmatchcase(name, self.san) for name in identity.subject_alt_names)

    @property
    def specificity(self) -> tuple[int, int]:
        """Orders matches from most to least specific (higher first): a fingerprint, then
        patterns by how many literal (non-wildcard) characters they hold."""
        if self.fingerprint is not None:
            return (2, 0)
        pattern = self.common_name or self.san or ""
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
