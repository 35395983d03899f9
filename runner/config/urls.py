"""How a URL is shown: the one rule for every log line, error, page and report that names one
(the Redis URL, the ping URL, a sentinel entry that looks like a URL).

A URL is user input that may hold a password in any of its parts, and it is shown most often
when it is wrong. So the rule works on the text, never trusting a parse:

* no ``scheme://``: nothing of it is known to be a host, so all of it is masked;
* everything up to the last ``@`` after ``://`` is credentials: only the user name is kept
  (an unencoded '/', '#' or '?' in a password would end the host part for ``urlsplit``);
* the host and port are shown; what follows them is shown only when it is well formed (a
  path, a query, a fragment, with nothing a parser could read two ways), else it is masked;
* in what is shown, the value of every key that looks like a secret (SECRET_WORDS, in any
  part: path parameters, query, fragment) is masked.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
#: A key holding one of these (case-insensitive, after percent-decoding) names a secret:
#: password, passwd, pass, passphrase, pwd, secret, client_secret, token, access_token, auth,
#: authorization, key, apikey, api_key, credential, sig, signature.
SECRET_WORDS = ("pass", "pwd", "secret", "token", "auth", "key", "cred", "sig")

_SCHEME_RE = re.compile(r"(?a)[A-Za-z][A-Za-z0-9+.-]*\Z")
# A host name or address, or an IPv6 literal in brackets; then an optional numeric port.
_HOST_PORT_RE = re.compile(r"(?a)(\[[0-9A-Fa-f:.]*\]|[A-Za-z0-9._~%!$'()*+,-]*)(:[0-9]{1,5})?")
# One part of the path, query or fragment: after a separator, up to the next. A value runs
# to the next '&' or ';' (a '/', '?' or '#' in it does not end it).
_PART_RE = re.compile(r"(?<=[/?&;#])([^/?&;#=]*)(=[^&;]*)?")


def _is_secret(text: str) -> bool:
    name = unquote(text).lower()
    return any(word in name for word in SECRET_WORDS)


def _mask_part(match: re.Match[str]) -> str:
    key, value = match.group(1), match.group(2)
    if value is not None:
        return f"{key}={MASK}" if _is_secret(key) else match.group(0)
    # A percent-encoded '=' makes a pair of it for some parsers: 'password%3DS'.
    decoded_key, eq, _ = unquote(key).partition("=")
    return MASK if eq and _is_secret(decoded_key) else key


def redact_url(url: str, *, keep_path: bool = True) -> str:
    """The URL as it may be shown (see the module's rules). ``keep_path=False`` masks the path
    too, for URLs whose path is the credential (a Healthchecks ping URL's UUID)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME_RE.match(scheme):
        return MASK
    userinfo, at, hostpart = rest.rpartition("@")
    user = userinfo.partition(":")[0] if at else ""
    shown_user = f"{user}:{MASK}@" if user else (f"{MASK}@" if at else "")
    if user and (_is_secret(user) or not all("!" <= c <= "~" for c in user)):
        shown_user = f"{MASK}@"
    match = _HOST_PORT_RE.match(hostpart)
    host_port = match.group(0) if match else ""
    tail = hostpart[len(host_port) :]
    # Well formed: empty, or a path, query or fragment of printable ASCII without spaces.
    if tail and (tail[0] not in "/?#" or not all("!" <= c <= "~" for c in tail)):
        tail = MASK
    elif not keep_path and tail:
        tail = "/..."
    else:
        tail = _PART_RE.sub(_mask_part, tail)
    return f"{scheme}://{shown_user}{host_port}{tail}"


def url_has_password(url: str) -> bool:
    """Whether the URL carries a password: in its user info, or as a secret-like option."""
    rest = url.partition("://")[2]
    userinfo, _, hostpart = rest.rpartition("@")
    return bool(userinfo.partition(":")[2]) or _PART_RE.sub(_mask_part, hostpart) != hostpart
