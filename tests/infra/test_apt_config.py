"""The private apt configuration the code crawl downloads Debian packages through."""

import shutil
import subprocess

import pytest

from infra.code_sources import AptConfig

pytestmark = pytest.mark.skipif(shutil.which("apt-cache") is None, reason="needs apt-cache")


def test_installed_versions_do_not_become_candidates(tmp_path):
    # an installed package whose version is not on the mirror (a security update) must not be what
    # `apt-get download` asks for: the private config reads no dpkg status, so nothing counts as installed
    apt = AptConfig(tmp_path)
    (tmp_path / "lists" / "partial").mkdir(parents=True)
    (tmp_path / "cache" / "archives" / "partial").mkdir(parents=True)
    (tmp_path / "sources.list").write_text("")
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "apt"], capture_output=True, text=True
    )
    assert installed.returncode == 0 and installed.stdout, "apt itself is installed where apt-cache is"

    def policy(options: list[str]) -> str:
        return subprocess.run(
            ["apt-cache", *options, "policy", "apt"], capture_output=True, text=True, check=True
        ).stdout

    opts = apt.options()
    i = opts.index("Dir::State::status=/dev/null")
    control = policy(opts[: i - 1] + opts[i + 1 :])  # the same config reading the machine's dpkg status
    assert f"Installed: {installed.stdout}" in control, control
    assert installed.stdout not in policy(opts)
