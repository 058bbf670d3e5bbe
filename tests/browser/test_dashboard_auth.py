"""The ops dashboard behind client keys, in a real browser: the page asks for
credentials (HTTP Basic, the admin key as the password), and once given them its
own polls of /admin/replicas carry them; a non-admin key gets no page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import gateway_settings, running_sims, sim_args
from tests.support.api_keys import write_keys
from tests.support.chromium import CHROMIUM, Chromium
from tests.support.gateway import GatewayProcess

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="no /usr/bin/chromium: run scripts/setup-browser.sh"),
]

ADMIN, USER = "sk-admin-dash-01", "sk-user-dash-01"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    keys = write_keys(Path(tmp_path_factory.mktemp("keys")) / "keys.yaml", [
        {"key": ADMIN, "tenant": "ops", "admin": True}, {"key": USER, "tenant": "app"}])
    with running_sims([sim_args(0)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, policy="prefix", api_keys=keys))
        try:
            yield gw.start()
        finally:
            gw.stop()


def with_credentials(url: str, key: str) -> str:
    return url.replace("http://", f"http://ops:{key}@")


def test_the_dashboard_polls_with_the_admin_key_it_was_given(gateway: GatewayProcess) -> None:
    with Chromium() as browser:
        # As after the browser's prompt: the credentials are in its cache for the
        # origin, not in the page's address (fetch refuses URLs holding them).
        browser.open(with_credentials(gateway.url, ADMIN) + "/dashboard")
        browser.open(gateway.url + "/dashboard")
        browser.wait_for("Number(document.body.dataset.polls || 0) >= 2", timeout=30)
        assert browser.wait_for("document.querySelector('#replica-s0') !== null")


def test_a_key_that_is_not_admin_gets_no_dashboard(gateway: GatewayProcess) -> None:
    with Chromium() as browser:
        browser.open(with_credentials(gateway.url, USER) + "/dashboard")
        text = browser.evaluate("document.body.innerText")
        assert "PermissionDeniedError" in text
        assert not browser.evaluate("document.querySelector('#replica-s0') !== null")
