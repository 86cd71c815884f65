"""Independent checks of the JSON Schema string formats our compiler supports, written from the
RFCs (3339 date/time, 5321-style dot-atom email, 4122 uuid, 3986 URI, 791 dotted IPv4, 1123
hostname), so the property test does not depend on which optional format packages jsonschema
finds installed. Each returns True when `s` conforms."""
import datetime
import re

_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([Zz]|[+-]([0-9]{2}):([0-9]{2}))\Z")


def _date(s):
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", s, re.ASCII):
        return False
    try:
        datetime.date(int(s[:4]), int(s[5:7]), int(s[8:10]))
    except ValueError:
        return False
    return True


def _time(s):
    m = _TIME.fullmatch(s)
    if not m:
        return False
    h, mi, sec = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if h > 23 or mi > 59 or sec > 60:
        return False
    if m.group(6) is not None and (int(m.group(6)) > 23 or int(m.group(7)) > 59):
        return False
    return True


def _date_time(s):
    # RFC 3339 5.6: full-date "T" full-time; T and Z may be lower case.
    return len(s) > 11 and s[10] in "Tt" and _date(s[:10]) and _time(s[11:])


_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"


def _hostname(s):
    # The RFC 1123 total length limit (253) is not checked: our grammar does not enforce it
    # (a documented approximation in grammar/README.md); labels are checked (<= 63).
    return re.fullmatch(rf"{_LABEL}(?:\.{_LABEL})*", s, re.ASCII) is not None


def _email(s):
    local, at, domain = s.rpartition("@")
    return bool(at) and re.fullmatch(rf"{_ATEXT}(?:\.{_ATEXT})*", local, re.ASCII) is not None and _hostname(domain)


def _uuid(s):
    return re.fullmatch(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", s) is not None


def _ipv4(s):
    parts = s.split(".")
    return len(parts) == 4 and all(re.fullmatch(r"0|[1-9][0-9]{0,2}", p, re.ASCII) and int(p) <= 255 for p in parts)


# RFC 3986 appendix A.
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_SEGMENT = rf"{_PCHAR}*"
_SEGMENT_NZ = rf"{_PCHAR}+"
_DEC_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"{_DEC_OCTET}(?:\.{_DEC_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_IP_LITERAL = rf"\[(?:[0-9A-Fa-f:.]+|v[0-9A-Fa-f]+\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\]"
_REG_NAME = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*"
_AUTHORITY = rf"(?:(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?(?:{_IP_LITERAL}|{_IPV4}|{_REG_NAME})(?::[0-9]*)?"
_HIER = rf"(?://{_AUTHORITY}(?:/{_SEGMENT})*|/(?:{_SEGMENT_NZ}(?:/{_SEGMENT})*)?|{_SEGMENT_NZ}(?:/{_SEGMENT})*|)"
_URI = re.compile(rf"[A-Za-z][A-Za-z0-9+\-.]*:{_HIER}(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?", re.ASCII)


def _uri(s):
    return _URI.fullmatch(s) is not None


CHECKS = {
    "date": _date,
    "time": _time,
    "date-time": _date_time,
    "email": _email,
    "uuid": _uuid,
    "uri": _uri,
    "ipv4": _ipv4,
    "hostname": _hostname,
}
