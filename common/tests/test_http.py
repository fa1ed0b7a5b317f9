"""Which form posts the console takes: only those a browser says come from this site."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from metaq.common.http import same_site


@pytest.mark.parametrize(
    ("headers", "taken"),
    [
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({"Sec-Fetch-Site": "none"}, True),  # typed into the address bar, a bookmark
        ({"Sec-Fetch-Site": "same-site"}, False),  # another port or subdomain
        ({"Sec-Fetch-Site": "cross-site", "Origin": "http://ns:9880"}, False),
        ({"Origin": "http://ns:9880"}, True),  # an older browser: the origin decides
        ({"Origin": "http://elsewhere.example"}, False),
        ({"Origin": "null"}, False),  # a sandboxed frame or a data: page
        ({}, True),  # not from a browser page: nothing a cross-site page can send
    ],
)
def test_a_form_is_taken_only_from_this_sites_pages(headers: dict[str, str], taken: bool) -> None:
    request = make_mocked_request("POST", "/console/x", headers={"Host": "ns:9880", **headers})
    assert same_site(request) is taken
