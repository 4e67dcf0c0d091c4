"""Licence detection: SPDX ids from package metadata (debian/copyright, package.json, PKG-INFO) and from
LICENSE/COPYING texts."""

from __future__ import annotations

import json
import re
from email.parser import Parser
from pathlib import PurePosixPath

# Debian short names (DEP-5) and free-form names -> SPDX
_NAME_TO_SPDX = {
    "expat": "MIT", "mit": "MIT", "mit/x11": "MIT", "x11": "X11", "isc": "ISC", "zlib": "Zlib",
    "apache-2.0": "Apache-2.0", "apache 2.0": "Apache-2.0", "apache-2": "Apache-2.0", "apache": "Apache-2.0",
    "apache software license": "Apache-2.0", "apache license 2.0": "Apache-2.0",
    "bsd-2-clause": "BSD-2-Clause", "bsd-3-clause": "BSD-3-Clause", "bsd-4-clause": "BSD-4-Clause",
    "bsd": "BSD-3-Clause", "bsd license": "BSD-3-Clause", "mpl-2.0": "MPL-2.0", "mpl-1.1": "MPL-1.1",
    "mozilla public license 2.0 (mpl 2.0)": "MPL-2.0", "epl-1.0": "EPL-1.0", "epl-2.0": "EPL-2.0",
    "gpl-2": "GPL-2.0-only", "gpl-2+": "GPL-2.0-or-later", "gpl-3": "GPL-3.0-only", "gpl-3+": "GPL-3.0-or-later",
    "gpl-1+": "GPL-1.0-or-later", "gpl": "GPL-1.0-or-later", "lgpl-2": "LGPL-2.0-only", "lgpl-2+": "LGPL-2.0-or-later",
    "lgpl-2.1": "LGPL-2.1-only", "lgpl-2.1+": "LGPL-2.1-or-later", "lgpl-3": "LGPL-3.0-only",
    "lgpl-3+": "LGPL-3.0-or-later", "agpl-3": "AGPL-3.0-only", "agpl-3+": "AGPL-3.0-or-later",
    "artistic": "Artistic-1.0-Perl", "artistic-2.0": "Artistic-2.0", "unlicense": "Unlicense",
    "public-domain": "LicenseRef-public-domain", "public domain": "LicenseRef-public-domain",
    "cc0-1.0": "CC0-1.0", "cc0": "CC0-1.0", "psf-2.0": "PSF-2.0", "python-2.0": "Python-2.0",
    "python software foundation license": "PSF-2.0", "tcl": "TCL", "bsl-1.0": "BSL-1.0", "boost": "BSL-1.0",
    "gnu general public license v3 (gplv3)": "GPL-3.0-only", "gnu general public license v2 (gplv2)": "GPL-2.0-only",
    "gnu lesser general public license v2 or later (lgplv2+)": "LGPL-2.0-or-later", "wtfpl": "WTFPL",
    "ruby": "Ruby", "bsd-2": "BSD-2-Clause", "bsd-3": "BSD-3-Clause", "openssl": "OpenSSL",
}  # fmt: skip

_LICENSE_FILE = re.compile(r"^(licen[cs]e|copying|copyright|unlicense)([.-][\w.-]*)?$", re.I)

# (regex over a licence text, SPDX id): first match wins, so specific texts come before general ones
_TEXT_PATTERNS: list[tuple[re.Pattern, str]] = [
    (re.compile(r"GNU LESSER GENERAL PUBLIC LICENSE\s+Version 3", re.I), "LGPL-3.0-only"),
    (re.compile(r"GNU LESSER GENERAL PUBLIC LICENSE\s+Version 2\.1", re.I), "LGPL-2.1-only"),
    (re.compile(r"GNU AFFERO GENERAL PUBLIC LICENSE\s+Version 3", re.I), "AGPL-3.0-only"),
    (re.compile(r"GNU GENERAL PUBLIC LICENSE\s+Version 3", re.I), "GPL-3.0-only"),
    (re.compile(r"GNU GENERAL PUBLIC LICENSE\s+Version 2", re.I), "GPL-2.0-only"),
    (re.compile(r"Apache License,?\s+Version 2\.0", re.I), "Apache-2.0"),
    (re.compile(r"Mozilla Public License,?\s+(Version|v\.?)\s*2\.0", re.I), "MPL-2.0"),
    (re.compile(r"Eclipse Public License\s*-?\s*v(ersion)?\s*2\.0", re.I), "EPL-2.0"),
    (re.compile(r"Eclipse Public License\s*-?\s*v(ersion)?\s*1\.0", re.I), "EPL-1.0"),
    (re.compile(r"Boost Software License", re.I), "BSL-1.0"),
    (
        re.compile(r"This is free and unencumbered software released into the public domain", re.I),
        "Unlicense",
    ),
    (
        re.compile(
            r"Permission to use, copy, modify, and(/or)? distribute this software for any\s+purpose", re.I
        ),
        "ISC",
    ),
    (re.compile(r"Permission is hereby granted, free of charge, to any person obtaining", re.I), "MIT"),
    (re.compile(r"provided ['‘]as-is['’], without any express or implied\s+warranty", re.I), "Zlib"),
    (
        re.compile(r"Redistribution and use in source and binary forms.*Neither the name", re.I | re.S),
        "BSD-3-Clause",
    ),
    (re.compile(r"Redistribution and use in source and binary forms", re.I), "BSD-2-Clause"),
    (re.compile(r"The Artistic License 2\.0", re.I), "Artistic-2.0"),
    (re.compile(r"CC0 1\.0 Universal", re.I), "CC0-1.0"),
]


def spdx_from_name(name: str | None) -> str | None:
    """Map a licence name or expression ("MIT", "GPL-2+", "Apache Software License") to SPDX."""
    if not name:
        return None
    name = name.strip().strip("()")
    if not name or name.upper() in {"UNKNOWN", "NONE", "UNLICENSED", "SEE LICENSE FILE"}:
        return None
    for sep in (" or ", " OR ", " | "):
        if sep in name:
            parts = [spdx_from_name(p) for p in name.split(sep)]
            return " OR ".join(p for p in parts if p) or None
    key = name.lower().replace(" license", " license").strip()
    if key in _NAME_TO_SPDX:
        return _NAME_TO_SPDX[key]
    key2 = key.removesuffix(" license").strip()
    if key2 in _NAME_TO_SPDX:
        return _NAME_TO_SPDX[key2]
    if re.fullmatch(r"[A-Za-z0-9.+-]+", name) and re.search(r"\d|MIT|ISC|BSD|Unlicense|WTFPL", name):
        return name  # already looks like an SPDX id (e.g. "BSD-3-Clause", "0BSD")
    return None


def spdx_from_text(text: str) -> str | None:
    head = text[:20000]
    for pattern, spdx in _TEXT_PATTERNS:
        if pattern.search(head):
            return spdx
    return None


def spdx_from_debian_copyright(text: str) -> str | None:
    """The licence of the `Files: *` paragraph of a DEP-5 debian/copyright (or a guess from its text)."""
    paragraphs = re.split(r"\n\s*\n", text)
    for para in paragraphs:
        files = re.search(r"^Files:\s*(.+)$", para, re.M)
        lic = re.search(r"^License:\s*(.+)$", para, re.M)
        if files and lic and files.group(1).strip().split()[0] == "*":
            return spdx_from_name(lic.group(1).strip())
    first = next((m.group(1) for p in paragraphs if (m := re.search(r"^License:\s*(.+)$", p, re.M))), None)
    return spdx_from_name(first) if first else spdx_from_text(text)


def spdx_from_package_json(text: str) -> str | None:
    try:
        meta = json.loads(text)
    except ValueError:
        return None
    lic = meta.get("license")
    if isinstance(lic, dict):
        lic = lic.get("type")
    if not lic and isinstance(meta.get("licenses"), list) and meta["licenses"]:
        first = meta["licenses"][0]
        lic = first.get("type") if isinstance(first, dict) else first
    return spdx_from_name(lic) if isinstance(lic, str) else None


def spdx_from_pkg_info(text: str) -> str | None:
    """PKG-INFO: License-Expression, then License, then `License ::` classifiers."""
    msg = Parser().parsestr(text, headersonly=True)
    if expr := msg.get("License-Expression"):
        return expr.strip()
    lic = msg.get("License")
    if lic and len(lic) < 80 and (spdx := spdx_from_name(lic)):
        return spdx
    for classifier in msg.get_all("Classifier") or []:
        if classifier.startswith("License ::"):
            if spdx := spdx_from_name(classifier.split("::")[-1].strip()):
                return spdx
    return spdx_from_text(lic) if lic else None


def is_license_file(path: str) -> bool:
    return bool(_LICENSE_FILE.match(PurePosixPath(path).name))


class LicenseIndex:
    """Licences seen while scanning one source: package metadata plus LICENSE files by directory."""

    def __init__(self) -> None:
        self.package: str | None = None
        self.by_dir: dict[str, str] = {}

    def observe(self, kind: str, path: str, text_bytes: bytes) -> None:
        """Look at a metadata or licence file met during the scan."""
        text = text_bytes.decode("utf-8", "replace")
        p = PurePosixPath(path)
        if p.name == "copyright" and (p.parent.name == "debian" or "usr/share/doc" in path):
            if (spdx := spdx_from_debian_copyright(text)) and self.package is None:
                self.package = spdx
            return
        if p.name == "package.json" and len(p.parts) == 1:
            self.package = spdx_from_package_json(text) or self.package
            return
        if p.name == "PKG-INFO" and len(p.parts) == 1:
            self.package = spdx_from_pkg_info(text) or self.package
            return
        if is_license_file(path) and (spdx := spdx_from_text(text)):
            self.by_dir.setdefault(str(p.parent) if str(p.parent) != "." else "", spdx)

    def wants(self, path: str) -> bool:
        p = PurePosixPath(path)
        return (
            is_license_file(path)
            or (p.name == "copyright" and (p.parent.name == "debian" or "usr/share/doc" in path))
            or (p.name in ("package.json", "PKG-INFO") and len(p.parts) == 1)
        )

    def license_for(self, path: str) -> str:
        """Nearest non-root LICENSE file, else the package's declared licence, else a root LICENSE file."""
        parent = PurePosixPath(path).parent
        for anc in [parent, *parent.parents]:
            key = str(anc) if str(anc) != "." else ""
            if key and key in self.by_dir:
                return self.by_dir[key]
        return self.package or self.by_dir.get("") or "NOASSERTION"
